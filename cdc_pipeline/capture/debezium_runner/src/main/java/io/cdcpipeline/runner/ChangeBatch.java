package io.cdcpipeline.runner;

import java.io.IOException;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.kafka.connect.data.Field;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.types.StructType;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;

/**
 * One batch handed over by the engine: its records and their committer (kept until the batch is complete),
 * and the rows Spark reads of its data changes, with the value schemas they refer to.
 *
 * Without `keepRecords` the batch keeps, of its records, only the last of each source partition: marking that one
 * processed leaves the engine's offset where marking every record would (the offset writer and the task keep the
 * last offset given per partition), and keeps it without its row images, which may hold megabytes (the committer
 * reads its source partition and offset only). The records in flight (the engine's queue, the runner's and the groups run
 * ahead: about 100,000 events of a backlog) are then their rows and index alone, which the collector copies far
 * faster than the records' trees of objects. An event's whole line (`line`, `lines`) needs the records: it is
 * only asked for a dead letter, under the `skip` error strategy, which keeps them.
 */
public final class ChangeBatch {
    private static final String[] IMAGES = {"before", "after"};
    /** The records (with `keepRecords`), or the last record of each source partition, in order. */
    private final List<RecordChangeEvent<SourceRecord>> records;
    private final boolean keepRecords;
    private final int size;
    private final DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer;
    private final EventSerializer serializer;
    private final long firstSeq;
    /** Emptied once the pipeline let go of them before the batch is complete (`releaseRows`). */
    private volatile List<UnsafeRow> dataRows;
    /** The index entries of the events, as one JSON array in the same order (see EventSerializer#indexEntry). */
    private final String index;
    /** A JSON object from schema id to the value schema, for the ids these events use. */
    private final String schemas;
    /** The source offset of the last record, as JSON: where the engine resumes once this batch is complete. */
    private final String lastOffset;
    private final String lastPartition;
    /** About what the batch holds in memory (see {@link #bytes}). */
    private final long bytes;
    private volatile long id = -1;

    ChangeBatch(List<RecordChangeEvent<SourceRecord>> records,
                DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer,
                EventSerializer serializer, long firstSeq, boolean keepRecords) {
        this.keepRecords = keepRecords;
        this.size = records.size();
        this.records = keepRecords ? new ArrayList<>(records) : lastOfEachPartition(records);
        this.committer = committer;
        this.serializer = serializer;
        this.firstSeq = firstSeq;
        List<UnsafeRow> data = new ArrayList<>(records.size());
        StringBuilder indexJson = new StringBuilder(records.size() * 256).append('[');
        Set<String> schemaIds = new LinkedHashSet<>();
        long seq = firstSeq;
        long rowBytes = 0;
        SourceRecord last = null;
        for (RecordChangeEvent<SourceRecord> event : records) {
            SourceRecord record = event.record();
            if (indexJson.length() > 1) {
                indexJson.append(',');
            }
            ObjectNode entry = serializer.indexEntry(seq, record);
            indexJson.append(entry.toString());
            JsonNode schemaId = entry.get("schema");
            if (schemaId != null) {
                schemaIds.add(schemaId.asText());
            }
            if (EventSerializer.KIND_DATA_CHANGE.equals(entry.path("kind").asText())) {
                UnsafeRow row = serializer.dataRow(seq, record);
                rowBytes += row.getSizeInBytes();
                data.add(row);
            }
            seq++;
            last = record;
        }
        StringBuilder schemaJson = new StringBuilder("{");
        for (String id : schemaIds) {
            if (schemaJson.length() > 1) {
                schemaJson.append(',');
            }
            schemaJson.append('"').append(id).append("\":").append(serializer.schemaJson(id));
        }
        this.schemas = schemaJson.append('}').toString();
        this.dataRows = Collections.unmodifiableList(data);
        this.index = indexJson.append(']').toString();
        // Records kept whole weigh about what their rows do.
        this.bytes = rowBytes * (keepRecords ? 2 : 1) + index.length() + schemas.length();
        this.lastOffset = last == null ? "null" : serializer.json(EventSerializer.publicOffset(last.sourceOffset()));
        this.lastPartition = last == null ? "null" : serializer.json(last.sourcePartition());
        if (!keepRecords) {
            dropImages(this.records);
        }
    }

