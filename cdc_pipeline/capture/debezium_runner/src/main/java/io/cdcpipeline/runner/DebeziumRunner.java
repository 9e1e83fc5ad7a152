package io.cdcpipeline.runner;

import java.lang.management.ManagementFactory;
import java.lang.management.MemoryMXBean;
import java.lang.management.MemoryUsage;

import javax.management.MBeanServer;
import javax.management.ObjectName;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.connect.source.SourceRecord;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.ObjectMapper;

import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.embedded.Connect;
import io.debezium.embedded.async.ConvertingAsyncEngineBuilderFactory;
import io.debezium.engine.format.ChangeEventFormat;

/**
 * The controller and emitter of one embedded Debezium engine: start and stop it, report its state and
 * last error, pop batches of change events ({@link #getChangeEvents}) and mark them complete
 * ({@link #markBatchComplete}) once their changes are committed in the destination.
 */
public final class DebeziumRunner {
    private static final Logger LOGGER = LoggerFactory.getLogger(DebeziumRunner.class);
    private static final MBeanServer MBEANS = ManagementFactory.getPlatformMBeanServer();
    private static final ObjectMapper JSON = new ObjectMapper();

    private final RunnerParameters parameters;
    private final BatchManager batches;
    private DebeziumEngine<RecordChangeEvent<SourceRecord>> engine;
    private ExecutorService engineThread;
    private volatile String state = "CREATED";
    private volatile String lastError;
    private volatile boolean polling;
    /** The source offset of the last record handed over to the runner, heartbeats included (null before any). */
    private volatile Map<String, ?> receivedOffset;

    public DebeziumRunner(RunnerParameters parameters) {
        this.parameters = parameters;
        this.batches = new BatchManager(parameters.queueCapacity(), parameters.heartbeatTopics(), parameters.keepRecords(),
                                        parameters.heldBytes());
    }

    public synchronized void start() {
        if (engine != null) {
            throw new IllegalStateException("the engine was already started");
        }
        LOGGER.info("Starting Debezium engine {} with {}", parameters.get("name"), parameters.describe());
        state = "STARTING";
        // An engine of the same connector run before in this JVM (a served run) left its account behind.
        TaskPolls.forget(parameters.get("topic.prefix"));
        engine = new ConvertingAsyncEngineBuilderFactory().builder(ChangeEventFormat.of(Connect.class))
                .using(parameters.toProperties())
                .using(new DebeziumEngine.ConnectorCallback() {
                    @Override
                    public void pollingStarted() {
                        polling = true;
                        state = "RUNNING";
                    }

                    @Override
                    public void pollingStopped() {
                        polling = false;
                    }
                })
                .using((success, message, error) -> {
                    if (!success) {
                        lastError = describe(message, error);
                        state = "FAILED";
                        LOGGER.error("Debezium engine {} failed: {}", parameters.get("name"), lastError);
                    }
                    else if (!"FAILED".equals(state)) {
                        state = "STOPPED";
                    }
                })
                .notifying(new DebeziumEngine.ChangeConsumer<RecordChangeEvent<SourceRecord>>() {
                    @Override
                    public void handleBatch(List<RecordChangeEvent<SourceRecord>> records,
                                            DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer)
                            throws InterruptedException {
                        batches.handleBatch(records, committer);
                        if (!records.isEmpty()) {
                            receivedOffset = EventSerializer.publicOffset(
                                    records.get(records.size() - 1).record().sourceOffset());
                        }
                    }

                    @Override
                    public boolean supportsTombstoneEvents() {
                        return batches.supportsTombstoneEvents();
                    }
                })
                .build();
        engineThread = Executors.newSingleThreadExecutor(task -> {
            Thread thread = new Thread(task, "cdc-debezium-" + parameters.get("name"));
            thread.setDaemon(true);
            return thread;
        });
        engineThread.execute(engine);
    }

    /** Pops the next batch, waiting at most timeoutMs; null when none arrived in time. */
    public ChangeBatch getChangeEvents(long timeoutMs) throws InterruptedException {
        return batches.poll(timeoutMs);
    }

    /** Marks every record of the batch processed, so the engine's offset moves past it. */
    public int markBatchComplete(long batchId) throws InterruptedException {
        return batches.complete(batchId);
    }

    /**
     * Lets go of an applied batch's rows and of its bytes' hold while it stays in flight, not complete: a part of a
     * source transaction whose destination transaction spans groups and is committed with a later batch.
     */
    public void releaseBatch(long batchId) {
        batches.release(batchId);
    }

    public synchronized void stop(long timeoutMs) throws Exception {
        batches.stop();
        if (engine == null) {
            return;
        }
        try {
            engine.close();
        }
        finally {
            engineThread.shutdown();
            if (!engineThread.awaitTermination(timeoutMs, TimeUnit.MILLISECONDS)) {
                LOGGER.warn("Debezium engine {} did not stop within {} ms", parameters.get("name"), timeoutMs);
                engineThread.shutdownNow();
            }
            if (!"FAILED".equals(state)) {
                state = "STOPPED";
            }
            engine = null;
        }
    }

