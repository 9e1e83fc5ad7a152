package io.cdcpipeline.runner;

import java.io.ByteArrayOutputStream;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.util.Iterator;

import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.VoidFunction;
import org.apache.spark.sql.catalyst.InternalRow;
import org.postgresql.PGConnection;
import org.postgresql.copy.CopyIn;

/**
 * Writes the converted rows of one streamed step into a staging table of the destination with COPY, one Spark
 * partition per task, in the executor that computed them; the driver then merges the staged rows into their table
 * in the batch's own transaction. No row travels through the driver.
 *
 * Each row's column 0 is the COPY text of the staged columns after the first two; the writer puts the step and the
 * partition index in front. A task's transaction first takes an advisory lock on (staging table, step, partition)
 * and deletes what an earlier attempt at the same partition wrote: a retried or speculative attempt replaces those
 * rows, never adds to them. All SQL comes from the driver, built with the destination's quoting rules.
 */
public final class StageCopyWriter implements VoidFunction<Iterator<InternalRow>>, Serializable {
    private static final long serialVersionUID = 1L;
    private static final int FLUSH_BYTES = 1 << 18;
    private static final String LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended(?, 0))";

    private final String url;
    private final String user;
    private final String password;
    private final String staging;
    private final long step;
    private final String deleteSql;
    private final String copySql;

    /**
     * @param staging   the staging table's name, as the lock's name
     * @param step      the step's number in the staging table (its first column)
     * @param deleteSql takes the step and the partition index; deletes an earlier attempt's rows
     * @param copySql   the COPY ... FROM STDIN statement
     */
    public StageCopyWriter(String url, String user, String password, String staging, long step, String deleteSql,
                           String copySql) {
        this.url = url;
        this.user = user;
        this.password = password;
        this.staging = staging;
        this.step = step;
        this.deleteSql = deleteSql;
        this.copySql = copySql;
    }

    @Override
    public void call(Iterator<InternalRow> rows) throws Exception {
        if (!rows.hasNext()) {
            return;
        }
        int partition = TaskContext.getPartitionId();
        try (Connection connection = ExecutorJdbc.connect(url, user, password)) {
            connection.setAutoCommit(false);
            try {
                try (PreparedStatement lock = connection.prepareStatement(LOCK_SQL)) {
                    lock.setString(1, staging + ":" + step + ":" + partition);
                    lock.executeQuery().close();
                }
                try (PreparedStatement delete = connection.prepareStatement(deleteSql)) {
                    delete.setLong(1, step);
                    delete.setInt(2, partition);
                    delete.executeUpdate();
                }
                copy(connection, rows, (step + "\t" + partition + "\t").getBytes(StandardCharsets.UTF_8));
                connection.commit();
            }
            catch (Exception e) {
                connection.rollback();
                throw new SQLException("staging step " + step + " (partition " + partition + ") into " + staging
                                       + ": " + e.getMessage(), e);
            }
        }
    }

    private void copy(Connection connection, Iterator<InternalRow> rows, byte[] prefix) throws Exception {
        CopyIn copy = connection.unwrap(PGConnection.class).getCopyAPI().copyIn(copySql);
        CopyFeeder feeder = new CopyFeeder(copy, "cdc-stage-copy");
        feeder.start();
        ByteArrayOutputStream buffer = new ByteArrayOutputStream(FLUSH_BYTES + 4096);
        try {
            while (rows.hasNext()) {
                buffer.write(prefix);
                rows.next().getUTF8String(0).writeTo(buffer);
                buffer.write('\n');
                if (buffer.size() >= FLUSH_BYTES) {
                    feeder.put(buffer.toByteArray());
                    buffer.reset();
                }
            }
            if (buffer.size() > 0) {
                feeder.put(buffer.toByteArray());
            }
            feeder.finish();
            copy.endCopy();
        }
        finally {
            feeder.interrupt();
            if (copy.isActive()) {
                copy.cancelCopy();
            }
        }
    }
}
