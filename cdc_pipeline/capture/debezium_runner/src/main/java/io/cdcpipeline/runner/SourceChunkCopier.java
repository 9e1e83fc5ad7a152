package io.cdcpipeline.runner;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.Driver;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Types;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Properties;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.VoidFunction;
import org.postgresql.PGConnection;
import org.postgresql.copy.CopyOut;

/**
 * A bulk snapshot's chunks copied by Spark tasks that read the source themselves: one partition per chunk, each
 * task reading its chunk's SELECT over the source's JDBC driver and writing its rows as COPY text into the
 * destination, in the chunk's transaction (`ChunkCopyWriter.copyChunk`: claim, copy, checkpoint, commit).
 *
 * The source selects each column as text (or as the bytes its SQL made ready, a hex string say), and the task
 * makes each field COPY text by its kind (cdc_pipeline/copy_text.py's FIELD_*): a text value escaped (backslash,
 * newline, carriage return, tab; NUL taken out, as PostgreSQL's text types cannot hold it), a zero date as NULL,
 * binary bytes as bytea's hex text, others as they are; NULL as \N. The escaped bytes are ASCII, never part of a
 * multi-byte UTF-8 character, so a value's UTF-8 bytes are escaped as bytes, never decoded. The source runs no
 * per-row expression (in MariaDB, rendering COPY text in the SELECT cost three times the plain SELECT), and no Spark
 * row is built.
 *
 * Memory is bounded by bytes, not rows: the driver holds one fetch of a chunk's rows (its fetch size, set per chunk
 * from the table's average row size), a value is escaped or hex-encoded in windows of 64 KB, and the COPY text goes
 * out in pieces of 256 KB (`CopyFeeder`). A row of many MB costs about its own size, a few times over.
 *
 * A PostgreSQL source writes the COPY text itself: each chunk query is a `COPY (SELECT ...) TO STDOUT`, read through
 * pgjdbc's CopyManager and handed, as the source wrote it, to the destination's `COPY ... FROM STDIN` (`copyOut`). The
 * source's text output is what its `::text` casts gave the other path, so the destination reads the same values; no
 * value is parsed, escaped or converted on the way.
 *
 * A chunk read under a consistent snapshot (a table without a key) runs on a source session of its own: the
 * session's statements, `snapshotStatement`, then its `positionSql`, whose one value is the snapshot's source
 * position, checkpointed with the chunk. A task may hold several chunks (small tables' chunks share a job): the
 * others share one source session and one destination connection, each chunk still in its own transaction.
 */
public final class SourceChunkCopier implements VoidFunction<Iterator<Integer>>, Serializable {
    private static final long serialVersionUID = 1L;
    /** The kinds of fields (cdc_pipeline/copy_text.py's FIELD_*). */
    static final int PLAIN = 0;
    static final int TEXT = 1;
    static final int DATE = 2;
    static final int BYTEA = 3;
    /** Bytes of a value escaped or hex-encoded at a time. */
    private static final int WINDOW = 1 << 16;
    private static final byte[] HEX_DIGITS = "0123456789abcdef".getBytes(StandardCharsets.US_ASCII);
    private static final byte[] BYTEA_PREFIX = {'\\', '\\', 'x'};
    private static final byte[] NULL_TEXT = {'\\', 'N'};
    private static final byte[] ZERO_DATE = "0000-00-00".getBytes(StandardCharsets.US_ASCII);

    private final ChunkCopyWriter transaction;
    private final String driverClass;
    private final String sourceUrl;
    private final String sourceUser;
    private final String sourcePassword;
    private final String[] sessionStatements;
    private final String snapshotStatement;
    private final String[] positionSql;
    private final String[] chunkQueries;
    private final int[][] kinds;
    private final int[] fetchSizes;
    private final boolean copyOut;

    /**
     * @param transaction       the chunks' transactions in the destination (it holds each chunk's id and table)
     * @param driverClass       the source's JDBC driver class
     * @param sessionStatements run first in every source session
     * @param snapshotStatement starts a consistent snapshot (run before a chunk's `positionSql`)
     * @param positionSql       per chunk, the query of its snapshot's position, or null (a chunk read by key range)
     * @param chunkQueries      per chunk, the SELECT of its fields
     * @param kinds             per chunk, how to write each field
     * @param fetchSizes        per chunk, the JDBC fetch size of its SELECT (rows the driver holds at a time)
     * @param copyOut           the chunk queries are PostgreSQL `COPY ... TO STDOUT`s whose text goes to the
     *                          destination as it is (no kinds)
     */
    public SourceChunkCopier(ChunkCopyWriter transaction, String driverClass, String sourceUrl,
                             String sourceUser, String sourcePassword, String[] sessionStatements,
                             String snapshotStatement, String[] positionSql, String[] chunkQueries, int[][] kinds,
                             int[] fetchSizes, boolean copyOut) {
        this.transaction = transaction;
        this.driverClass = driverClass;
        this.sourceUrl = sourceUrl;
        this.sourceUser = sourceUser;
        this.sourcePassword = sourcePassword;
        this.sessionStatements = sessionStatements.clone();
        this.snapshotStatement = snapshotStatement;
        this.positionSql = positionSql.clone();
        this.chunkQueries = chunkQueries.clone();
        this.kinds = kinds.clone();
        this.fetchSizes = fetchSizes.clone();
        this.copyOut = copyOut;
    }

