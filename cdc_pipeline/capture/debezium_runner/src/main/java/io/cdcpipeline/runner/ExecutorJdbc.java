package io.cdcpipeline.runner;

import java.sql.Connection;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.Deque;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedDeque;

/**
 * Connections the JVM opens to the destination PostgreSQL: Spark's tasks (the bulk snapshot's and the stream's
 * COPY) and the offset and schema history stores. The URL's `options` pin the session's settings (the Python
 * side's `SESSION_SETTINGS`); the time zone is pinned here once more because pgjdbc sends the JVM's own zone at
 * startup, which outranks the `options`.
 *
 * Tasks borrow their connection (`borrow`) and give it back once they committed (`giveBack`): a stream group
 * runs a task per few tables, and a new connection (TCP, authentication, the session's settings) costs more than
 * the rows most of them write. A few idle connections are kept per destination and user in each JVM; one idle for
 * a while is checked before it is lent again, and `closeIdle` (the driver, at the end of a run) closes them all.
 */
public final class ExecutorJdbc {
    private static final String SESSION_TIME_ZONE = "SET TimeZone TO 'UTC'";
    private static final int IDLE_PER_TARGET = 8;
    private static final long CHECK_IDLE_AFTER_NANOS = 5_000_000_000L;
    private static final int VALID_TIMEOUT_SECONDS = 5;
    private static final Map<String, Deque<Idle>> IDLE = new ConcurrentHashMap<>();

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

    /** An idle connection to the destination kept by `giveBack`, else a new one. */
    public static Connection borrow(String url, String user, String password) throws SQLException {
        Deque<Idle> idle = IDLE.get(key(url, user));
        if (idle != null) {
            for (Idle kept = idle.pollFirst(); kept != null; kept = idle.pollFirst()) {
                if (kept.usable()) {
                    return kept.connection;
                }
                closeQuietly(kept.connection);
            }
        }
        return connect(url, user, password);
    }

    /**
     * Keeps a borrowed connection for the next task, outside any transaction (autocommit on); a connection that
     * failed, or one past the few kept, is closed instead.
     */
    public static void giveBack(String url, String user, Connection connection) {
        try {
            if (connection.isClosed()) {
                return;
            }
            connection.setAutoCommit(true);
        }
        catch (SQLException e) {
            closeQuietly(connection);
            return;
        }
        Deque<Idle> idle = IDLE.computeIfAbsent(key(url, user), ignored -> new ConcurrentLinkedDeque<>());
        if (idle.size() >= IDLE_PER_TARGET) {
            closeQuietly(connection);
            return;
        }
        idle.offerFirst(new Idle(connection));
    }

    /** Closes every idle connection this JVM keeps; returns how many. */
    public static int closeIdle() {
        int closed = 0;
        for (Deque<Idle> idle : IDLE.values()) {
            for (Idle kept = idle.pollFirst(); kept != null; kept = idle.pollFirst()) {
                closeQuietly(kept.connection);
                closed++;
            }
        }
        return closed;
    }

    private static String key(String url, String user) {
        return url + '\u0000' + (user == null ? "" : user);
    }

    private static void closeQuietly(Connection connection) {
        try {
            connection.close();
        }
        catch (SQLException ignored) {
            // A connection that cannot even close is gone already.
        }
    }

    private static final class Idle {
        final Connection connection;
        final long since = System.nanoTime();

        Idle(Connection connection) {
            this.connection = connection;
        }

        boolean usable() {
            try {
                if (connection.isClosed()) {
                    return false;
                }
                return System.nanoTime() - since < CHECK_IDLE_AFTER_NANOS || connection.isValid(VALID_TIMEOUT_SECONDS);
            }
            catch (SQLException e) {
                return false;
            }
        }
    }
}
