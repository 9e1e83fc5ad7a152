package io.cdcpipeline.runner;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.Iterator;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.VoidFunction;
import org.apache.spark.sql.catalyst.InternalRow;

/**
 * Writes one chunk of a bulk snapshot per Spark partition into the destination PostgreSQL with COPY, in the
 * executor that read it, and checkpoints the chunk in the same transaction. One job's chunks may belong to several
 * tables (small tables' chunks share a job): each chunk names the table whose statements write it.
 *
 * Each partition's rows are its chunk's COPY text lines (column 0), for a chunk read under a consistent snapshot
 * the source position of that snapshot (column 1, on its first row), and the row's zero dates written as NULL
 * (column 2), which the checkpoint counts. The transaction first claims
 * the chunk (an UPDATE of its checkpoint row that matches only while the chunk is not done): a retried or
 * speculative task of a chunk already committed writes nothing, and two attempts at once serialize on the row
 * lock. All SQL comes from the driver, built with the destination's quoting rules.
 *
 * It reads Spark's internal rows (the lines' UTF-8 bytes are copied as they are, never decoded), and a second
 * thread feeds COPY while the task's thread reads the source and converts the next rows: the source and the
 * destination work at the same time.
 */
public final class ChunkCopyWriter implements VoidFunction<Iterator<InternalRow>>, Serializable {
    private static final long serialVersionUID = 1L;
    static final String PAUSE_STAGE = "bulk_copy";

    private final String url;
    private final String user;
    private final String password;
    private final long[] chunkIds;
    private final int[] tableOfChunk;
    private final String claimSql;
    private final String[][] beforeCopy;
    private final String[] copySql;
    private final String[][] afterCopy;
    private final String finishSql;

    /**
     * @param chunkIds     the chunk id of each partition, by partition index
     * @param tableOfChunk the index of each chunk's table in the statements below, by partition index
     * @param claimSql     takes the chunk id; updates one row when the chunk is not done yet
     * @param beforeCopy   per table, the statements run after the claim (a staging table)
     * @param copySql      per table, the COPY ... FROM STDIN statement
     * @param afterCopy    per table, the statements run after the COPY (a merge from the staging table)
     * @param finishSql    takes the row count, the zero dates, the position (text or null) and the chunk id
     */
    public ChunkCopyWriter(String url, String user, String password, long[] chunkIds, int[] tableOfChunk,
                           String claimSql, String[][] beforeCopy, String[] copySql, String[][] afterCopy,
                           String finishSql) {
        this.url = url;
        this.user = user;
        this.password = password;
        this.chunkIds = chunkIds.clone();
        this.tableOfChunk = tableOfChunk.clone();
        this.claimSql = claimSql;
        this.beforeCopy = beforeCopy.clone();
        this.copySql = copySql.clone();
        this.afterCopy = afterCopy.clone();
        this.finishSql = finishSql;
    }

    /**
     * The writer of a slice's chunks as the driver describes them in one JSON text (a py4j call per array element
     * would cost the driver more than a small chunk's copy): {@code chunkIds}, {@code tableOfChunk},
     * {@code claimSql}, {@code beforeCopy}, {@code copySql}, {@code afterCopy}, {@code finishSql}, as the
     * constructor takes them.
     */
    public static ChunkCopyWriter fromJson(String url, String user, String password, String json) throws IOException {
        JsonNode plan = new ObjectMapper().readTree(json);
        return new ChunkCopyWriter(url, user, password, longs(plan.get("chunkIds")), ints(plan.get("tableOfChunk")),
                                   plan.get("claimSql").asText(), textLists(plan.get("beforeCopy")),
                                   texts(plan.get("copySql")), textLists(plan.get("afterCopy")),
                                   plan.get("finishSql").asText());
    }

    static long[] longs(JsonNode values) {
        long[] array = new long[values.size()];
        for (int i = 0; i < array.length; i++) {
            array[i] = values.get(i).asLong();
        }
        return array;
    }

    static int[] ints(JsonNode values) {
        int[] array = new int[values.size()];
        for (int i = 0; i < array.length; i++) {
            array[i] = values.get(i).asInt();
        }
        return array;
    }

    /** The text of a JSON value, a JSON null as null. */
    static String text(JsonNode value) {
        return value == null || value.isNull() ? null : value.asText();
    }

    static String[] texts(JsonNode values) {
        String[] array = new String[values.size()];
        for (int i = 0; i < array.length; i++) {
            array[i] = text(values.get(i));
        }
        return array;
    }

    static String[][] textLists(JsonNode values) {
        String[][] array = new String[values.size()][];
        for (int i = 0; i < array.length; i++) {
            array[i] = texts(values.get(i));
        }
        return array;
    }

