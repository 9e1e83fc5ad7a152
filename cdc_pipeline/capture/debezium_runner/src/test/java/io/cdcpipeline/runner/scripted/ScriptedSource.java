package io.cdcpipeline.runner.scripted;

import java.lang.reflect.Constructor;
import java.time.Instant;
import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;

import io.debezium.DebeziumException;
import io.debezium.bean.StandardBeanNames;
import io.debezium.config.CommonConnectorConfig;
import io.debezium.config.Configuration;
import io.debezium.connector.base.ChangeEventQueue;
import io.debezium.connector.base.DefaultQueueProvider;
import io.debezium.connector.common.CdcSourceTaskContext;
import io.debezium.connector.common.DebeziumHeaderProducer;
import io.debezium.connector.common.DebeziumHeaderProducerProvider;
import io.debezium.converters.custom.CustomConverterServiceProvider;
import io.debezium.heartbeat.HeartbeatFactory;
import io.debezium.processors.PostProcessorRegistryServiceProvider;
import io.debezium.relational.CustomConverterRegistry;
import io.debezium.pipeline.DataChangeEvent;
import io.debezium.pipeline.EventDispatcher;
import io.debezium.pipeline.metrics.StreamingChangeEventSourceMetrics;
import io.debezium.pipeline.source.spi.EventMetadataProvider;
import io.debezium.pipeline.spi.OffsetContext;
import io.debezium.pipeline.spi.Partition;
import io.debezium.relational.Column;
import io.debezium.relational.ColumnEditor;
import io.debezium.relational.HistorizedRelationalDatabaseSchema;
import io.debezium.relational.RelationalDatabaseConnectorConfig;
import io.debezium.relational.TableId;
import io.debezium.schema.DatabaseSchema;
import io.debezium.spi.topic.TopicNamingStrategy;

/**
 * One source's replay of a script through the connector's own classes: the connector's config, value converters,
 * database schema (its {@code TableSchemaBuilder}), offset context and change record emitters, and Debezium's
 * {@link EventDispatcher} putting the records on a {@link ChangeEventQueue} as the connector's streaming source does.
 * A subclass knows its connector: how a step's position compares with a stored offset, and how a step is emitted.
 */
abstract class ScriptedSource<P extends Partition> {
    /** The key of a SQL Server schema step ({@code create} or {@code alter}), and of an Oracle DDL step. */
    static final String SCHEMA_STEP = "schema";
    static final String DDL_STEP = "ddl";
    /** The key of a quiet step: the source's log went on to the step's position with no change of a captured table. */
    static final String QUIET_STEP = "quiet";
    /** How often a played-out source offers a heartbeat (Debezium's heartbeat emits one per its interval). */
    private static final long HEARTBEAT_OFFER_MILLIS = 100;
    protected final String name;
    protected List<JsonNode> steps = List.of();
    private int firstPlayed;
    protected ChangeEventQueue<DataChangeEvent> queue;
    protected EventDispatcher<P, TableId> dispatcher;
    private StreamingChangeEventSourceMetrics<P> metrics;

    ScriptedSource(Configuration config) {
        this.name = config.getString(CommonConnectorConfig.TOPIC_PREFIX);
    }

    /** The connector's source partition (the key of its offsets). */
    abstract P partition();

    /** The connector's offset context as the streaming source leaves it (a heartbeat carries its offset). */
    abstract OffsetContext offsetContext();

    /** Takes the connector's stored offset (null when none) as the connector's task does on start. */
    abstract void loadOffset(Map<String, ?> storedOffset);

    /** Whether the stored offset says the step was already delivered (the connector resumes after it). */
    abstract boolean delivered(int index);

    /** Applies a schema step to the in-memory schema without emitting it (the connector's recovered history). */
    abstract void recoverSchema(JsonNode step) throws InterruptedException;

    /**
     * Moves the connector's offset context to the step and emits the step's records through the dispatcher; with
     * {@code emit} false only moves the offset context and applies a schema step to the schema.
     */
    abstract void play(int index, boolean emit) throws InterruptedException;

    abstract void close();

    /**
     * The source transaction whose change the step is (its commit LSN, its transaction id), or null for a step that
     * is no data change: after the last step of a transaction the replay dispatches its commit, as the connector's
     * streaming source does once the transaction ended, which gives its END record under
     * {@code provide.transaction.metadata}.
     */
    abstract Object transactionOf(JsonNode step);

