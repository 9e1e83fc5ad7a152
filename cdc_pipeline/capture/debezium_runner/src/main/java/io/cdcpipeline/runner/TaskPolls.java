package io.cdcpipeline.runner;

import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.connect.source.SourceRecord;

/**
 * Where an engine's source task stands between Debezium's queue and the runner: waiting on the queue inside a
 * poll, or holding records it took from the queue and has not handed over yet. Debezium's engine polls its task,
 * converts the records and calls `BatchManager#handleBatch`, then polls again, one after the other; while it
 * converts, both queues are empty and no batch is being handed over, and a loaded machine can hold it there for
 * seconds. A run that read the source's log up to a position then looked idle, and ended before the changes that
 * lead up to that position reached it (`DebeziumRunner#drained`).
 *
 * One per topic prefix (a connector), registered by the task when it starts; the binlog connectors' tasks
 * (`MariaDbRunnerConnector`, `MySqlRunnerConnector`) report to it.
 */
final class TaskPolls {

    /** Test only: milliseconds the task waits after a poll that returned records, as a loaded machine can. */
    static final String SLOW_HANDOVER_ENV = "CDC_PIPELINE_FAULT_SLOW_HANDOVER_MS";

    private static final Map<String, TaskPolls> BY_PREFIX = new ConcurrentHashMap<>();
    private static final long SLOW_HANDOVER_MS = slowHandoverMs();

    private final AtomicLong polls = new AtomicLong();
    private volatile boolean waiting;

    /** The task of this topic prefix starts: a new account (a served JVM runs one engine after the other). */
    static TaskPolls started(String topicPrefix) {
        TaskPolls polls = new TaskPolls();
        BY_PREFIX.put(topicPrefix, polls);
        return polls;
    }

    /** Drops the account of the task of this topic prefix (its engine is gone). */
    static void forget(String topicPrefix) {
        BY_PREFIX.remove(topicPrefix);
    }

    /** The account of the task of this topic prefix, or null for a source whose task keeps none. */
    static TaskPolls of(String topicPrefix) {
        return BY_PREFIX.get(topicPrefix);
    }

    /** A task's own poll (Debezium's `doPoll`). */
    interface Poll {
        List<SourceRecord> records() throws InterruptedException;
    }

    /**
     * Runs the task's poll, accounted for: entering it, every record polled before was handed over (the engine polls
     * only then); once it returns records, they are on their way to the runner until the engine polls again.
     */
    List<SourceRecord> poll(Poll poll) throws InterruptedException {
        polls.incrementAndGet();
        waiting = true;
        List<SourceRecord> records = poll.records();
        if (records != null && !records.isEmpty()) {
            waiting = false;
            if (SLOW_HANDOVER_MS > 0) {
                Thread.sleep(SLOW_HANDOVER_MS);
            }
        }
        return records;
    }

    /** The number of polls the task entered. */
    long polls() {
        return polls.get();
    }

    /** Whether the task is inside a poll that has not returned records. */
    boolean waiting() {
        return waiting;
    }

    private static long slowHandoverMs() {
        String value = System.getenv(SLOW_HANDOVER_ENV);
        return value == null || value.isBlank() ? 0 : Long.parseLong(value.trim());
    }
}
