package io.cdcpipeline.runner;

import java.util.HashSet;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;

/**
 * Every engine and connector property of one runner, set from Python before the engine starts,
 * plus the runner's own settings (the capacity of the batch queue between the engine and the emitter; the
 * properties under {@value #RUNNER_PREFIX}, which the engine never sees).
 */
public final class RunnerParameters {
    static final String RUNNER_PREFIX = "cdc.runner.";
    /** Topics whose records are heartbeats (comma-separated), besides Debezium's own heartbeat topic. */
    static final String HEARTBEAT_TOPICS = RUNNER_PREFIX + "heartbeat.topics";
    /**
     * Whether a batch keeps its records until it is complete ("true", the default), which lets it write an event's
     * whole line on demand (a dead letter's); with "false" it keeps only what commits its offset (see ChangeBatch).
     */
    static final String KEEP_RECORDS = RUNNER_PREFIX + "keep.records";
    private static final String DEFAULT_HEARTBEAT_TOPICS_PREFIX = "__debezium-heartbeat";
    private final Properties properties = new Properties();
    private int queueCapacity = 4;
    private long heldBytes = 0;

    public RunnerParameters set(String key, String value) {
        if (value == null) {
            properties.remove(key);
        }
        else {
            properties.setProperty(key, value);
        }
        return this;
    }

    public String get(String key) {
        return properties.getProperty(key);
    }

    public RunnerParameters setQueueCapacity(int capacity) {
        if (capacity < 1) {
            throw new IllegalArgumentException("queue capacity must be at least 1, got " + capacity);
        }
        this.queueCapacity = capacity;
        return this;
    }

    public int queueCapacity() {
        return queueCapacity;
    }

    /**
     * The bytes of rows the runner holds at most (batches queued and in flight together; 0: no bound): while they
     * are reached the engine's thread waits, so a stream of large values cannot fill the driver's heap. A single
     * batch larger than the bound still goes through, alone.
     */
    public RunnerParameters setHeldBytes(long bytes) {
        if (bytes < 0) {
            throw new IllegalArgumentException("held bytes must not be negative, got " + bytes);
        }
        this.heldBytes = bytes;
        return this;
    }

    public long heldBytes() {
        return heldBytes;
    }

    Properties toProperties() {
        Properties copy = new Properties();
        for (String key : properties.stringPropertyNames()) {
            if (!key.startsWith(RUNNER_PREFIX)) {
                copy.setProperty(key, properties.getProperty(key));
            }
        }
        return copy;
    }

    boolean keepRecords() {
        return !"false".equalsIgnoreCase(properties.getProperty(KEEP_RECORDS, "true").trim());
    }

    /** The topics of heartbeat records: Debezium's heartbeat topic of this engine, and those named by the runner. */
    Set<String> heartbeatTopics() {
        Set<String> topics = new HashSet<>();
        // Debezium 3 names it `topic.heartbeat.prefix` + `topic.delimiter` + `topic.prefix`
        // (AbstractTopicNamingStrategy.heartbeatTopic); `heartbeat.topics.prefix` is its older name.
        String prefix = properties.getProperty("topic.heartbeat.prefix",
                properties.getProperty("heartbeat.topics.prefix", DEFAULT_HEARTBEAT_TOPICS_PREFIX));
        topics.add(prefix + properties.getProperty("topic.delimiter", ".") + properties.getProperty("topic.prefix", ""));
        for (String topic : properties.getProperty(HEARTBEAT_TOPICS, "").split(",")) {
            if (!topic.isBlank()) {
                topics.add(topic.trim());
            }
        }
        return topics;
    }

    /** The properties as text for logs, with every secret-looking value masked. */
    public String describe() {
        Map<String, String> shown = new TreeMap<>();
        for (String key : properties.stringPropertyNames()) {
            shown.put(key, isSecret(key) ? "***" : properties.getProperty(key));
        }
        return shown.toString();
    }

    static boolean isSecret(String key) {
        String lower = key.toLowerCase(Locale.ROOT);
        return lower.contains("password") || lower.contains("secret") || lower.contains("token");
    }
}
