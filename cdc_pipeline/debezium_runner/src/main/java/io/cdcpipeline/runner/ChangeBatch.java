package io.cdcpipeline.runner;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;

import org.apache.kafka.connect.source.SourceRecord;

import com.fasterxml.jackson.databind.node.ObjectNode;

import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;

/**
 * One batch handed over by the engine: its records and their committer (kept until the batch is complete),
 * and the same records as JSON lines for Spark, with the value schemas the lines refer to.
 */
public final class ChangeBatch {
    private final List<RecordChangeEvent<SourceRecord>> records;
    private final DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer;
    private final List<String> lines;
    private final List<String> dataLines;
    private final String index;
    private final String schemas;
    private final String lastOffset;
    private final String lastPartition;
    private volatile long id = -1;

    ChangeBatch(List<RecordChangeEvent<SourceRecord>> records,
                DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer,
                EventSerializer serializer, long firstSeq) {
        this.records = new ArrayList<>(records);
        this.committer = committer;
        List<String> out = new ArrayList<>(records.size());
        List<String> data = new ArrayList<>(records.size());
        StringBuilder indexJson = new StringBuilder(records.size() * 256).append('[');
        Set<String> schemaIds = new LinkedHashSet<>();
        long seq = firstSeq;
        SourceRecord last = null;
        for (RecordChangeEvent<SourceRecord> event : records) {
            SourceRecord record = event.record();
            if (indexJson.length() > 1) {
                indexJson.append(',');
            }
            ObjectNode entry = serializer.indexEntry(seq, record);
            indexJson.append(entry.toString());
            String line = serializer.line(seq++, record);
            out.add(line);
            if (EventSerializer.KIND_DATA_CHANGE.equals(entry.path("kind").asText())) {
                data.add(line);
            }
            last = record;
        }
        for (String line : out) {
            int start = line.indexOf(",\"schema\":\"");
            if (start > 0) {
                int from = start + 11;
                schemaIds.add(line.substring(from, line.indexOf('"', from)));
            }
        }
        StringBuilder schemaJson = new StringBuilder("{");
        for (String schemaId : schemaIds) {
            if (schemaJson.length() > 1) {
                schemaJson.append(',');
            }
            schemaJson.append('"').append(schemaId).append("\":").append(serializer.schemaJson(schemaId));
        }
        this.schemas = schemaJson.append('}').toString();
        this.lines = Collections.unmodifiableList(out);
        this.dataLines = Collections.unmodifiableList(data);
        this.index = indexJson.append(']').toString();
        this.lastOffset = last == null ? "null" : serializer.json(last.sourceOffset());
        this.lastPartition = last == null ? "null" : serializer.json(last.sourcePartition());
    }

    public long id() {
        return id;
    }

    void assignId(long batchId) {
        this.id = batchId;
    }

    public int size() {
        return lines.size();
    }

    /** The events as JSON lines, in source order. */
    public List<String> lines() {
        return lines;
    }

    /** The lines of data changes (op c, r, u or d) only, in source order: all that Spark parses. */
    public List<String> dataLines() {
        return dataLines;
    }

    /** The index entries of the lines, as one JSON array in the same order (see EventSerializer#indexEntry). */
    public String index() {
        return index;
    }

    /** A JSON object from schema id to the value schema, for the ids these lines use. */
    public String schemas() {
        return schemas;
    }

    /** The source offset of the last record, as JSON: where the engine resumes once this batch is complete. */
    public String lastOffset() {
        return lastOffset;
    }

    public String lastPartition() {
        return lastPartition;
    }

    void markProcessed() throws InterruptedException {
        for (RecordChangeEvent<SourceRecord> record : records) {
            committer.markProcessed(record);
        }
    }
}
