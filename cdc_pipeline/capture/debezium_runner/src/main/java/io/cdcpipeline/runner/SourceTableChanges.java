package io.cdcpipeline.runner;

import java.nio.charset.StandardCharsets;
import java.util.List;

import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaBuilder;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.json.JsonConverter;

import io.debezium.connector.mariadb.antlr.MariaDbAntlrDdlParser;
import io.debezium.connector.mysql.antlr.MySqlAntlrDdlParser;
import io.debezium.relational.Table;
import io.debezium.relational.TableId;
import io.debezium.relational.Tables;
import io.debezium.relational.ddl.DdlParser;
import io.debezium.relational.history.ConnectTableChangeSerializer;
import io.debezium.relational.history.TableChanges;
import io.debezium.schema.SchemaNameAdjuster;

/**
 * The table changes a schema-change event of Debezium's MariaDB or MySQL connector would carry for tables it never
 * saw created: each table's {@code SHOW CREATE TABLE} text read by the connector's own DDL parser, and written as
 * the event's {@code tableChanges} (the same serializer and JSON converter), so that the pipeline's converter makes
 * the destination tables exactly as from the stream's DDL. Used for tables a load copies that the connector's schema
 * snapshot did not see (a database that came to match its {@code databases}, a table added to {@code tables}).
 */
public final class SourceTableChanges {
    private SourceTableChanges() {
    }

    /**
     * The JSON array of "CREATE" table changes of the tables that {@code createStatements} (each a
     * {@code CREATE TABLE}) define in {@code database}; {@code connectorType} is "mariadb" or "mysql".
     */
    public static String of(String connectorType, String database, List<String> createStatements) {
        DdlParser parser = "mysql".equals(connectorType) ? new MySqlAntlrDdlParser() : new MariaDbAntlrDdlParser();
        Tables tables = new Tables();
        parser.setCurrentDatabase(database);
        for (String statement : createStatements) {
            parser.parse(statement, tables);
        }
        TableChanges changes = new TableChanges();
        for (TableId id : tables.tableIds()) {
            Table table = tables.forTable(id);
            if (table != null) {
                changes.create(table);
            }
        }
        ConnectTableChangeSerializer serializer = new ConnectTableChangeSerializer(SchemaNameAdjuster.NO_OP);
        List<Struct> structs = serializer.serialize(changes);
        Schema schema = SchemaBuilder.array(serializer.getChangeSchema()).build();
        try (JsonConverter converter = new JsonConverter()) {
            converter.configure(java.util.Map.of("schemas.enable", "false", "converter.type", "value"), false);
            return new String(converter.fromConnectData("table-changes", schema, structs), StandardCharsets.UTF_8);
        }
    }
}
