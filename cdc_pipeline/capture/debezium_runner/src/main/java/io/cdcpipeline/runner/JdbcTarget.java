package io.cdcpipeline.runner;

import java.sql.Connection;
import java.sql.SQLException;
import java.util.Map;

/**
 * Where a store keeps its rows in the destination PostgreSQL: JDBC URL and credentials, the control
 * schema and table, and the connector whose rows these are (one table holds many connectors' rows).
 */
final class JdbcTarget {
    final String url;
    final String user;
    final String password;
    final String schema;
    final String table;
    final String connector;

    private JdbcTarget(String url, String user, String password, String schema, String table, String connector) {
        this.url = url;
        this.user = user;
        this.password = password;
        this.schema = schema;
        this.table = table;
        this.connector = connector;
    }

    static JdbcTarget from(Map<String, ?> config, String prefix) {
        return new JdbcTarget(
                required(config, prefix + "jdbc.url"),
                optional(config, prefix + "jdbc.user"),
                optional(config, prefix + "jdbc.password"),
                required(config, prefix + "schema"),
                required(config, prefix + "table"),
                required(config, prefix + "connector"));
    }

    Connection connect() throws SQLException {
        return ExecutorJdbc.connect(url, user, password);
    }

    String qualifiedTable() {
        return quote(schema) + "." + quote(table);
    }

    static String quote(String identifier) {
        return "\"" + identifier.replace("\"", "\"\"") + "\"";
    }

    private static String required(Map<String, ?> config, String key) {
        Object value = config.get(key);
        if (value == null || value.toString().isEmpty()) {
            throw new IllegalArgumentException("missing runner property '" + key + "'");
        }
        return value.toString();
    }

    private static String optional(Map<String, ?> config, String key) {
        Object value = config.get(key);
        return value == null ? null : value.toString();
    }
}