    /**
     * The copier of a slice's chunks as the driver describes them in one JSON text (see
     * `ChunkCopyWriter.fromJson`): {@code sessionStatements}, {@code snapshotStatement}, {@code positionSql},
     * {@code chunkQueries}, {@code kinds}, {@code fetchSizes} and {@code copyOut} (false when absent), as the
     * constructor takes them.
     */
    public static SourceChunkCopier fromJson(ChunkCopyWriter transaction, String driverClass, String sourceUrl,
                                             String sourceUser, String sourcePassword, String json)
            throws IOException {
        JsonNode plan = new ObjectMapper().readTree(json);
        JsonNode kindLists = plan.get("kinds");
        int[][] kinds = new int[kindLists.size()][];
        for (int i = 0; i < kinds.length; i++) {
            kinds[i] = ChunkCopyWriter.ints(kindLists.get(i));
        }
        return new SourceChunkCopier(transaction, driverClass, sourceUrl, sourceUser, sourcePassword,
                                     ChunkCopyWriter.texts(plan.get("sessionStatements")),
                                     ChunkCopyWriter.text(plan.get("snapshotStatement")),
                                     ChunkCopyWriter.texts(plan.get("positionSql")),
                                     ChunkCopyWriter.texts(plan.get("chunkQueries")), kinds,
                                     ChunkCopyWriter.ints(plan.get("fetchSizes")),
                                     plan.path("copyOut").asBoolean(false));
    }

    /** The job's input: the chunks' indexes, in order, in `partitions` partitions (a task copies its in turn). */
    public static JavaRDD<Integer> chunks(JavaSparkContext context, int count, int partitions) {
        List<Integer> indexes = new ArrayList<>(count);
        for (int i = 0; i < count; i++) {
            indexes.add(i);
        }
        return context.parallelize(indexes, Math.max(1, Math.min(count, partitions)));
    }

    @Override
    public void call(Iterator<Integer> partition) throws Exception {
        Connection shared = null;
        Connection destination = transaction.connect();
        boolean copied = false;
        try {
            while (partition.hasNext()) {
                int index = partition.next();
                if (positionSql[index] != null) {
                    try (Connection source = session()) {
                        transaction.copyChunk(destination, index, target -> copy(source, index, target));
                    }
                    continue;
                }
                if (shared == null) {
                    shared = session();
                }
                Connection source = shared;
                transaction.copyChunk(destination, index, target -> copy(source, index, target));
            }
            copied = true;
        }
        finally {
            transaction.release(destination, copied);
            if (shared != null) {
                shared.close();
            }
        }
    }

    /** A source session, its statements run. */
    private Connection session() throws Exception {
        Connection connection = connect();
        try (Statement statement = connection.createStatement()) {
            for (String sql : sessionStatements) {
                statement.execute(sql);
            }
        }
        catch (SQLException e) {
            connection.close();
            throw e;
        }
        return connection;
    }

    private ChunkCopyWriter.CopyResult copy(Connection source, int index, Connection destination) throws Exception {
        try (Statement statement = source.createStatement()) {
            String position = null;
            if (positionSql[index] != null) {
                statement.execute(snapshotStatement);
                try (ResultSet rows = statement.executeQuery(positionSql[index])) {
                    position = rows.next() ? rows.getString(1) : null;
                }
            }
            if (copyOut) {
                return new ChunkCopyWriter.CopyResult(pipeCopy(source, index, destination), 0, position);
            }
            // MariaDB Connector/J streams the result, `fetchSize` rows at a time; pgjdbc reads through a cursor
            // (outside autocommit) as many at a time.
            statement.setFetchSize(fetchSizes[index]);
            try (ResultSet rows = statement.executeQuery(chunkQueries[index])) {
                Fields fields = new Fields(rows, kinds[index]);
                long copied = CopyFeeder.copy(destination, transaction.copySql(index), "cdc-chunk-copy",
                                              fields::write);
                return new ChunkCopyWriter.CopyResult(copied, 0, position);
            }
        }
    }

    /**
     * The chunk's `COPY ... TO STDOUT` on the source piped into its `COPY ... FROM STDIN` on the destination: this
     * thread reads the source's rows while the feeder thread writes the last ones; returns the rows the destination
     * took. A failure on either side cancels both COPYs.
     */
    private long pipeCopy(Connection source, int index, Connection destination) throws Exception {
        CopyOut out = source.unwrap(PGConnection.class).getCopyAPI().copyOut(chunkQueries[index]);
        try {
            return CopyFeeder.copy(destination, transaction.copySql(index), "cdc-chunk-copy", buffer -> {
                byte[] row = out.readFromCopy();
                if (row == null) {
                    return false;
                }
                buffer.write(row, 0, row.length);
                return true;
            });
        }
        finally {
            if (out.isActive()) {
                out.cancelCopy();
            }
        }
    }

