package io.cdcpipeline.runner.scripted;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.source.SourceTask;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import io.debezium.DebeziumException;
import io.debezium.config.Configuration;
import io.debezium.pipeline.DataChangeEvent;
import io.debezium.relational.history.MemorySchemaHistory;

/**
 * Replays a script of source changes through Debezium's own SQL Server or Oracle classes, on a thread of its own that
 * puts the records on the connector's queue as a connector's streaming source does; {@link #poll} drains that queue.
 *
 * <p>Properties (besides the connector's own, which the pipeline gives as for the real connector):
 * {@code cdc.script.path} (the script), {@code cdc.script.source} ({@code sqlserver} or {@code oracle}),
 * {@code cdc.script.redeliver} (re-deliver that many steps before the stored offset; default 0).
 * The schema history is kept in memory ({@code MemorySchemaHistory}) and rebuilt from the script's schema steps.
 *
 * <p>The script is JSON Lines, one step a line; the file may grow between runs, and each run resumes after the last
 * step its stored offset covers. Values are described in {@link ScriptValues}.
 * <pre>
 * SQL Server ({@link SqlServerScript}):
 *   {"schema": "create"|"alter", "table": "dbo.t", "commit_lsn": "00000025:00000010:0001", "ts": "2024-01-02T03:04:05Z",
 *    "capture": "dbo_t", "primaryKey": ["id"],
 *    "columns": [{"name": "id", "jdbcType": 4, "typeName": "int", "length": 10, "scale": 0, "optional": false,
 *                 "autoIncremented": false, "generated": false, "default": "((0))"}, ...]}
 *   {"op": "c"|"u"|"d", "table": "dbo.t", "commit_lsn": "...", "change_lsn": "...", "ts": "...",
 *    "before": {"id": 1, ...}, "after": {"id": 1, "v": {"java": "java.math.BigDecimal", "value": "1.50"}}}
 * Oracle ({@link OracleScript}):
 *   {"ddl": "CREATE TABLE \"DEBEZIUM\".\"T\" (...)", "table": "DEBEZIUM.T", "scn": "1000", "ts": "..."}
 *   {"redo": "insert into \"DEBEZIUM\".\"T\"(\"ID\") values ('1');", "table": "DEBEZIUM.T", "scn": "1001",
 *    "commit_scn": "1003", "txid": "0a000b00c0000000", "ts": "..."}
 * Either: a quiet stretch, the log read on to a position with no change of a captured table:
 *   {"quiet": true, "commit_lsn": "..."} (SQL Server), {"quiet": true, "scn": "1010"} (Oracle)
 * </pre>
 * Once the script is played out, a connector with {@code heartbeat.interval.ms} emits Debezium's heartbeats carrying
 * its offset, as the connector does on a quiet log.
 * Positions only grow along the script. {@code ts} (an ISO instant, default now) is the change's time in the
 * source struct. Consecutive Oracle steps with one {@code txid} are one transaction; SQL Server's transactions are
 * the steps of one {@code commit_lsn}.
 * </pre>
 */
public final class ScriptedSourceTask extends SourceTask {
    public static final String SCRIPT_PATH = "cdc.script.path";
    public static final String SCRIPT_SOURCE = "cdc.script.source";
    public static final String REDELIVER = "cdc.script.redeliver";

    private ScriptedSource<?> source;
    private Thread player;

    @Override
    public void start(Map<String, String> props) {
        Map<String, String> properties = new HashMap<>(props);
        properties.put("schema.history.internal", MemorySchemaHistory.class.getName());
        Configuration config = Configuration.from(properties);
        String kind = props.getOrDefault(SCRIPT_SOURCE, "");
        source = switch (kind) {
            case "sqlserver" -> new SqlServerScript(config);
            case "oracle" -> new OracleScript(config);
            default -> throw new DebeziumException(SCRIPT_SOURCE + " must be sqlserver or oracle, not '" + kind + "'");
        };
        Map<String, Object> stored = context.offsetStorageReader().offset(source.partition().getSourcePartition());
        try {
            source.prepare(readScript(Path.of(props.get(SCRIPT_PATH))), stored,
                    Integer.parseInt(props.getOrDefault(REDELIVER, "0")));
        }
        catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new DebeziumException("interrupted while recovering the scripted schema", e);
        }
        player = new Thread(this::play, "scripted-source-" + props.get("name"));
        player.setDaemon(true);
        player.start();
    }

    private void play() {
        try {
            source.playAll();
        }
        catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        catch (RuntimeException e) {
            source.queue().producerException(e);
        }
    }

    /** The records on the queue; null once the script is played out (after the queue's poll interval, like an idle connector). */
    @Override
    public List<SourceRecord> poll() throws InterruptedException {
        List<DataChangeEvent> events = source.queue().poll();
        if (events.isEmpty()) {
            return null;
        }
        List<SourceRecord> records = new ArrayList<>(events.size());
        events.forEach(event -> records.add(event.getRecord()));
        return records;
    }

    @Override
    public void stop() {
        if (player != null) {
            player.interrupt();
        }
        if (source != null) {
            source.close();
        }
    }

    @Override
    public String version() {
        return "1";
    }

    static List<JsonNode> readScript(Path path) {
        ObjectMapper mapper = new ObjectMapper();
        List<JsonNode> steps = new ArrayList<>();
        try {
            for (String line : Files.readAllLines(path)) {
                if (!line.isBlank()) {
                    steps.add(mapper.readTree(line));
                }
            }
        }
        catch (IOException e) {
            throw new UncheckedIOException("cannot read the script " + path, e);
        }
        return steps;
    }
}
