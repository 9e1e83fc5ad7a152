package io.cdcpipeline.runner;

import java.sql.Connection;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.Properties;

/**
 * Connections the JVM opens to the destination PostgreSQL: Spark's tasks (the bulk snapshot's and the stream's
 * COPY) and the offset and schema history stores. The URL's `options` pin the session's settings (the Python
 * side's `SESSION_SETTINGS`); the time zone is pinned here once more because pgjdbc sends the JVM's own zone at
 * startup, which outranks the `options`.
 */
public final class ExecutorJdbc {
    private static final String SESSION_TIME_ZONE = "SET TimeZone TO 'UTC'";

    private ExecutorJdbc() {
    }

    public static Connection connect(String url, String user, String password) throws SQLException {
        Properties properties = new Properties();
        if (user != null) {
            properties.setProperty("user", user);
        }
        if (password != null) {
            properties.setProperty("password", password);
        }
        // The driver class itself, not DriverManager: executors load the JDBC jar through Spark's class loader.
        Connection connection = new org.postgresql.Driver().connect(url, properties);
        try (Statement statement = connection.createStatement()) {
            statement.execute(SESSION_TIME_ZONE);
        }
        catch (SQLException e) {
            connection.close();
            throw e;
        }
        return connection;
    }
}
