package io.cdcpipeline.runner;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.connect.source.SourceRecord;

import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;

/**
 * Receives batches from the engine into a small bounded queue; while the queue is full the engine's
 * thread waits here, which throttles capture. A popped batch gets an id and stays in flight until
 * Python reports it complete; only then are its records marked processed, which is what lets the
 * engine's offset advance. Batches must be completed in the order they were popped.
 *
 * An engine batch that holds the end of a snapshot and the start of the stream is handed over as two batches, cut
 * where its records stop being the snapshot's: the pipeline applies the snapshot's records, then loads the rows,
 * then the stream, and a batch never straddles that switch. Both halves share the engine's committer, which
 * commits the offset of the records marked so far each time a half is marked complete.
 *
 * The streamed records at the end of an engine batch that share its last record's source offset (two or more: the
 * rows of one PostgreSQL multi-row WAL record, a COPY's, which all carry its LSN) are handed over as a batch of their
 * own, cut from the records before them: the pipeline never ends a group or a run between records of one offset, so
 * a batch that ends inside such a run of records binds it to the next batch; cut there, the batch before them ends
 * where the next record's offset differs, and a COPY's stream can be ended between any two of its WAL records.
 *
 * What the batches queued and in flight hold is bounded by bytes too (`heldBytes`): a batch that would take them
 * past the bound waits in the engine's thread until older batches are complete, unless none is held (a single
 * batch larger than the bound goes through alone). With Debezium's own queue bounded by bytes
 * (`max.queue.size.in.bytes`), a stream of multi-MB values holds a bounded heap whatever the counts allow.
 *
 * An engine batch that ends inside a source transaction whose END marker (`provide.transaction.metadata`) it also
 * holds is cut after that END: a group closes only at a source commit, and only between two batches.
 *
 * A batch of heartbeats only (Debezium's heartbeat topic, and the table its heartbeat writes to, with the BEGIN and
 * END records of that write's transaction) that arrives while
 * no batch is queued or in flight is committed here at once and never handed over: it carries no data, and
 * committing its offset is what confirms a PostgreSQL slot past the WAL of tables the connector does not capture.
 */
final class BatchManager implements DebeziumEngine.ChangeConsumer<RecordChangeEvent<SourceRecord>> {
    private final BlockingQueue<ChangeBatch> queue;
    private final Map<Long, ChangeBatch> inFlight = new LinkedHashMap<>();
    /** Batches in flight whose rows and bytes' hold were let go (`release`). */
    private final Set<Long> released = new java.util.HashSet<>();
    private final EventSerializer serializer = new EventSerializer();
    private final Set<String> heartbeatTopics;
    private final boolean keepRecords;
    private final long heldBytesLimit;
    private volatile boolean stopping;
    /** The engine's thread is in handleBatch: making a batch's rows, or waiting for room. */
    private volatile boolean handing;
    /** The engine's thread waits for the batches held to be let go before it hands the next one over. */
    private volatile boolean waitingForRoom;
    private long heldBytes;
    private long outstanding;
    private long heartbeatsCommitted;
    private long nextSeq = 1;
    private long nextBatchId = 1;
    private long eventsReceived;
    /**
     * Events of the batches in the queue (handed over, not yet fetched): for a moment below zero, between a batch's
     * poll and the count of its offer.
     */
    private long queuedEvents;

    BatchManager(int capacity, Set<String> heartbeatTopics, boolean keepRecords, long heldBytesLimit) {
        this.queue = new ArrayBlockingQueue<>(capacity);
        this.heartbeatTopics = heartbeatTopics;
        this.keepRecords = keepRecords;
        this.heldBytesLimit = heldBytesLimit;
    }

    @Override
    public void handleBatch(List<RecordChangeEvent<SourceRecord>> records,
                            DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer)
            throws InterruptedException {
        if (records.isEmpty()) {
            return;
        }
        handing = true;
        try {
            handOver(records, committer);
        }
        finally {
            handing = false;
        }
    }

