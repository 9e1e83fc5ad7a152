package io.cdcpipeline.runner;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.sql.Connection;
import java.sql.SQLException;
import java.util.Iterator;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.TimeUnit;

import org.apache.spark.sql.catalyst.InternalRow;
import org.postgresql.PGConnection;
import org.postgresql.copy.CopyIn;

/**
 * The thread that writes a task's COPY data, a few buffers behind the task's thread: Spark computes the next rows
 * while PostgreSQL reads the last ones.
 */
final class CopyFeeder extends Thread {
    private static final int BUFFERS_IN_FLIGHT = 4;
    private static final int FLUSH_BYTES = 1 << 18;
    private static final byte[] END = new byte[0];

    private final CopyIn copy;
    private final BlockingQueue<byte[]> buffers = new ArrayBlockingQueue<>(BUFFERS_IN_FLIGHT);
    private volatile Throwable failure;

    /** Writes one row's COPY text line into the buffer, or nothing for a row that carries no data. */
    interface RowText {
        void write(InternalRow row, ByteArrayOutputStream out) throws IOException;
    }

    /** Writes the next row's COPY text line into the buffer (or nothing); false when no row is left. */
    interface NextRow {
        boolean write(ByteArrayOutputStream out) throws Exception;
    }

    /**
     * Runs `copySql` (a COPY ... FROM STDIN) on the connection with the text `text` writes for each row, fed by a
     * feeder thread in buffers of about 256 KB; returns the rows COPY took. A failure cancels the COPY.
     */
    static long copyRows(Connection connection, String copySql, String threadName, Iterator<InternalRow> rows,
                         RowText text) throws Exception {
        return copy(connection, copySql, threadName, out -> {
            if (!rows.hasNext()) {
                return false;
            }
            text.write(rows.next(), out);
            return true;
        });
    }

    /** As `copyRows`, with the text `next` writes until it says no row is left. */
    static long copy(Connection connection, String copySql, String threadName, NextRow next) throws Exception {
        CopyIn copy = connection.unwrap(PGConnection.class).getCopyAPI().copyIn(copySql);
        CopyFeeder feeder = new CopyFeeder(copy, threadName);
        feeder.start();
        ByteArrayOutputStream buffer = new ByteArrayOutputStream(FLUSH_BYTES + 4096);
        try {
            while (next.write(buffer)) {
                if (buffer.size() >= FLUSH_BYTES) {
                    feeder.put(buffer.toByteArray());
                    buffer.reset();
                }
            }
            if (buffer.size() > 0) {
                feeder.put(buffer.toByteArray());
            }
            feeder.finish();
            return copy.endCopy();
        }
        finally {
            feeder.interrupt();
            if (copy.isActive()) {
                copy.cancelCopy();
            }
        }
    }

    CopyFeeder(CopyIn copy, String name) {
        super(name);
        setDaemon(true);
        this.copy = copy;
    }

    @Override
    public void run() {
        try {
            for (byte[] bytes = buffers.take(); bytes != END; bytes = buffers.take()) {
                copy.writeToCopy(bytes, 0, bytes.length);
            }
        }
        catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        catch (Throwable e) {
            failure = e;
        }
    }

    void put(byte[] bytes) throws Exception {
        while (!buffers.offer(bytes, 100, TimeUnit.MILLISECONDS)) {
            rethrow();
        }
        rethrow();
    }

    void finish() throws Exception {
        put(END);
        join();
        rethrow();
    }

    private void rethrow() throws Exception {
        Throwable error = failure;
        if (error instanceof Exception) {
            throw (Exception) error;
        }
        if (error != null) {
            throw new SQLException(error);
        }
        if (!isAlive() && !buffers.isEmpty() && buffers.peek() != END) {
            throw new SQLException("the COPY thread ended early");
        }
    }
}
