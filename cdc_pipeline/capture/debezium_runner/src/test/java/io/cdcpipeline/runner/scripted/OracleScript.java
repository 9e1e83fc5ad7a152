package io.cdcpipeline.runner.scripted;

import java.lang.reflect.Field;
import java.time.Instant;
import java.util.Collections;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;

import io.debezium.DebeziumException;
import io.debezium.config.CommonConnectorConfig;
import io.debezium.config.Configuration;
import io.debezium.connector.oracle.AbstractOracleStreamingChangeEventSourceMetrics;
import io.debezium.connector.oracle.CommitScn;
import io.debezium.connector.oracle.OracleConnection;
import io.debezium.connector.oracle.OracleConnectorConfig;
import io.debezium.connector.oracle.OracleDatabaseSchema;
import io.debezium.connector.oracle.OracleDefaultValueConverter;
import io.debezium.connector.oracle.OracleOffsetContext;
import io.debezium.connector.oracle.OraclePartition;
import io.debezium.connector.oracle.OracleSchemaChangeEventEmitter;
import io.debezium.connector.oracle.OracleTaskContext;
import io.debezium.connector.oracle.OracleValueConverters;
import io.debezium.connector.oracle.Scn;
import io.debezium.connector.oracle.logminer.LogMinerChangeRecordEmitter;
import io.debezium.connector.oracle.logminer.events.LogMinerEventRow;
import io.debezium.connector.oracle.logminer.parser.LogMinerDmlEntry;
import io.debezium.connector.oracle.logminer.parser.LogMinerDmlParser;
import io.debezium.pipeline.source.snapshot.incremental.SignalBasedIncrementalSnapshotContext;
import io.debezium.pipeline.source.spi.EventMetadataProvider;
import io.debezium.pipeline.txmetadata.TransactionContext;
import io.debezium.relational.Table;
import io.debezium.relational.TableId;
import io.debezium.spi.topic.TopicNamingStrategy;
import io.debezium.util.Clock;

import oracle.sql.CharacterSet;

/**
 * Oracle's LogMiner streaming source replayed from a script: what the connector's buffered LogMiner source does with
 * the rows of {@code V$LOGMNR_CONTENTS} at a transaction's commit, with the rows given by the script.
 * <ul>
 * <li>A DDL step (LogMiner's DDL text) advances the offset's SCN and commit SCN, as {@code handleSchemaChangeEvent}
 * does, and is dispatched through {@code OracleSchemaChangeEventEmitter}: Debezium's {@code OracleDdlParser} parses it
 * against the schema's tables (CREATE, ALTER, DROP), so its record carries the DDL text and the parsed tableChanges.</li>
 * <li>A DML step is one SQL_REDO text, parsed by {@code LogMinerDmlParser} against the table; its old and new values
 * go to {@code LogMinerChangeRecordEmitter} as the connector hands them over (an update that leaves a LOB column out
 * of its SET and WHERE clauses gives the column Debezium's unavailable-value placeholder). The offset context gets
 * the event's SCN, the transaction's commit SCN, id and sequence as in the connector's commit handler; after the
 * transaction's last step its commit is recorded ({@code CommitScn.recordCommit}).</li>
 * </ul>
 * A quiet step ({@code {"quiet": true, "scn": ...}}) is a mining window that ended at the step's SCN with no
 * transaction of a captured table buffered: the offset's SCN moves there, as the connector's streaming source sets it
 * after each window, and the heartbeat dispatched after it carries it.
 * Steps with the same {@code txid} next to each other form a transaction. On start the stored offset is loaded by the
 * adapter's offset loader; a transaction whose commit the stored commit SCN covers ({@code CommitScn.hasBeenHandled})
 * was delivered, and so were the stored transaction's events up to its stored sequence, as the connector skips them.
 * Not the connector's: LogMiner's event merging for LOB writes ({@code TransactionCommitConsumer}) is not run, and
 * values of the snapshot's JDBC path (oracle.sql.TIMESTAMPTZ and the like) are not scripted.
 */
final class OracleScript extends ScriptedSource<OraclePartition> {
    private static final int REDO_THREAD = 1;
    private final OracleConnectorConfig connectorConfig;
    private final OracleDatabaseSchema schema;
    private final OraclePartition partition;
    private final AbstractOracleStreamingChangeEventSourceMetrics streamingMetrics;
    private final LogMinerDmlParser dmlParser;
    private OracleOffsetContext offsetContext;
    private OracleOffsetContext storedOffset;