    /** CREATED, STARTING, RUNNING, STOPPED or FAILED. */
    public String state() {
        return state;
    }

    public boolean isPolling() {
        return polling;
    }

    /**
     * True once the connector's streaming phase is connected to the source (Debezium's streaming metric
     * "Connected"); until then a quiet source means "not there yet", not "idle".
     */
    public boolean isStreaming() {
        try {
            ObjectName name = metricsName("streaming", "Connected");
            return name != null && Boolean.TRUE.equals(MBEANS.getAttribute(name, "Connected"));
        }
        catch (Exception e) {
            LOGGER.debug("Cannot read the streaming metrics of {}", parameters.get("topic.prefix"), e);
            return false;
        }
    }

    /**
     * Debezium's snapshot metrics of this engine as JSON ({"running":..,"completed":..,"aborted":..}; {} before
     * they exist): a snapshot mode without streaming ends its cycle once the snapshot is done.
     */
    public String snapshotStatus() {
        try {
            ObjectName name = metricsName("snapshot", "SnapshotCompleted");
            if (name == null) {
                return "{}";
            }
            return "{\"running\":" + Boolean.TRUE.equals(MBEANS.getAttribute(name, "SnapshotRunning"))
                    + ",\"completed\":" + Boolean.TRUE.equals(MBEANS.getAttribute(name, "SnapshotCompleted"))
                    + ",\"aborted\":" + Boolean.TRUE.equals(MBEANS.getAttribute(name, "SnapshotAborted")) + "}";
        }
        catch (Exception e) {
            LOGGER.debug("Cannot read the snapshot metrics of {}", parameters.get("topic.prefix"), e);
            return "{}";
        }
    }

    /**
     * Where the engine's log reader is now, as JSON ({"file":..,"pos":..} of a binlog connector's client: the
     * position after the last event it handed to Debezium's queue, captured or not; {} when unknown).
     */
    public String readPosition() {
        try {
            ObjectName name = metricsName("streaming", "BinlogFilename");
            if (name == null) {
                return "{}";
            }
            Object file = MBEANS.getAttribute(name, "BinlogFilename");
            Object position = MBEANS.getAttribute(name, "BinlogPosition");
            if (file == null || position == null || ((Number) position).longValue() <= 0) {
                return "{}";
            }
            return "{\"file\":\"" + file.toString().replace("\\", "\\\\").replace("\"", "\\\"") + "\",\"pos\":"
                    + ((Number) position).longValue() + "}";
        }
        catch (Exception e) {
            LOGGER.debug("Cannot read the log reader's position of {}", parameters.get("topic.prefix"), e);
            return "{}";
        }
    }

    /**
     * Whether Debezium's own queue (between its source task and this runner) is empty, by its streaming metrics;
     * false when they cannot be read.
     */
    public boolean engineQueueEmpty() {
        try {
            ObjectName name = metricsName("streaming", "QueueRemainingCapacity");
            if (name == null) {
                return false;
            }
            Object remaining = MBEANS.getAttribute(name, "QueueRemainingCapacity");
            Object total = MBEANS.getAttribute(name, "QueueTotalCapacity");
            return remaining != null && total != null
                    && ((Number) remaining).longValue() == ((Number) total).longValue();
        }
        catch (Exception e) {
            LOGGER.debug("Cannot read the queue metrics of {}", parameters.get("topic.prefix"), e);
            return false;
        }
    }

    /**
     * Whether nothing the engine read is on its way to the runner: Debezium's queue and the runner's empty, no batch
     * being handed over, and, for a source whose task accounts for its polls (`TaskPolls`: MariaDB, MySQL), the task
     * inside one poll that has returned nothing, before and after the queue was seen empty. Records polled before that
     * poll were handed over (the engine polls again only then); without it, records the engine holds while it converts
     * them are in neither queue. Read in that order, so that a record read from the source before the call is seen in
     * one of the places it passes through.
     */
    public boolean drained() {
        TaskPolls polls = TaskPolls.of(parameters.get("topic.prefix"));
        long entered = polls == null ? 0 : polls.polls();
        if (polls != null && !polls.waiting()) {
            return false;
        }
        if (!engineQueueEmpty()) {
            return false;
        }
        if (polls != null && !(polls.waiting() && polls.polls() == entered)) {
            return false;
        }
        return !batches.handingOver() && batches.queuedCount() == 0;
    }

    /** The attributes of Debezium's ChangeEventQueue in its connector metrics (`QueueMetricsMXBean`). */
    private static final String[] ENGINE_QUEUE_ATTRIBUTES = {
        "QueueTotalCapacity", "QueueRemainingCapacity", "MaxQueueSizeInBytes", "CurrentQueueSizeInBytes"};

    /**
     * What waits where now, as one JSON object: Debezium's own queue (its events and bytes against their bounds, by
     * the connector-metrics MBean of the streaming context, else the snapshot's: both read the one queue; null before
     * the connector registers them), and the runner's (`BatchManager#queueReport`). A sample costs one MBean look-up
     * and one read of four attributes: Python polls it every few seconds, nothing is counted per event for it.
     */
    public String progress() {
        return "{\"engine_queue\":" + engineQueueReport() + "," + batches.queueReport() + "}";
    }

