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
import org.apache.spark.util.CollectionAccumulator;

/**
 * Writes the converted rows of a group's streamed steps into the connector's staging table in the destination with
 * one COPY per Spark task, in the executor that computed them; the driver then merges the staged rows into their
 * tables in the group's own transaction. No row travels through the driver.
 *
 * Each row holds its target (column 0: the index of its step in the group, as text) and the COPY text of the
 * staged columns after the first two (column 1); the writer puts the step's number and the partition index in
 * front. A task writes its rows in one transaction on a borrowed connection (`ExecutorJdbc.borrow`): it first takes
 * an advisory lock on (staging table, group, partition) and deletes what an earlier attempt at the same partition
 * wrote for the group's steps, so a retried or speculative attempt replaces those rows, never adds to them. All SQL
 * comes from the driver, built with the destination's quoting rules.
 *
 * Each task adds the rows it committed per target to the `staged` accumulator, as "target:rows" (Spark applies a
 * task's update once, whatever its retries), so the driver knows how many rows each merge must find.
 */
public final class StageCopyWriter implements VoidFunction<Iterator<InternalRow>>, Serializable {
    private static final long serialVersionUID = 3L;
    private static final String LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended(?, 0))";
    // Separates the step numbers the driver hands in one string.
    private static final String SEPARATOR = ",";

    private final String url;
    private final String user;
    private final String password;
    private final String staging;
    private final long[] steps;
    private final String deleteSql;
    private final String copySql;
    private final CollectionAccumulator<String> staged;

    /**
     * @param staging   the staging table's name, as the lock's name
     * @param steps     each target's step number (the staged rows' first column), comma-separated, in target order
     * @param deleteSql takes the group's first and last step numbers and the partition index; deletes an earlier
     *                  attempt's rows
     * @param copySql   the COPY ... FROM STDIN statement
     * @param staged    counts the rows the tasks committed per target
     */
    public StageCopyWriter(CollectionAccumulator<String> staged, String url, String user, String password,
                           String staging, String steps, String deleteSql, String copySql) {
        String[] numbers = steps.split(SEPARATOR, -1);
        this.steps = new long[numbers.length];
        for (int i = 0; i < numbers.length; i++) {
            this.steps[i] = Long.parseLong(numbers[i]);
        }
        this.url = url;
        this.user = user;
        this.password = password;
        this.staging = staging;
        this.deleteSql = deleteSql;
        this.copySql = copySql;
        this.staged = staged;
    }

    /** The rows the tasks committed per target, comma-separated in target order (read once the job ended). */
    public String stagedCounts() {
        long[] counts = new long[steps.length];
        for (String update : staged.value()) {
            int colon = update.indexOf(':');
            counts[Integer.parseInt(update.substring(0, colon))] += Long.parseLong(update.substring(colon + 1));
        }
        StringBuilder text = new StringBuilder();
        for (int i = 0; i < counts.length; i++) {
            if (i > 0) {
                text.append(',');
            }
            text.append(counts[i]);
        }
        return text.toString();
    }

    @Override
    public void call(Iterator<InternalRow> rows) throws Exception {
        if (!rows.hasNext()) {
            return;
        }
        int partition = TaskContext.getPartitionId();
        long first = steps[0];
        long last = steps[steps.length - 1];
        long[] copied = new long[steps.length];
        byte[][] prefixes = new byte[steps.length][];
        for (int i = 0; i < steps.length; i++) {
            prefixes[i] = (steps[i] + "\t" + partition + "\t").getBytes(StandardCharsets.UTF_8);
        }
        Connection connection = ExecutorJdbc.borrow(url, user, password);
        boolean committed = false;
        try {
            connection.setAutoCommit(false);
            try (PreparedStatement lock = connection.prepareStatement(LOCK_SQL)) {
                lock.setString(1, staging + ":" + first + ":" + partition);
                lock.executeQuery().close();
            }
            try (PreparedStatement delete = connection.prepareStatement(deleteSql)) {
                delete.setLong(1, first);
                delete.setLong(2, last);
                delete.setInt(3, partition);
                delete.executeUpdate();
            }
            CopyFeeder.copyRows(connection, copySql, "cdc-stage-copy", rows, (row, out) -> {
                int target = Integer.parseInt(row.getUTF8String(0).toString());
                copied[target]++;
                out.write(prefixes[target]);
                row.getUTF8String(1).writeTo(out);
                out.write('\n');
            });
            connection.commit();
            committed = true;
        }
        catch (Exception e) {
            try {
                connection.rollback();
            }
            catch (SQLException ignored) {
                // The connection is closed below; the task fails with the first error.
            }
            throw new SQLException("staging partition " + partition + " of steps " + first + ".." + last + " into "
                                   + staging + ": " + e.getMessage(), e);
        }
        finally {
            if (committed) {
                ExecutorJdbc.giveBack(url, user, connection);
            }
            else {
                connection.close();
            }
        }
        for (int i = 0; i < copied.length; i++) {
            if (copied[i] > 0) {
                staged.add(i + ":" + copied[i]);
            }
        }
    }
}