    private void handOver(List<RecordChangeEvent<SourceRecord>> records,
                          DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer)
            throws InterruptedException {
        if (heartbeatsOnly(records)) {
            synchronized (this) {
                // Nothing before it waits to be committed: its offset may be committed now, in order.
                if (outstanding == 0) {
                    for (RecordChangeEvent<SourceRecord> record : records) {
                        committer.markProcessed(record);
                    }
                    committer.markBatchFinished();
                    heartbeatsCommitted += records.size();
                    return;
                }
            }
        }
        int cut = snapshotEnd(records);
        if (cut > 0 && cut < records.size()) {
            enqueue(records.subList(0, cut), committer);
            enqueueStreamed(records.subList(cut, records.size()), committer);
        }
        else {
            enqueueStreamed(records, committer);
        }
    }

    private void enqueueStreamed(List<RecordChangeEvent<SourceRecord>> records,
                                 DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer)
            throws InterruptedException {
        int end = afterLastTransactionEnd(records);
        if (end > 0 && end < records.size()) {
            enqueueCut(records.subList(0, end), committer);
            enqueueCut(records.subList(end, records.size()), committer);
        }
        else {
            enqueueCut(records, committer);
        }
    }

    /**
     * The index after the last source transaction's END marker in `records`, or -1 when there is none: an engine
     * batch that ends inside a transaction is cut there, so a group can close at that commit, which falls between
     * two batches.
     */
    static int afterLastTransactionEnd(List<RecordChangeEvent<SourceRecord>> records) {
        for (int i = records.size() - 1; i >= 0; i--) {
            if (EventSerializer.isTransactionEnd(records.get(i).record())) {
                return i + 1;
            }
        }
        return -1;
    }

    private void enqueueCut(List<RecordChangeEvent<SourceRecord>> records,
                            DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer)
            throws InterruptedException {
        int tail = sharedOffsetTail(records);
        if (tail > 0) {
            enqueue(records.subList(0, tail), committer);
            enqueue(records.subList(tail, records.size()), committer);
        }
        else {
            enqueue(records, committer);
        }
    }

    /**
     * The index where the streamed records at the end of `records` that share the last record's source offset begin,
     * when there are two or more of them and other records come before them; else -1.
     */
    static int sharedOffsetTail(List<RecordChangeEvent<SourceRecord>> records) {
        int last = records.size() - 1;
        SourceRecord end = records.get(last).record();
        if (last < 2 || end.sourceOffset() == null || EventSerializer.inSnapshot(end)) {
            return -1;
        }
        int start = last;
        Map<String, ?> offset = EventSerializer.publicOffset(end.sourceOffset());
        while (start > 0 && offset.equals(EventSerializer.publicOffset(records.get(start - 1).record().sourceOffset()))) {
            start--;
        }
        return start > 0 && start < last ? start : -1;
    }

    private void enqueue(List<RecordChangeEvent<SourceRecord>> records,
                         DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer)
            throws InterruptedException {
        synchronized (this) {
            outstanding++;
        }
        ChangeBatch batch = new ChangeBatch(records, committer, serializer, nextSeq, keepRecords);
        nextSeq += records.size();
        synchronized (this) {
            while (!stopping && heldBytesLimit > 0 && heldBytes > 0 && heldBytes + batch.bytes() > heldBytesLimit) {
                waitingForRoom = true;
                wait(200);
            }
            waitingForRoom = false;
            heldBytes += batch.bytes();
        }
        while (!stopping) {
            if (queue.offer(batch, 200, TimeUnit.MILLISECONDS)) {
                synchronized (this) {
                    eventsReceived += batch.size();
                    queuedEvents += batch.size();
                }
                return;
            }
        }
    }

    /** The index of the first streamed record that follows a snapshot's record in `records`, or -1. */
    static int snapshotEnd(List<RecordChangeEvent<SourceRecord>> records) {
        boolean previousInSnapshot = false;
        for (int i = 0; i < records.size(); i++) {
            boolean inSnapshot = EventSerializer.inSnapshot(records.get(i).record());
            if (previousInSnapshot && !inSnapshot) {
                return i;
            }
            previousInSnapshot = inSnapshot;
        }
        return -1;
    }

    @Override
    public boolean supportsTombstoneEvents() {
        return false;
    }

