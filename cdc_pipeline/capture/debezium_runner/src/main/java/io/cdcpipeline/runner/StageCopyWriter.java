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
 * Writes the converted rows of a group's streamed steps into staging tables of the destination with COPY, in the
 * executor that computed them, in one Spark job for every step of the group; the driver then merges the staged
 * rows into their tables in the group's own transaction. No row travels through the driver.
 *
 * Each row holds its target (column 0: the index of its step, as text) and the COPY text of the staged columns
 * after the first two (column 1); the writer puts the step's number and the partition index in front. A task
 * writes all its rows in one transaction on a borrowed connection (`ExecutorJdbc.borrow`): for each target it
 * meets, it first takes an advisory lock on (staging table, step, partition) and deletes what an earlier attempt
 * at the same partition wrote, so a retried or speculative attempt replaces those rows, never adds to them. A
 * target's rows need not be contiguous in a partition. All SQL comes from the driver, built with the
 * destination's quoting rules.
 *
 * Each task adds the rows it committed per target to the `staged` accumulator, as "target:rows" (Spark applies a
 * task's update once, whatever its retries), so the driver knows how many rows each merge must find.
 */
public final class StageCopyWriter implements VoidFunction<Iterator<InternalRow>>, Serializable {
    private static final long serialVersionUID = 2L;
    private static final String LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended(?, 0))";
    // Separates the fields of a list the driver hands in one string: PostgreSQL text never holds a NUL.
    private static final String SEPARATOR = "\u0000";

    private final String url;
    private final String user;
    private final String password;
    private final String[] stagings;
    private final long[] steps;
    private final String[] deleteSqls;
    private final String[] copySqls;
    private final CollectionAccumulator<String> staged;

    /**
     * The writer of a group's targets, each given by its staging table's name (the lock's name), its step number
     * (the staged rows' first column), its delete (takes the step and the partition index; deletes an earlier
     * attempt's rows) and its COPY ... FROM STDIN statement; the lists come NUL-separated, in target order.
     */
    public static StageCopyWriter forTargets(CollectionAccumulator<String> staged, String url, String user,
                                             String password, String stagings, String steps, String deleteSqls,
                                             String copySqls) {
        String[] numbers = steps.split(SEPARATOR, -1);
        long[] stepNumbers = new long[numbers.length];
        for (int i = 0; i < numbers.length; i++) {
            stepNumbers[i] = Long.parseLong(numbers[i]);
        }
        return new StageCopyWriter(url, user, password, stagings.split(SEPARATOR, -1), stepNumbers,
                                   deleteSqls.split(SEPARATOR, -1), copySqls.split(SEPARATOR, -1), staged);
    }

    private StageCopyWriter(String url, String user, String password, String[] stagings, long[] steps,
                            String[] deleteSqls, String[] copySqls, CollectionAccumulator<String> staged) {
        if (steps.length != stagings.length || deleteSqls.length != stagings.length
                || copySqls.length != stagings.length) {
            throw new IllegalArgumentException("a staging writer's lists differ in length");
        }
        this.url = url;
        this.user = user;
        this.password = password;
        this.stagings = stagings;
        this.steps = steps;
        this.deleteSqls = deleteSqls;
        this.copySqls = copySqls;
        this.staged = staged;
    }

    /** The rows the tasks committed per target, comma-separated in target order (read once the job ended). */
    public String stagedCounts() {
        long[] counts = new long[stagings.length];
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
        TargetRows targetRows = new TargetRows(rows);
        long[] copied = new long[stagings.length];
        boolean[] started = new boolean[stagings.length];
        Connection connection = ExecutorJdbc.borrow(url, user, password);
        boolean committed = false;
        int target = -1;
        try {
            connection.setAutoCommit(false);
            while (targetRows.hasNext()) {
                target = targetRows.target();
                if (!started[target]) {
                    forgetEarlierAttempt(connection, target, partition);
                    started[target] = true;
                }
                byte[] prefix = (steps[target] + "\t" + partition + "\t").getBytes(StandardCharsets.UTF_8);
                int current = target;
                copied[target] += CopyFeeder.copy(connection, copySqls[target], "cdc-stage-copy", out -> {
                    InternalRow row = targetRows.nextOf(current);
                    if (row == null) {
                        return false;
                    }
                    out.write(prefix);
                    row.getUTF8String(1).writeTo(out);
                    out.write('\n');
                    return true;
                });
            }
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
            String where = target < 0 ? "a staging table" : stagings[target] + " (step " + steps[target] + ")";
            throw new SQLException("staging partition " + partition + " into " + where + ": " + e.getMessage(), e);
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
            if (started[i]) {
                staged.add(i + ":" + copied[i]);
            }
        }
    }

    private void forgetEarlierAttempt(Connection connection, int target, int partition) throws SQLException {
        try (PreparedStatement lock = connection.prepareStatement(LOCK_SQL)) {
            lock.setString(1, stagings[target] + ":" + steps[target] + ":" + partition);
            lock.executeQuery().close();
        }
        try (PreparedStatement delete = connection.prepareStatement(deleteSqls[target])) {
            delete.setLong(1, steps[target]);
            delete.setInt(2, partition);
            delete.executeUpdate();
        }
    }

    /** A partition's rows, one looked at ahead: its target tells where the current COPY ends. */
    private static final class TargetRows {
        private final Iterator<InternalRow> rows;
        private InternalRow ahead;
        private int aheadTarget;

        TargetRows(Iterator<InternalRow> rows) {
            this.rows = rows;
        }

        boolean hasNext() {
            return ahead != null || rows.hasNext();
        }

        int target() {
            look();
            return aheadTarget;
        }

        /** The next row if it belongs to `target`, else null (it stays ahead). */
        InternalRow nextOf(int target) {
            if (!hasNext()) {
                return null;
            }
            look();
            if (aheadTarget != target) {
                return null;
            }
            InternalRow row = ahead;
            ahead = null;
            return row;
        }

        private void look() {
            if (ahead == null) {
                ahead = rows.next();
                aheadTarget = Integer.parseInt(ahead.getUTF8String(0).toString());
            }
        }
    }
}