    /**
     * Decides where the replay starts: after the last step the stored offset covers, less {@code redeliver} steps.
     * Without re-delivery the connector goes on from its stored offset, and the schema steps before it only rebuild
     * the in-memory schema. With re-delivery it is a connector restarted from an older offset: a new offset context
     * is moved through the steps before the replay's start, so that the re-delivered records carry the offsets they
     * had the first time.
     */
    final void prepare(List<JsonNode> script, Map<String, ?> storedOffset, int redeliver) throws InterruptedException {
        steps = script;
        loadOffset(storedOffset);
        int resume = 0;
        if (storedOffset != null) {
            for (int index = 0; index < steps.size(); index++) {
                if (delivered(index)) {
                    resume = index + 1;
                }
            }
        }
        firstPlayed = Math.max(0, resume - redeliver);
        boolean redelivers = firstPlayed < resume;
        if (redelivers) {
            loadOffset(null);
        }
        for (int index = 0; index < firstPlayed; index++) {
            if (redelivers) {
                play(index, false);
            }
            else if (steps.get(index).has(SCHEMA_STEP) || steps.get(index).has(DDL_STEP)) {
                recoverSchema(steps.get(index));
            }
        }
    }

    /**
     * Registers the connector's streaming metrics (the MBean the runner reads: connected, queue capacity) and makes
     * them the dispatcher's event listener, as the connector's coordinator does.
     */
    final void startStreamingMetrics(StreamingChangeEventSourceMetrics<P> streamingMetrics) {
        metrics = streamingMetrics;
        metrics.register();
        dispatcher.setEventListener(metrics);
    }

    final void stopStreamingMetrics() {
        if (metrics != null) {
            metrics.unregister();
        }
    }

    /**
     * Emits the steps from the resume point on; a failing step is named by its connector, table and position. Then,
     * as a connector's streaming source on a quiet log, offers Debezium's heartbeat the offset context on each turn
     * ({@code EventDispatcher.dispatchHeartbeatEvent}), which emits a heartbeat record each
     * {@code heartbeat.interval.ms} when set (none when 0), until the task stops.
     */
    final void playAll() throws InterruptedException {
        // Connected: what the streaming source reports once it reads the log.
        metrics.connected(true);
        for (int index = firstPlayed; index < steps.size(); index++) {
            try {
                play(index, true);
                Object transaction = transactionOf(steps.get(index));
                if (transaction != null && (index + 1 == steps.size()
                        || !transaction.equals(transactionOf(steps.get(index + 1))))) {
                    dispatcher.dispatchTransactionCommittedEvent(partition(), offsetContext(), changeTime(steps.get(index)));
                }
            }
            catch (RuntimeException e) {
                throw new DebeziumException("scripted " + getClass().getSimpleName() + " of connector '" + name
                        + "': step " + index + " " + steps.get(index) + " failed: " + e.getMessage(), e);
            }
        }
        // As the streaming sources call it on every turn: a no-op heartbeat without heartbeat.interval.ms
        // (EventDispatcher.heartbeatsEnabled tells only of the heartbeat's extra ones, such as an action query's).
        while (!Thread.currentThread().isInterrupted()) {
            dispatcher.dispatchHeartbeatEvent(partition(), offsetContext());
            Thread.sleep(HEARTBEAT_OFFER_MILLIS);
        }
    }

    final ChangeEventQueue<DataChangeEvent> queue() {
        return queue;
    }

    /** The connector task's queue, from its config, as its {@code start} builds it. */
    static ChangeEventQueue<DataChangeEvent> newQueue(CommonConnectorConfig connectorConfig, CdcSourceTaskContext<?> taskContext) {
        return new ChangeEventQueue.Builder<DataChangeEvent>()
                .pollInterval(connectorConfig.getPollInterval())
                .maxBatchSize(connectorConfig.getMaxBatchSize())
                .maxQueueSize(connectorConfig.getMaxQueueSize())
                .maxQueueSizeInBytes(connectorConfig.getMaxQueueSizeInBytes())
                .queueProvider(new DefaultQueueProvider<>(connectorConfig.getMaxQueueSize()))
                .loggingContextSupplier(() -> taskContext.configureLoggingContext("scripted-source"))
                .build();
    }

