package io.cdcpipeline.runner.scripted;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;


import com.fasterxml.jackson.databind.JsonNode;

import io.debezium.DebeziumException;
import io.debezium.config.CommonConnectorConfig;
import io.debezium.config.Configuration;
import io.debezium.connector.sqlserver.Lsn;
import io.debezium.connector.sqlserver.SqlServerChangeRecordEmitter;
import io.debezium.connector.sqlserver.SqlServerChangeTable;
import io.debezium.connector.sqlserver.SqlServerConnectorConfig;
import io.debezium.connector.sqlserver.SqlServerDatabaseSchema;
import io.debezium.connector.sqlserver.SqlServerOffsetContext;
import io.debezium.connector.sqlserver.SqlServerPartition;
import io.debezium.connector.sqlserver.SqlServerSchemaChangeEventEmitter;
import io.debezium.connector.sqlserver.SqlServerTaskContext;
import io.debezium.connector.sqlserver.SqlServerValueConverters;
import io.debezium.connector.sqlserver.TxLogPosition;
import io.debezium.connector.sqlserver.metrics.SqlServerMetricsFactory;
import io.debezium.pipeline.source.spi.EventMetadataProvider;
import io.debezium.relational.Column;
import io.debezium.relational.Table;
import io.debezium.relational.TableId;
import io.debezium.schema.SchemaChangeEvent.SchemaChangeEventType;
import io.debezium.spi.topic.TopicNamingStrategy;
import io.debezium.util.Clock;

/**
 * SQL Server's streaming source replayed from a script: what {@code SqlServerStreamingChangeEventSource} does with the
 * rows of the change tables, with the rows given by the script.
 * <ul>
 * <li>A schema step makes the source table as {@code SqlServerConnection.getTableSchemaFromTable} does from
 * {@code DatabaseMetaData.getColumns} and dispatches it through {@code SqlServerSchemaChangeEventEmitter} (CREATE when
 * a capture instance is new, ALTER when a new capture instance replaces it), so its record is the connector's: ddl
 * {@code N/A}, tableChanges from Debezium's serializer.</li>
 * <li>A data step is one change-table row (an update: its before and after rows) at the step's
 * {@code commit_lsn}/{@code change_lsn}, set on the connector's {@code SqlServerOffsetContext}
 * ({@code setChangePosition} with its event count, {@code event} with the table and the commit time) and emitted by
 * {@code SqlServerChangeRecordEmitter} with the values in the order of the table's columns.</li>
 * </ul>
 * A quiet step ({@code {"quiet": true, "commit_lsn": ...}}) is an iteration that read up to the step's LSN and found
 * no change of a captured table: as {@code SqlServerStreamingChangeEventSource.executeIteration} does then, the offset
 * context's change position becomes that LSN ({@code setChangePosition(TxLogPosition.valueOf(toLsn), 0)}), which the
 * heartbeat dispatched after it carries.
 * On start the stored offset is loaded by {@code SqlServerOffsetContext.Loader}; the steps at or before its
 * ({@code commit_lsn}, {@code change_lsn}) were delivered, as the connector skips change rows before its last position.
 */
final class SqlServerScript extends ScriptedSource<SqlServerPartition> {
    private final SqlServerConnectorConfig connectorConfig;
    private final SqlServerDatabaseSchema schema;
    private final SqlServerPartition partition;
    private final String databaseName;
    private SqlServerOffsetContext offsetContext;
    private TxLogPosition storedPosition;

    SqlServerScript(Configuration config) {
        super(config);
        connectorConfig = new SqlServerConnectorConfig(config);
        SqlServerTaskContext taskContext = new SqlServerTaskContext(config, connectorConfig);
        SqlServerValueConverters valueConverters = new SqlServerValueConverters(connectorConfig.getDecimalMode(),
                connectorConfig.getTemporalPrecisionMode(), connectorConfig.binaryHandlingMode());
        registerServiceProviders(connectorConfig);
        // The default value converter (package-private, hence reflection) queries the server only for default
        // expressions it cannot parse.
        Object defaultValueConverter = newPackagePrivate("io.debezium.connector.sqlserver.SqlServerDefaultValueConverter",
                null, valueConverters);
        TopicNamingStrategy<TableId> topicNamingStrategy = connectorConfig.getTopicNamingStrategy(CommonConnectorConfig.TOPIC_NAMING_STRATEGY, true);
        schema = newPackagePrivate(SqlServerDatabaseSchema.class.getName(), connectorConfig, defaultValueConverter,
                valueConverters, topicNamingStrategy, connectorConfig.schemaNameAdjuster(), customConverterRegistry(connectorConfig),
                taskContext);
        schema.initializeStorage();
        registerBeans(connectorConfig, config, schema, valueConverters, taskContext);
        databaseName = connectorConfig.getDatabaseNames().get(0);
        partition = new SqlServerPartition(connectorConfig.getLogicalName(), databaseName,
                connectorConfig.getDatabaseNames().size() > 1);
        queue = newQueue(connectorConfig, taskContext);
        EventMetadataProvider metadataProvider = newPackagePrivate("io.debezium.connector.sqlserver.SqlServerEventMetadataProvider");
        dispatcher = newDispatcher(connectorConfig, topicNamingStrategy, schema, queue, metadataProvider);
        startStreamingMetrics(new SqlServerMetricsFactory(List.of(partition)).getStreamingMetrics(taskContext, queue,
                metadataProvider, schema::tableIds));
    }

