package io.cdcpipeline.runner;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.sql.Connection;
import java.sql.SQLException;
import java.util.Arrays;
import java.util.Iterator;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.TimeUnit;

import org.apache.spark.sql.catalyst.InternalRow;
import org.postgresql.PGConnection;
import org.postgresql.copy.CopyIn;

/**
 * The thread that writes a task's COPY data, a few buffers behind the task's thread: Spark computes the next rows
 * while PostgreSQL reads the last ones. The text is handed over in pieces of 256 KB as it is written, a row's value of
 * many MB too: the task's copy holds a few pieces, never a whole row's text.
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
     * feeder thread in buffers of 256 KB; returns the rows COPY took. A failure cancels the COPY.
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
        Pieces buffer = new Pieces(feeder);
        try {
            while (next.write(buffer)) {
                // Each full piece is handed over as it is written.
            }
            buffer.handOver();
            feeder.finish();
            return copy.endCopy();
        }
        catch (Pieces.HandOverFailure e) {
            throw e.failure;
        }
        finally {
            feeder.interrupt();
            if (copy.isActive()) {
                copy.cancelCopy();
            }
        }
    }

    /** The task's COPY text, handed to the feeder in pieces of FLUSH_BYTES as it is written. */
    private static final class Pieces extends ByteArrayOutputStream {
        private final CopyFeeder feeder;

        Pieces(CopyFeeder feeder) {
            super(FLUSH_BYTES);
            this.feeder = feeder;
        }

        @Override
        public synchronized void write(int b) {
            super.write(b);
            if (count >= FLUSH_BYTES) {
                handOver();
            }
        }

        @Override
        public synchronized void write(byte[] bytes, int offset, int length) {
            while (length > 0) {
                int n = Math.min(length, FLUSH_BYTES - count);
                super.write(bytes, offset, n);
                offset += n;
                length -= n;
                if (count >= FLUSH_BYTES) {
                    handOver();
                }
            }
        }

        /** Hands what was written to the feeder (the full array itself, no copy), and starts a new piece. */
        void handOver() {
            if (count == 0) {
                return;
            }
            byte[] piece = count == buf.length ? buf : Arrays.copyOf(buf, count);
            try {
                feeder.put(piece);
            }
            catch (Exception e) {
                throw new HandOverFailure(e);
            }
            buf = piece == buf ? new byte[FLUSH_BYTES] : buf;
            count = 0;
        }

        /** The feeder's failure (or an interrupt), carried out of an OutputStream's write. */
        static final class HandOverFailure extends RuntimeException {
            private static final long serialVersionUID = 1L;
            final Exception failure;

            HandOverFailure(Exception failure) {
                super(failure);
                this.failure = failure;
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
