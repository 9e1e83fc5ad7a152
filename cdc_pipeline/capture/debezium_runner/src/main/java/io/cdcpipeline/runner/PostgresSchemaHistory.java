package io.cdcpipeline.runner;

import java.io.IOException;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.HashMap;
import java.util.Map;
import java.util.function.Consumer;

import io.debezium.config.Configuration;
import io.debezium.document.DocumentReader;
import io.debezium.document.DocumentWriter;
import io.debezium.relational.history.AbstractSchemaHistory;
import io.debezium.relational.history.HistoryRecord;
import io.debezium.relational.history.HistoryRecordComparator;
import io.debezium.relational.history.SchemaHistoryException;
import io.debezium.relational.history.SchemaHistoryListener;

/**
 * Debezium's schema history kept in the destination PostgreSQL, appended per connector in source order.
 * Properties: schema.history.internal.cdc.{jdbc.url, jdbc.user, jdbc.password, schema, table, connector}.
 */
public final class PostgresSchemaHistory extends AbstractSchemaHistory {
    static final String PREFIX = "schema.history.internal.cdc.";
    private final DocumentWriter writer = DocumentWriter.defaultWriter();
    private final DocumentReader reader = DocumentReader.defaultReader();
    private JdbcTarget target;

    @Override
    public void configure(Configuration config, HistoryRecordComparator comparator, SchemaHistoryListener listener,
                          boolean useCatalogBeforeSchema) {
        super.configure(config, comparator, listener, useCatalogBeforeSchema);
        Map<String, String> values = new HashMap<>(config.asMap());
        target = JdbcTarget.from(values, PREFIX);
    }

    @Override
    protected void storeRecord(HistoryRecord record) throws SchemaHistoryException {
        String insert = "INSERT INTO " + target.qualifiedTable() + " (connector, record) VALUES (?, ?)";
        try (Connection connection = target.connect(); PreparedStatement statement = connection.prepareStatement(insert)) {
            statement.setString(1, target.connector);
            statement.setString(2, writer.write(record.document()));
            statement.executeUpdate();
        }
        catch (SQLException | IOException e) {
            throw new SchemaHistoryException("cannot store schema history of connector '" + target.connector + "': " + e.getMessage(), e);
        }
    }

    @Override
    protected void recoverRecords(Consumer<HistoryRecord> records) {
        String query = "SELECT record FROM " + target.qualifiedTable() + " WHERE connector = ? ORDER BY id";
        try (Connection connection = target.connect(); PreparedStatement statement = connection.prepareStatement(query)) {
            statement.setString(1, target.connector);
            try (ResultSet rows = statement.executeQuery()) {
                while (rows.next()) {
                    records.accept(new HistoryRecord(reader.read(rows.getString(1))));
                }
            }
        }
        catch (SQLException | IOException e) {
            throw new SchemaHistoryException("cannot read schema history of connector '" + target.connector + "': " + e.getMessage(), e);
        }
    }

    @Override
    public boolean exists() {
        String query = "SELECT 1 FROM " + target.qualifiedTable() + " WHERE connector = ? LIMIT 1";
        try (Connection connection = target.connect(); PreparedStatement statement = connection.prepareStatement(query)) {
            statement.setString(1, target.connector);
            try (ResultSet rows = statement.executeQuery()) {
                return rows.next();
            }
        }
        catch (SQLException e) {
            throw new SchemaHistoryException("cannot read schema history of connector '" + target.connector + "': " + e.getMessage(), e);
        }
    }

    @Override
    public boolean storageExists() {
        return true;
    }

    @Override
    public String toString() {
        return "PostgreSQL schema history " + (target == null ? "" : target.qualifiedTable());
    }
}