    /** Registers the service providers and beans the connector's task registers ({@code BaseSourceTask}). */
    static void registerServiceProviders(CommonConnectorConfig connectorConfig) {
        connectorConfig.getServiceRegistry().registerServiceProvider(new PostProcessorRegistryServiceProvider());
        connectorConfig.getServiceRegistry().registerServiceProvider(new DebeziumHeaderProducerProvider());
        connectorConfig.getServiceRegistry().registerServiceProvider(new CustomConverterServiceProvider());
    }

    static CustomConverterRegistry customConverterRegistry(CommonConnectorConfig connectorConfig) {
        return connectorConfig.getServiceRegistry().tryGetService(CustomConverterRegistry.class);
    }

    static void registerBeans(CommonConnectorConfig connectorConfig, Configuration config, DatabaseSchema<?> schema,
                              Object valueConverters, CdcSourceTaskContext<?> taskContext) {
        connectorConfig.getBeanRegistry().add(StandardBeanNames.CONFIGURATION, config);
        connectorConfig.getBeanRegistry().add(StandardBeanNames.CONNECTOR_CONFIG, connectorConfig);
        connectorConfig.getBeanRegistry().add(StandardBeanNames.DATABASE_SCHEMA, schema);
        connectorConfig.getBeanRegistry().add(StandardBeanNames.VALUE_CONVERTER, valueConverters);
        connectorConfig.getBeanRegistry().add(StandardBeanNames.CDC_SOURCE_TASK_CONTEXT, taskContext);
    }

    /**
     * The dispatcher as the connector's task makes it, without signals (none are configured), with the heartbeat of
     * Debezium's {@code HeartbeatFactory} from the connector's config ({@code heartbeat.interval.ms}; none when 0):
     * its records go to the topic naming strategy's heartbeat topic, {@code __debezium-heartbeat.<topic.prefix>}.
     */
    static <P extends Partition> EventDispatcher<P, TableId> newDispatcher(RelationalDatabaseConnectorConfig connectorConfig,
                                                                         TopicNamingStrategy<TableId> topicNamingStrategy,
                                                                         HistorizedRelationalDatabaseSchema schema,
                                                                         ChangeEventQueue<DataChangeEvent> queue,
                                                                         EventMetadataProvider metadataProvider) {
        return new EventDispatcher<>(
                connectorConfig,
                topicNamingStrategy,
                schema,
                queue,
                connectorConfig.getTableFilters().dataCollectionFilter(),
                DataChangeEvent::new,
                metadataProvider,
                new HeartbeatFactory<>(connectorConfig, topicNamingStrategy, connectorConfig.schemaNameAdjuster())
                        .getScheduledHeartbeat(connectorConfig, null, null, queue),
                connectorConfig.schemaNameAdjuster(),
                connectorConfig.getServiceRegistry().tryGetService(DebeziumHeaderProducer.class));
    }

    /** A column as {@code JdbcConnection.readTableColumn} makes it from a row of {@code DatabaseMetaData.getColumns}. */
    static Column column(JsonNode definition, int position) {
        ColumnEditor column = Column.editor().name(definition.get("name").asText());
        column.type(definition.get("typeName").asText());
        column.length(definition.path("length").asInt(0));
        if (definition.hasNonNull("scale")) {
            column.scale(definition.get("scale").asInt());
        }
        column.optional(definition.path("optional").asBoolean(true));
        column.position(position);
        column.autoIncremented(definition.path("autoIncremented").asBoolean(false));
        column.generated(definition.path("generated").asBoolean(false));
        column.nativeType(Column.UNSET_INT_VALUE);
        column.jdbcType(definition.get("jdbcType").asInt());
        if (definition.hasNonNull("default")) {
            column.defaultValueExpression(definition.get("default").asText());
        }
        return column.create();
    }

    /** The step's time of change ({@code ts}, an ISO instant), else now. */
    static Instant changeTime(JsonNode step) {
        return step.hasNonNull("ts") ? Instant.parse(step.get("ts").asText()) : Instant.now();
    }

    /** An instance of a connector class that is not public (its connector makes it in its own package). */
    @SuppressWarnings("unchecked")
    static <T> T newPackagePrivate(String className, Object... arguments) {
        try {
            for (Constructor<?> constructor : Class.forName(className).getDeclaredConstructors()) {
                if (constructor.getParameterCount() == arguments.length) {
                    constructor.setAccessible(true);
                    return (T) constructor.newInstance(arguments);
                }
            }
            throw new NoSuchMethodException(className + " with " + arguments.length + " parameters");
        }
        catch (ReflectiveOperationException e) {
            throw new DebeziumException("cannot make Debezium's " + className, e);
        }
    }
}
