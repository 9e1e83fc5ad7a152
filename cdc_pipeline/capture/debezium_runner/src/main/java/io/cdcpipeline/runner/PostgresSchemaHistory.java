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
 *
 * Debezium hands records one at a time and counts each stored once `storeRecord` returns (Kafka's history waits
 * for each send): every record is committed on its own, in autocommit, on one connection that lives as long as the
 * history (a schema snapshot of N tables writes N records and more; a connection each cost a few milliseconds),
 * checked before each record (a destination restarted since is connected to again).
 * Properties: schema.history.internal.cdc.{jdbc.url, jdbc.user, jdbc.password, schema, table, connector}.
 */
public final class PostgresSchemaHistory extends AbstractSchemaHistory {
    static final String PREFIX = "schema.history.internal.cdc.";
    private final DocumentWriter writer = DocumentWriter.defaultWriter();
    private final DocumentReader reader = DocumentReader.defaultReader();
    private static final int VALID_SECONDS = 5;
    private JdbcTarget target;
    private Connection connection;  // autocommit: a record is durable once its INSERT returns

    @Override
    public void configure(Configuration config, HistoryRecordComparator comparator, SchemaHistoryListener listener,
                          boolean useCatalogBeforeSchema) {
        super.configure(config, comparator, listener, useCatalogBeforeSchema);
        Map<String, String> values = new HashMap<>(config.asMap());
        target = JdbcTarget.from(values, PREFIX);
    }

    @Override
    protected synchronized void storeRecord(HistoryRecord record) throws SchemaHistoryException {
        String text;
        try {
            text = writer.write(record.document());
        }
        catch (IOException e) {
            throw new SchemaHistoryException("cannot store schema history of connector '" + target.connector + "': " + e.getMessage(), e);
        }
        try {
            insert(text);
        }
        catch (SQLException e) {
            // Not stored again here: the INSERT may have committed before its answer was lost. The next record
            // opens a new connection.
            close();
            throw new SchemaHistoryException("cannot store schema history of connector '" + target.connector + "': " + e.getMessage(), e);
        }
    }

    private void insert(String record) throws SQLException {
        if (connection == null || !connection.isValid(VALID_SECONDS)) {
            close();
            connection = target.connect();
        }
        String insert = "INSERT INTO " + target.qualifiedTable() + " (connector, record) VALUES (?, ?)";
        try (PreparedStatement statement = connection.prepareStatement(insert)) {
            statement.setString(1, target.connector);
            statement.setString(2, record);
            statement.executeUpdate();
        }
    }

    @Override
    public synchronized void stop() {
        close();
        super.stop();
    }

    private void close() {
        if (connection != null) {
            try {
                connection.close();
            }
            catch (SQLException e) {
                // closing a broken connection: nothing is left to keep
            }
            connection = null;
        }
    }

    @Override
    protected void recoverRecords(Consumer<HistoryRecord> records) {
        String query = "SELECT record FROM " + target.qualifiedTable() + " WHERE connector = ? ORDER BY id";
        try (Connection reading = target.connect(); PreparedStatement statement = reading.prepareStatement(query)) {
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
        try (Connection reading = target.connect(); PreparedStatement statement = reading.prepareStatement(query)) {
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