    @SuppressWarnings("unchecked")
    OracleScript(Configuration config) {
        super(config);
        connectorConfig = new OracleConnectorConfig(config);
        OracleTaskContext taskContext = new OracleTaskContext(config, connectorConfig);
        OracleConnection connection = new ScriptedOracleConnection(connectorConfig);
        registerServiceProviders(connectorConfig);
        OracleValueConverters valueConverters = connectorConfig.getAdapter().getValueConverter(connectorConfig, connection);
        TopicNamingStrategy<TableId> topicNamingStrategy = connectorConfig.getTopicNamingStrategy(CommonConnectorConfig.TOPIC_NAMING_STRATEGY);
        schema = new OracleDatabaseSchema(connectorConfig, valueConverters, new OracleDefaultValueConverter(valueConverters, connection),
                connectorConfig.schemaNameAdjuster(), topicNamingStrategy,
                connectorConfig.getAdapter().getTableNameCaseSensitivity(connection), false,
                customConverterRegistry(connectorConfig), taskContext);
        schema.initializeStorage();
        registerBeans(connectorConfig, config, schema, valueConverters, taskContext);
        partition = new OraclePartition(connectorConfig.getLogicalName(), connectorConfig.getCatalogName());
        queue = newQueue(connectorConfig, taskContext);
        EventMetadataProvider metadataProvider = newPackagePrivate("io.debezium.connector.oracle.OracleEventMetadataProvider");
        dispatcher = newDispatcher(connectorConfig, topicNamingStrategy, schema, queue, metadataProvider);
        streamingMetrics = (AbstractOracleStreamingChangeEventSourceMetrics) connectorConfig.getAdapter()
                .getStreamingMetrics(taskContext, queue, metadataProvider, connectorConfig, schema::dataCollectionIds);
        startStreamingMetrics(streamingMetrics);
        dmlParser = new LogMinerDmlParser(connectorConfig);
    }

    @Override
    OraclePartition partition() {
        return partition;
    }

    @Override
    OracleOffsetContext offsetContext() {
        return offsetContext;
    }

    @Override
    void loadOffset(Map<String, ?> stored) {
        if (stored == null) {
            storedOffset = null;
            offsetContext = OracleOffsetContext.create().logicalName(connectorConfig)
                    .scn(Scn.valueOf(0))
                    .commitScn(CommitScn.empty())
                    .snapshotPendingTransactions(Collections.emptyMap())
                    .transactionContext(new TransactionContext())
                    .incrementalSnapshotContext(new SignalBasedIncrementalSnapshotContext<>())
                    .build();
        }
        else {
            offsetContext = (OracleOffsetContext) connectorConfig.getAdapter().getOffsetContextLoader().load(stored);
            storedOffset = (OracleOffsetContext) connectorConfig.getAdapter().getOffsetContextLoader().load(stored);
        }
    }

    @Override
    boolean delivered(int index) {
        if (storedOffset == null) {
            return false;
        }
        JsonNode step = steps.get(index);
        if (step.has(QUIET_STEP)) {
            return storedOffset.getScn().compareTo(scn(step)) >= 0;
        }
        String txid = txid(step);
        if (storedOffset.getCommitScn().hasBeenHandled(REDO_THREAD, commitScn(step), txid)) {
            return true;
        }
        return txid.equals(storedOffset.getTransactionId()) && storedOffset.getTransactionSequence() != null
                && sequence(index) <= storedOffset.getTransactionSequence();
    }

    @Override
    void recoverSchema(JsonNode step) throws InterruptedException {
        schemaChange(step).emitSchemaChangeEvent(schema::applySchemaChange);
    }

