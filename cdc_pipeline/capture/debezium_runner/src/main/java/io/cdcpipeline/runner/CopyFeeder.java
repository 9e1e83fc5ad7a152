package io.cdcpipeline.runner;

import java.sql.SQLException;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.TimeUnit;

import org.postgresql.copy.CopyIn;

/**
 * The thread that writes a task's COPY data, a few buffers behind the task's thread: Spark computes the next rows
 * while PostgreSQL reads the last ones.
 */
final class CopyFeeder extends Thread {
    private static final int BUFFERS_IN_FLIGHT = 4;
    private static final byte[] END = new byte[0];

    private final CopyIn copy;
    private final BlockingQueue<byte[]> buffers = new ArrayBlockingQueue<>(BUFFERS_IN_FLIGHT);
    private volatile Throwable failure;

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