    private Connection connect() throws Exception {
        Properties properties = new Properties();
        properties.setProperty("user", sourceUser);
        if (sourcePassword != null) {
            properties.setProperty("password", sourcePassword);
        }
        // The driver class itself, not DriverManager: executors load the JDBC jar through Spark's class loader, and
        // two drivers on the class path may both take the URL's scheme.
        Driver driver = (Driver) Class.forName(driverClass, true, Thread.currentThread().getContextClassLoader())
            .getDeclaredConstructor().newInstance();
        Connection connection = driver.connect(sourceUrl, properties);
        if (connection == null) {
            throw new SQLException(driverClass + " does not take the source's URL");
        }
        return connection;
    }

    /** A result set's rows written as COPY text lines. */
    private static final class Fields {
        private final ResultSet rows;
        private final int[] kinds;
        private final boolean[] asBytes;
        private final byte[] window = new byte[2 * WINDOW];

        Fields(ResultSet rows, int[] kinds) throws SQLException {
            ResultSetMetaData meta = rows.getMetaData();
            if (meta.getColumnCount() != kinds.length) {
                throw new SQLException("the chunk's SELECT has " + meta.getColumnCount() + " columns, not "
                                       + kinds.length);
            }
            this.rows = rows;
            this.kinds = kinds;
            // A value of a string type is read as the bytes the server sent (utf8mb4); any other (a JSON value,
            // say) through the driver's text of it.
            asBytes = new boolean[kinds.length];
            for (int i = 0; i < kinds.length; i++) {
                if (kinds[i] == BYTEA) {
                    asBytes[i] = true;
                    continue;
                }
                switch (meta.getColumnType(i + 1)) {
                    case Types.CHAR: case Types.VARCHAR: case Types.LONGVARCHAR: case Types.BINARY:
                    case Types.VARBINARY: case Types.LONGVARBINARY: case Types.BLOB: case Types.CLOB:
                        asBytes[i] = true;
                        break;
                    default:
                        asBytes[i] = false;
                }
            }
        }

        boolean write(ByteArrayOutputStream out) throws SQLException {
            if (!rows.next()) {
                return false;
            }
            for (int i = 0; i < kinds.length; i++) {
                if (i > 0) {
                    out.write('\t');
                }
                byte[] value;
                if (asBytes[i]) {
                    value = rows.getBytes(i + 1);
                }
                else {
                    String text = rows.getString(i + 1);
                    value = text == null ? null : text.getBytes(StandardCharsets.UTF_8);
                }
                if (value == null || kinds[i] == DATE && isZeroDate(value)) {
                    out.write(NULL_TEXT, 0, NULL_TEXT.length);
                }
                else if (kinds[i] == TEXT) {
                    writeEscaped(value, out);
                }
                else if (kinds[i] == BYTEA) {
                    writeHex(value, out);
                }
                else {
                    out.write(value, 0, value.length);
                }
            }
            out.write('\n');
            return true;
        }

        private static boolean isZeroDate(byte[] value) {
            if (value.length < ZERO_DATE.length) {
                return false;
            }
            for (int i = 0; i < ZERO_DATE.length; i++) {
                if (value[i] != ZERO_DATE[i]) {
                    return false;
                }
            }
            return true;
        }

        /** The value's bytes with COPY's escapes (NUL taken out), a window at a time. */
        private void writeEscaped(byte[] value, ByteArrayOutputStream out) {
            if (!hasSpecial(value)) {
                out.write(value, 0, value.length);
                return;
            }
            for (int start = 0; start < value.length; start += WINDOW) {
                int end = Math.min(value.length, start + WINDOW);
                int n = 0;
                for (int i = start; i < end; i++) {
                    byte b = value[i];
                    switch (b) {
                        case 0:
                            break;
                        case '\\':
                            window[n++] = '\\';
                            window[n++] = '\\';
                            break;
                        case '\n':
                            window[n++] = '\\';
                            window[n++] = 'n';
                            break;
                        case '\r':
                            window[n++] = '\\';
                            window[n++] = 'r';
                            break;
                        case '\t':
                            window[n++] = '\\';
                            window[n++] = 't';
                            break;
                        default:
                            window[n++] = b;
                    }
                }
                out.write(window, 0, n);
            }
        }

        private static boolean hasSpecial(byte[] value) {
            for (byte b : value) {
                if (b == '\\' || b == '\n' || b == '\r' || b == '\t' || b == 0) {
                    return true;
                }
            }
            return false;
        }

        /** Binary bytes as bytea's hex text in COPY (its backslash escaped), a window at a time. */
        private void writeHex(byte[] value, ByteArrayOutputStream out) {
            out.write(BYTEA_PREFIX, 0, BYTEA_PREFIX.length);
            for (int start = 0; start < value.length; start += WINDOW) {
                int end = Math.min(value.length, start + WINDOW);
                int n = 0;
                for (int i = start; i < end; i++) {
                    window[n++] = HEX_DIGITS[(value[i] >> 4) & 0xf];
                    window[n++] = HEX_DIGITS[value[i] & 0xf];
                }
                out.write(window, 0, n);
            }
        }
    }
}