    private static List<RecordChangeEvent<SourceRecord>> lastOfEachPartition(
            List<RecordChangeEvent<SourceRecord>> records) {
        Map<Map<String, ?>, RecordChangeEvent<SourceRecord>> last = new LinkedHashMap<>();
        for (RecordChangeEvent<SourceRecord> event : records) {
            Map<String, ?> partition = event.record().sourcePartition();
            last.remove(partition);
            last.put(partition, event);
        }
        return new ArrayList<>(last.values());
    }

    /**
     * Drops the row images of the records kept without `keepRecords` (once their rows are made): the committer needs
     * a record's source partition and offset only, and an image may hold megabytes.
     */
    private static void dropImages(List<RecordChangeEvent<SourceRecord>> kept) {
        for (RecordChangeEvent<SourceRecord> event : kept) {
            Object value = event.record().value();
            if (!(value instanceof Struct)) {
                continue;
            }
            Struct struct = (Struct) value;
            for (String image : IMAGES) {
                Field field = struct.schema().field(image);
                if (field != null && field.schema().isOptional()) {
                    struct.put(field, null);
                }
            }
        }
    }

    public long id() {
        return id;
    }

    void assignId(long batchId) {
        this.id = batchId;
    }

    public int size() {
        return size;
    }

    /**
     * About what the batch holds in memory: its rows' bytes (twice as much when it keeps its records) and its
     * index's and schemas' characters.
     */
    public long bytes() {
        return bytes;
    }

    /**
     * The events as whole JSON lines ({seq, topic, schema, key, value, partition, offset}), in source order; only
     * of a batch that keeps its records.
     */
    public List<String> lines() {
        if (!keepRecords) {
            throw new IllegalStateException("batch " + id + " keeps no records (" + RunnerParameters.KEEP_RECORDS
                    + " is false): its events' whole lines are gone");
        }
        List<String> out = new ArrayList<>(records.size());
        for (int i = 0; i < records.size(); i++) {
            out.add(serializer.line(firstSeq + i, records.get(i).record()));
        }
        return out;
    }

    /** The whole JSON line of the event `seq`, or null when it is not in this batch or the batch keeps no records. */
    public String line(long seq) {
        long position = seq - firstSeq;
        if (!keepRecords || position < 0 || position >= records.size()) {
            return null;
        }
        return serializer.line(seq, records.get((int) position).record());
    }

    /**
     * The rows Spark reads: those of data changes (op c, r, u or d) only, in source order, each holding just its
     * seq, schema id, op and row images ({@link #rowType}; see EventSerializer#dataRow).
     */
    public List<UnsafeRow> dataRows() {
        return dataRows;
    }

    /**
     * Lets go of the rows of a batch applied but not yet complete (a part of a source transaction that spans groups,
     * whose destination transaction is still open): what it kept to commit its offset stays.
     */
    void releaseRows() {
        dataRows = Collections.emptyList();
    }

    /** The type of {@link #dataRows}. */
    public static StructType rowType() {
        return EventSerializer.DATA_ROW;
    }

    /**
     * The batch's id, size, index, schemas, last offset and last partition as one JSON object, written as UTF-8 to
     * the file `path` (which the caller reads and removes): a local file hands megabytes to the driver's Python in
     * a few milliseconds, where a py4j string takes about 40 ms a megabyte (its escaping on both sides).
     */
    public void writeHeader(String path) throws IOException {
        try (Writer out = Files.newBufferedWriter(Paths.get(path), StandardCharsets.UTF_8)) {
            out.write("{\"id\":");
            out.write(Long.toString(id));
            out.write(",\"size\":");
            out.write(Integer.toString(size));
            out.write(",\"bytes\":");
            out.write(Long.toString(bytes));
            out.write(",\"index\":");
            out.write(index);
            out.write(",\"schemas\":");
            out.write(schemas);
            out.write(",\"last_offset\":");
            out.write(lastOffset);
            out.write(",\"last_partition\":");
            out.write(lastPartition);
            out.write('}');
        }
    }

    /**
     * Marks every record processed (or, without `keepRecords`, each partition's last, which leaves the same offsets)
     * and the engine's batch finished, which commits (flushes) the engine's offset now: a batch marked complete is
     * never delivered again, whatever happens to the run after it.
     */
    void markProcessed() throws InterruptedException {
        for (RecordChangeEvent<SourceRecord> record : records) {
            committer.markProcessed(record);
        }
        committer.markBatchFinished();
    }
}
