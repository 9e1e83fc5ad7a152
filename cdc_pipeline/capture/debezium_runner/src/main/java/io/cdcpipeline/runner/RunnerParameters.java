package io.cdcpipeline.runner;

import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;

/**
 * Every engine and connector property of one runner, set from Python before the engine starts,
 * plus the runner's own settings (the capacity of the batch queue between the engine and the emitter).
 */
public final class RunnerParameters {
    private final Properties properties = new Properties();
    private int queueCapacity = 4;

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

    Properties toProperties() {
        Properties copy = new Properties();
        copy.putAll(properties);
        return copy;
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