    private String engineQueueReport() {
        try {
            ObjectName name = metricsName("streaming", "QueueTotalCapacity");
            name = name != null ? name : metricsName("snapshot", "QueueTotalCapacity");
            if (name == null) {
                return "null";
            }
            Map<String, Long> values = new java.util.HashMap<>();
            for (javax.management.Attribute attribute : MBEANS.getAttributes(name, ENGINE_QUEUE_ATTRIBUTES).asList()) {
                values.put(attribute.getName(), ((Number) attribute.getValue()).longValue());
            }
            long total = values.getOrDefault("QueueTotalCapacity", 0L);
            return "{\"events\":" + (total - values.getOrDefault("QueueRemainingCapacity", total))
                    + ",\"capacity\":" + total + ",\"bytes\":" + values.getOrDefault("CurrentQueueSizeInBytes", 0L)
                    + ",\"max_bytes\":" + values.getOrDefault("MaxQueueSizeInBytes", 0L)
                    + ",\"mbean\":" + JSON.writeValueAsString(name.toString()) + "}";
        }
        catch (Exception e) {
            LOGGER.debug("Cannot read the queue metrics of {}", parameters.get("topic.prefix"), e);
            return "null";
        }
    }

    /**
     * The name of this engine's Debezium connector-metrics MBean of a context ("snapshot", "streaming") that has the
     * attribute, or null. A connector of several databases (SQL Server's `database.names`) registers the task's
     * metrics and one MBean per database (a `database` key) beside them, and the attributes are split between them
     * ("Connected" and the queue's are the task's): the task's is asked first, then each database's.
     */
    private ObjectName metricsName(String context, String attribute) throws Exception {
        String topicPrefix = parameters.get("topic.prefix");
        ObjectName found = null;
        for (ObjectName name : MBEANS.queryNames(new ObjectName("debezium.*:type=connector-metrics,context=" + context + ",*"), null)) {
            if (!topicPrefix.equals(name.getKeyProperty("server")) || !hasAttribute(name, attribute)) {
                continue;
            }
            if (name.getKeyProperty("database") == null) {
                return name;
            }
            found = found == null ? name : found;
        }
        return found;
    }

    private static boolean hasAttribute(ObjectName name, String attribute) {
        try {
            for (javax.management.MBeanAttributeInfo info : MBEANS.getMBeanInfo(name).getAttributes()) {
                if (info.getName().equals(attribute)) {
                    return true;
                }
            }
        }
        catch (Exception e) {
            LOGGER.debug("Cannot read the attributes of {}", name, e);
        }
        return false;
    }

    public String lastError() {
        return lastError;
    }

    /** Whether the engine's thread waits for the batches held (queued, in flight) to be let go (`releaseBatch`). */
    public boolean waitingForRoom() {
        return batches.waitingForRoom();
    }

    /**
     * The source offset of the last record handed over to the runner, heartbeats included, as JSON ("null" before
     * any). Set once its batch is queued (or, heartbeats alone, committed): every record before it is queued, in
     * flight or applied. A PostgreSQL run reads in it that Debezium has decoded the WAL up to a position.
     */
    public String receivedOffset() {
        try {
            return JSON.writeValueAsString(receivedOffset);
        }
        catch (JsonProcessingException e) {
            throw new IllegalStateException("cannot write the received offset " + receivedOffset + " as JSON", e);
        }
    }

    public int queuedBatches() {
        return batches.queuedCount();
    }

    public int inFlightBatches() {
        return batches.inFlightCount();
    }

    public long eventsReceived() {
        return batches.eventsReceived();
    }

    /** The bytes of the batches queued and in flight (bounded by the runner's held bytes). */
    public long heldBytes() {
        return batches.heldBytes();
    }

    /** Heap and non-heap use of this JVM, as JSON. */
    public String memoryReport() {
        MemoryMXBean memory = ManagementFactory.getMemoryMXBean();
        MemoryUsage heap = memory.getHeapMemoryUsage();
        MemoryUsage nonHeap = memory.getNonHeapMemoryUsage();
        return "{\"heap_used\":" + heap.getUsed() + ",\"heap_committed\":" + heap.getCommitted()
                + ",\"heap_max\":" + heap.getMax() + ",\"non_heap_used\":" + nonHeap.getUsed()
                + ",\"non_heap_committed\":" + nonHeap.getCommitted() + "}";
    }

    private static String describe(String message, Throwable error) {
        StringBuilder text = new StringBuilder(message == null ? "engine failed" : message);
        Throwable cause = error;
        int depth = 0;
        while (cause != null && depth++ < 8) {
            String causeText = cause.getClass().getName() + ": " + cause.getMessage();
            if (text.indexOf(String.valueOf(cause.getMessage())) < 0) {
                text.append(" | caused by ").append(causeText);
            }
            cause = cause.getCause();
        }
        return text.toString();
    }
}