    @Override
    void play(int index, boolean emit) throws InterruptedException {
        JsonNode step = steps.get(index);
        if (step.has(QUIET_STEP)) {
            // Mining reached the step's SCN with no transaction of a captured table open: the offset's SCN moves there.
            offsetContext.setScn(scn(step));
            return;
        }
        TableId tableId = tableId(step);
        Instant changeTime = changeTime(step);
        if (step.has(DDL_STEP)) {
            offsetContext.setScn(scn(step));
            offsetContext.getCommitScn().recordCommit(commitRow(step));
            offsetContext.setEventScn(scn(step));
            offsetContext.setRedoThread(REDO_THREAD);
            offsetContext.setRsId("");
            offsetContext.setRowId("");
            offsetContext.setTransactionSequence(null);
            if (emit) {
                dispatcher.dispatchSchemaChangeEvent(partition, offsetContext, tableId, schemaChange(step));
            }
            else {
                recoverSchema(step);
            }
            return;
        }
        Table table = schema.tableFor(tableId);
        if (table == null) {
            throw new IllegalStateException("no DDL step made table " + tableId + " before this change");
        }
        LogMinerDmlEntry entry = dmlParser.parse(step.get("redo").asText(), table);
        long sequence = sequence(index);
        if (sequence == 1) {
            // Where LogMiner would start mining again to see this transaction whole.
            offsetContext.setScn(scn(step).subtract(Scn.valueOf(1)));
            offsetContext.setStartScn(scn(step));
            offsetContext.setStartTime(changeTime);
        }
        offsetContext.setEventScn(scn(step));
        offsetContext.setEventCommitScn(commitScn(step));
        offsetContext.setTransactionId(txid(step));
        offsetContext.setTransactionSequence(sequence);
        offsetContext.setUserName(tableId.schema());
        offsetContext.setSourceTime(changeTime);
        offsetContext.setTableId(tableId);
        offsetContext.setRedoThread(REDO_THREAD);
        offsetContext.setRsId("");
        offsetContext.setRowId("");
        offsetContext.setCommitTime(changeTime);
        if (emit) {
            dispatcher.dispatchDataChangeEvent(partition, tableId, new LogMinerChangeRecordEmitter(connectorConfig, partition,
                    offsetContext, entry.getEventType(), entry.getOldValues(), entry.getNewValues(), table, schema, Clock.system()));
        }
        if (index + 1 == steps.size() || !sameTransaction(steps.get(index + 1), step)) {
            offsetContext.getCommitScn().recordCommit(commitRow(step));
            offsetContext.setEventScn(commitScn(step));
            offsetContext.setStartScn(Scn.NULL);
            offsetContext.setCommitTime(null);
            offsetContext.setStartTime(null);
        }
    }

    @Override
    void close() {
        stopStreamingMetrics();
        schema.close();
    }

    private OracleSchemaChangeEventEmitter schemaChange(JsonNode step) {
        TableId tableId = tableId(step);
        return new OracleSchemaChangeEventEmitter(connectorConfig, partition, offsetContext, tableId, tableId.catalog(),
                tableId.schema(), step.get(DDL_STEP).asText(), schema, changeTime(step), streamingMetrics, () -> {
                });
    }

    /** The table of a step: the connector's catalog (its PDB or database), and the step's {@code OWNER.TABLE}. */
    private TableId tableId(JsonNode step) {
        String[] parts = step.get("table").asText().split("\\.", 2);
        return new TableId(connectorConfig.getCatalogName(), parts[0], parts[1]);
    }

    /** The step's place in its transaction, from 1 (the connector's transaction sequence). */
    private long sequence(int index) {
        long sequence = 1;
        while (index - sequence >= 0 && sameTransaction(steps.get((int) (index - sequence)), steps.get(index))) {
            sequence++;
        }
        return sequence;
    }

    private static boolean sameTransaction(JsonNode one, JsonNode other) {
        return one.has("redo") && other.has("redo") && txid(one).equals(txid(other));
    }

    /** The step's transaction id; a DDL step without one is a transaction of its own. */
    private static String txid(JsonNode step) {
        return step.path("txid").asText("ddl-" + step.get("scn").asText());
    }

    private static Scn scn(JsonNode step) {
        return Scn.valueOf(step.get("scn").asText());
    }

    private static Scn commitScn(JsonNode step) {
        return Scn.valueOf(step.path("commit_scn").asText(step.get("scn").asText()));
    }

    /** The COMMIT row the connector records its commit from (its SCN, redo thread and transaction id). */
    private static LogMinerEventRow commitRow(JsonNode step) {
        LogMinerEventRow row = new LogMinerEventRow();
        setField(row, "scn", commitScn(step));
        setField(row, "thread", REDO_THREAD);
        setField(row, "transactionId", txid(step));
        return row;
    }

    private static void setField(Object target, String name, Object value) {
        try {
            Field field = target.getClass().getDeclaredField(name);
            field.setAccessible(true);
            field.set(target, value);
        }
        catch (ReflectiveOperationException e) {
            throw new DebeziumException("cannot set " + name + " of Debezium's " + target.getClass().getName(), e);
        }
    }

    /**
     * The connector's connection, never opened: the value converters ask it only for the national character set
     * (AL16UTF16, Oracle's default), the default value converter only for default expressions it cannot parse.
     */
    private static final class ScriptedOracleConnection extends OracleConnection {
        ScriptedOracleConnection(OracleConnectorConfig connectorConfig) {
            super(connectorConfig, false);
        }

        @Override
        public CharacterSet getNationalCharacterSet() {
            return CharacterSet.make(CharacterSet.AL16UTF16_CHARSET);
        }
    }

    @Override
    Object transactionOf(JsonNode step) {
        return step.has("redo") ? txid(step) : null;
    }
}
