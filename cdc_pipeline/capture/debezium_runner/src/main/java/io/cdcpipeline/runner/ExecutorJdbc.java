package io.cdcpipeline.runner;

import java.sql.Connection;
import java.sql.SQLException;
import java.util.Properties;

/** Connections a Spark task opens to the destination PostgreSQL. */
final class ExecutorJdbc {
    private ExecutorJdbc() {
    }

    static Connection connect(String url, String user, String password) throws SQLException {
        Properties properties = new Properties();
        if (user != null) {
            properties.setProperty("user", user);
        }
        if (password != null) {
            properties.setProperty("password", password);
        }
        // The driver class itself, not DriverManager: executors load the JDBC jar through Spark's class loader.
        return new org.postgresql.Driver().connect(url, properties);
    }
}
