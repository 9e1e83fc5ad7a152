package io.cdcpipeline.runner;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.Collections;
import java.util.Map;
import java.util.Set;

import org.apache.kafka.connect.errors.ConnectException;
import org.apache.kafka.connect.runtime.WorkerConfig;
import org.apache.kafka.connect.storage.MemoryOffsetBackingStore;

/**
 * Debezium offsets kept in the destination PostgreSQL, one row per (connector, offset key).
 * Each flush upserts the changed keys in one transaction and never deletes another connector's rows,
 * so many connectors share the table safely and a crash during a flush leaves the previous offset intact.
 * Properties: offset.storage.cdc.{jdbc.url, jdbc.user, jdbc.password, schema, table, connector}.
 */
public class PostgresOffsetStore extends MemoryOffsetBackingStore {
    static final String PREFIX = "offset.storage.cdc.";
    private JdbcTarget target;

    @Override
    public void configure(WorkerConfig config) {
        super.configure(config);
        target = JdbcTarget.from(config.originalsStrings(), PREFIX);
    }

    @Override
    public synchronized void start() {
        super.start();
        String query = "SELECT offset_key, offset_value FROM " + target.qualifiedTable() + " WHERE connector = ?";
        try (Connection connection = target.connect(); PreparedStatement statement = connection.prepareStatement(query)) {
            statement.setString(1, target.connector);
            try (ResultSet rows = statement.executeQuery()) {
                while (rows.next()) {
                    data.put(utf8(rows.getString(1)), rows.getString(2) == null ? null : utf8(rows.getString(2)));
                }
            }
        }
        catch (SQLException e) {
            throw new ConnectException("cannot read the offsets of connector '" + target.connector + "' from "
                    + target.qualifiedTable() + ": " + e.getMessage(), e);
        }
    }

    @Override
    protected void save() {
        String upsert = "INSERT INTO " + target.qualifiedTable()
                + " (connector, offset_key, offset_value, updated_at) VALUES (?, ?, ?, now())"
                + " ON CONFLICT (connector, offset_key) DO UPDATE SET offset_value = EXCLUDED.offset_value, updated_at = now()";
        try (Connection connection = target.connect()) {
            connection.setAutoCommit(false);
            try (PreparedStatement statement = connection.prepareStatement(upsert)) {
                for (Map.Entry<ByteBuffer, ByteBuffer> entry : data.entrySet()) {
                    statement.setString(1, target.connector);
                    statement.setString(2, text(entry.getKey()));
                    statement.setString(3, entry.getValue() == null ? null : text(entry.getValue()));
                    statement.addBatch();
                }
                statement.executeBatch();
            }
            connection.commit();
        }
        catch (SQLException e) {
            throw new ConnectException("cannot save the offsets of connector '" + target.connector + "': " + e.getMessage(), e);
        }
    }

    @Override
    public Set<Map<String, Object>> connectorPartitions(String connectorName) {
        return Collections.emptySet();
    }

    private static ByteBuffer utf8(String text) {
        return ByteBuffer.wrap(text.getBytes(StandardCharsets.UTF_8));
    }

    private static String text(ByteBuffer buffer) {
        ByteBuffer copy = buffer.duplicate();
        byte[] bytes = new byte[copy.remaining()];
        copy.get(bytes);
        return new String(bytes, StandardCharsets.UTF_8);
    }
}