    @Override
    public void call(Iterator<InternalRow> rows) throws Exception {
        int index = TaskContext.getPartitionId();
        Connection connection = connect();
        boolean copied = false;
        try {
            copyChunk(connection, index, destination -> {
                ChunkRows text = new ChunkRows();
                long rowsCopied = CopyFeeder.copyRows(destination, copySql(index), "cdc-chunk-copy", rows, text);
                return new CopyResult(rowsCopied, text.zeroDates, text.position);
            });
            copied = true;
        }
        finally {
            release(connection, copied);
        }
    }

    /** Copies a chunk's rows into the destination connection it is given, in the chunk's transaction. */
    interface ChunkCopy {
        CopyResult copy(Connection destination) throws Exception;
    }

    /**
     * A destination connection for chunks' transactions (one after the other: a task's chunks share it), borrowed
     * from the JVM's kept ones (`ExecutorJdbc.borrow`); `release` gives it back.
     */
    Connection connect() throws SQLException {
        Connection connection = ExecutorJdbc.borrow(url, user, password);
        try {
            connection.setAutoCommit(false);
        }
        catch (SQLException e) {
            connection.close();
            throw e;
        }
        return connection;
    }

    /** Gives a connection of `connect` back to be kept when its chunks committed, else closes it. */
    void release(Connection connection, boolean committed) throws SQLException {
        if (committed) {
            ExecutorJdbc.giveBack(url, user, connection);
        }
        else {
            connection.close();
        }
    }

    /**
     * The transaction of chunk `index` on `connection`: claims the chunk (nothing is written when it is done
     * already), runs its table's statements before the copy, the copy, those after it and the checkpoint, and
     * commits.
     */
    void copyChunk(Connection connection, int index, ChunkCopy chunkCopy) throws Exception {
        long chunkId = chunkIds[index];
        int table = tableOfChunk[index];
        try {
            if (!claim(connection, chunkId)) {
                connection.rollback();
                return;
            }
            execute(connection, beforeCopy[table]);
            CopyResult result = chunkCopy.copy(connection);
            execute(connection, afterCopy[table]);
            try (PreparedStatement finish = connection.prepareStatement(finishSql)) {
                finish.setLong(1, result.rows);
                finish.setLong(2, result.zeroDates);
                finish.setString(3, result.position);
                finish.setLong(4, chunkId);
                finish.executeUpdate();
            }
            pauseIfAsked();
            connection.commit();
        }
        catch (Exception e) {
            connection.rollback();
            throw new SQLException("chunk " + chunkId + ": " + e.getMessage(), e);
        }
    }

    /** The COPY statement of chunk `index`'s table. */
    String copySql(int index) {
        return copySql[tableOfChunk[index]];
    }

    private boolean claim(Connection connection, long chunkId) throws SQLException {
        try (PreparedStatement claim = connection.prepareStatement(claimSql)) {
            claim.setLong(1, chunkId);
            return claim.executeUpdate() == 1;
        }
    }

    private static void execute(Connection connection, String[] statements) throws SQLException {
        try (Statement statement = connection.createStatement()) {
            for (String sql : statements) {
                statement.execute(sql);
            }
        }
    }

    /** A chunk's rows as COPY text; the first row carries the chunk's source position, and only it if no data. */
    private static final class ChunkRows implements CopyFeeder.RowText {
        String position;
        long zeroDates;
        private boolean first = true;

        @Override
        public void write(InternalRow row, ByteArrayOutputStream out) throws IOException {
            if (first) {
                position = row.isNullAt(1) ? null : row.getUTF8String(1).toString();
                first = false;
            }
            if (row.isNullAt(0)) {
                return;  // the row that carries the position
            }
            zeroDates += row.getInt(2);
            row.getUTF8String(0).writeTo(out);
            out.write('\n');
        }
    }

    /** The fault tests' pause point inside a chunk's transaction (see cdc_pipeline/faults.py). */
    private static void pauseIfAsked() throws Exception {
        String wanted = System.getenv("CDC_PIPELINE_PAUSE_AT");
        if (!PAUSE_STAGE.equals(wanted)) {
            return;
        }
        String marker = System.getenv("CDC_PIPELINE_PAUSE_FILE");
        if (marker != null) {
            // Written aside and renamed: a test polling for the file must never find it created but still empty.
            Path part = Paths.get(marker + ".part");
            Files.write(part, PAUSE_STAGE.getBytes(StandardCharsets.UTF_8));
            Files.move(part, Paths.get(marker), StandardCopyOption.ATOMIC_MOVE);
        }
        Thread.sleep(Long.MAX_VALUE);
    }

    /** What a chunk's copy wrote: its rows, the zero dates it wrote as NULL, its snapshot's position (or null). */
    static final class CopyResult {
        final long rows;
        final long zeroDates;
        final String position;

        CopyResult(long rows, long zeroDates, String position) {
            this.rows = rows;
            this.zeroDates = zeroDates;
            this.position = position;
        }
    }
}
