package io.cdcpipeline.runner;

import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.util.Iterator;

import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.VoidFunction;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.util.LongAccumulator;

/**
 * Writes the converted rows of one streamed step into a staging table of the destination with COPY, one Spark
 * partition per task, in the executor that computed them; the driver then merges the staged rows into their table
 * in the batch's own transaction. No row travels through the driver.
 *
 * Each row's column 0 is the COPY text of the staged columns after the first two; the writer puts the step and the
 * partition index in front. A task's transaction first takes an advisory lock on (staging table, step, partition)
 * and deletes what an earlier attempt at the same partition wrote: a retried or speculative attempt replaces those
 * rows, never adds to them. All SQL comes from the driver, built with the destination's quoting rules.
 *
 * Each task adds the rows it committed to the `staged` accumulator (Spark applies a task's update once, whatever
 * its retries), so the driver knows how many rows its merge must find.
 */
public final class StageCopyWriter implements VoidFunction<Iterator<InternalRow>>, Serializable {
    private static final long serialVersionUID = 1L;
    private static final String LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended(?, 0))";

    private final String url;
    private final String user;
    private final String password;
    private final String staging;
    private final long step;
    private final String deleteSql;
    private final String copySql;
    private final LongAccumulator staged;

    /**
     * @param staging   the staging table's name, as the lock's name
     * @param step      the step's number in the staging table (its first column)
     * @param deleteSql takes the step and the partition index; deletes an earlier attempt's rows
     * @param copySql   the COPY ... FROM STDIN statement
     * @param staged    counts the rows the tasks committed
     */
    public StageCopyWriter(String url, String user, String password, String staging, long step, String deleteSql,
                           String copySql, LongAccumulator staged) {
        this.url = url;
        this.user = user;
        this.password = password;
        this.staging = staging;
        this.step = step;
        this.deleteSql = deleteSql;
        this.copySql = copySql;
        this.staged = staged;
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
                byte[] prefix = (step + "\t" + partition + "\t").getBytes(StandardCharsets.UTF_8);
                long copied = CopyFeeder.copyRows(connection, copySql, "cdc-stage-copy", rows, (row, out) -> {
                    out.write(prefix);
                    row.getUTF8String(0).writeTo(out);
                    out.write('\n');
                });
                connection.commit();
                staged.add(copied);
            }
            catch (Exception e) {
                connection.rollback();
                throw new SQLException("staging step " + step + " (partition " + partition + ") into " + staging
                                       + ": " + e.getMessage(), e);
            }
        }
    }
}