    ChangeBatch poll(long timeoutMs) throws InterruptedException {
        ChangeBatch batch = queue.poll(timeoutMs, TimeUnit.MILLISECONDS);
        if (batch != null) {
            synchronized (this) {
                batch.assignId(nextBatchId++);
                inFlight.put(batch.id(), batch);
                queuedEvents -= batch.size();
            }
        }
        return batch;
    }

    int complete(long batchId) throws InterruptedException {
        ChangeBatch batch;
        synchronized (this) {
            if (!inFlight.containsKey(batchId)) {
                throw new IllegalArgumentException("batch " + batchId + " is not in flight (already complete, or never popped)");
            }
            long oldest = inFlight.keySet().iterator().next();
            if (oldest != batchId) {
                throw new IllegalStateException("batch " + batchId + " completed before the older batch " + oldest);
            }
            batch = inFlight.remove(batchId);
        }
        batch.markProcessed();
        synchronized (this) {
            outstanding--;
            if (!released.remove(batchId)) {
                heldBytes -= batch.bytes();
            }
            notifyAll();
        }
        return batch.size();
    }

    /**
     * Lets go of an in-flight batch's rows and of its bytes' hold, the batch staying in flight (its offset is
     * committed by `complete`, later): the part of a source transaction that spans groups, applied in a destination
     * transaction still open. The engine may then hand over the next batches of that transaction.
     */
    synchronized void release(long batchId) {
        ChangeBatch batch = inFlight.get(batchId);
        if (batch == null) {
            throw new IllegalArgumentException("batch " + batchId + " is not in flight (already complete, or never popped)");
        }
        if (released.add(batchId)) {
            batch.releaseRows();
            heldBytes -= batch.bytes();
            notifyAll();
        }
    }

    /**
     * Whether the records are heartbeats only: of the heartbeat topics, or the BEGIN and END records of the
     * transactions of a heartbeat table's writes (PostgreSQL's), at least one a heartbeat, and the last not a BEGIN
     * (whose changes, in the next batch, may be data).
     */
    private boolean heartbeatsOnly(List<RecordChangeEvent<SourceRecord>> records) {
        boolean heartbeat = false;
        for (RecordChangeEvent<SourceRecord> record : records) {
            if (heartbeatTopics.contains(record.record().topic())) {
                heartbeat = true;
            }
            else if (!EventSerializer.isTransactionMarker(record.record())) {
                return false;
            }
        }
        SourceRecord last = records.get(records.size() - 1).record();
        return heartbeat && !(EventSerializer.isTransactionMarker(last) && !EventSerializer.isTransactionEnd(last));
    }


    synchronized long heartbeatsCommitted() {
        return heartbeatsCommitted;
    }

    void stop() {
        stopping = true;
    }

    /** Whether the engine's thread waits for room: the batches queued and in flight hold the bytes' bound. */
    boolean waitingForRoom() {
        return waitingForRoom;
    }

    /** Whether the engine's thread is handing a batch over now (making its rows, or waiting for room). */
    boolean handingOver() {
        return handing;
    }

    synchronized int inFlightCount() {
        return inFlight.size();
    }

    int queuedCount() {
        return queue.size();
    }

    /** The bytes of the batches queued and in flight (see ChangeBatch#bytes). */
    synchronized long heldBytes() {
        return heldBytes;
    }

    synchronized long eventsReceived() {
        return eventsReceived;
    }

    /**
     * What waits in the runner now, as JSON fields: the batches and events queued (handed over by the engine, not
     * fetched), those in flight (fetched, not complete), their bytes, and the events handed over so far.
     */
    synchronized String queueReport() {
        long inFlightEvents = 0;
        for (ChangeBatch batch : inFlight.values()) {
            inFlightEvents += batch.size();
        }
        return "\"queued_batches\":" + queue.size() + ",\"queued_events\":" + Math.max(0, queuedEvents)
                + ",\"in_flight_batches\":" + inFlight.size() + ",\"in_flight_events\":" + inFlightEvents
                + ",\"held_bytes\":" + heldBytes + ",\"captured_events\":" + eventsReceived
                + ",\"handing_over\":" + handing;
    }
}