    @Override
    SqlServerPartition partition() {
        return partition;
    }

    @Override
    SqlServerOffsetContext offsetContext() {
        return offsetContext;
    }

    @Override
    void loadOffset(Map<String, ?> storedOffset) {
        if (storedOffset == null) {
            offsetContext = new SqlServerOffsetContext(connectorConfig, TxLogPosition.NULL, null, true);
            storedPosition = null;
        }
        else {
            offsetContext = new SqlServerOffsetContext.Loader(connectorConfig).load(storedOffset);
            storedPosition = offsetContext.getChangePosition();
        }
    }

    @Override
    boolean delivered(int index) {
        return storedPosition != null && position(steps.get(index)).compareTo(storedPosition) <= 0;
    }

    @Override
    void recoverSchema(JsonNode step) throws InterruptedException {
        schemaChange(step).emitSchemaChangeEvent(schema::applySchemaChange);
    }

    @Override
    void play(int index, boolean emit) throws InterruptedException {
        JsonNode step = steps.get(index);
        if (step.has(QUIET_STEP)) {
            // What the streaming source does when its change tables held no row up to the max LSN it read.
            offsetContext.setChangePosition(TxLogPosition.valueOf(position(step).getCommitLsn()), 0);
            return;
        }
        TableId tableId = tableId(step);
        if (step.has(SCHEMA_STEP)) {
            offsetContext.setChangePosition(position(step), 0);
            offsetContext.event(tableId, changeTime(step));
            if (emit) {
                dispatcher.dispatchSchemaChangeEvent(partition, offsetContext, tableId, schemaChange(step));
            }
            else {
                recoverSchema(step);
            }
            return;
        }
        Table table = schema.tableFor(tableId);
        if (table == null) {
            throw new IllegalStateException("no schema step made table " + tableId + " before this change");
        }
        String op = step.get("op").asText();
        int operation;
        Object[] data;
        Object[] dataNext = null;
        switch (op) {
            case "c" -> {
                operation = SqlServerChangeRecordEmitter.OP_INSERT;
                data = row(table, step.get("after"));
            }
            case "d" -> {
                operation = SqlServerChangeRecordEmitter.OP_DELETE;
                data = row(table, step.get("before"));
            }
            case "u" -> {
                operation = SqlServerChangeRecordEmitter.OP_UPDATE_BEFORE;
                data = row(table, step.get("before"));
                dataNext = row(table, step.get("after"));
            }
            default -> throw new IllegalArgumentException("unknown op '" + op + "' (c, u or d)");
        }
        TxLogPosition position = position(step);
        offsetContext.setChangePosition(TxLogPosition.valueOf(position.getCommitLsn(), position.getInTxLsn(), operation),
                dataNext == null ? 1 : 2);
        offsetContext.event(tableId, changeTime(step));
        if (emit) {
            dispatcher.dispatchDataChangeEvent(partition, tableId,
                    new SqlServerChangeRecordEmitter(partition, offsetContext, operation, data, dataNext, Clock.system(), connectorConfig));
        }
    }

    @Override
    void close() {
        stopStreamingMetrics();
        schema.close();
    }

    private SqlServerSchemaChangeEventEmitter schemaChange(JsonNode step) {
        TableId tableId = tableId(step);
        List<Column> columns = new ArrayList<>();
        List<String> names = new ArrayList<>();
        for (JsonNode definition : step.get("columns")) {
            columns.add(column(definition, columns.size() + 1));
            names.add(definition.get("name").asText());
        }
        List<String> primaryKey = new ArrayList<>();
        step.path("primaryKey").forEach(name -> primaryKey.add(name.asText()));
        Table table = Table.editor().tableId(tableId).addColumns(columns).setPrimaryKeyNames(primaryKey).create();
        String captureInstance = step.path("capture").asText(tableId.schema() + "_" + tableId.table());
        SqlServerChangeTable changeTable = new SqlServerChangeTable(tableId, captureInstance, 0, position(step).getCommitLsn(), names);
        SchemaChangeEventType type = SchemaChangeEventType.valueOf(step.get("schema").asText().toUpperCase());
        return new SqlServerSchemaChangeEventEmitter(partition, offsetContext, changeTable, table, schema, type);
    }

    /** The source table: the connector's database, and the step's {@code schema.table}. */
    private TableId tableId(JsonNode step) {
        String[] parts = step.get("table").asText().split("\\.", 2);
        return new TableId(databaseName, parts[0], parts[1]);
    }

    private static TxLogPosition position(JsonNode step) {
        Lsn commitLsn = Lsn.valueOf(step.get("commit_lsn").asText());
        return TxLogPosition.valueOf(commitLsn, step.hasNonNull("change_lsn") ? Lsn.valueOf(step.get("change_lsn").asText()) : commitLsn);
    }

    /** A change-table row as {@code SqlServerChangeTablePointer} maps it: each value at its column's position. */
    private static Object[] row(Table table, JsonNode values) {
        Object[] data = new Object[table.columns().size()];
        values.fields().forEachRemaining(entry -> {
            Column column = table.columnWithName(entry.getKey());
            if (column == null) {
                throw new IllegalArgumentException("table " + table.id() + " has no column " + entry.getKey());
            }
            data[column.position() - 1] = ScriptValues.javaValue(entry.getValue());
        });
        return data;
    }

    @Override
    Object transactionOf(JsonNode step) {
        return step.has("op") && step.hasNonNull("commit_lsn") ? step.get("commit_lsn").asText() : null;
    }
}
