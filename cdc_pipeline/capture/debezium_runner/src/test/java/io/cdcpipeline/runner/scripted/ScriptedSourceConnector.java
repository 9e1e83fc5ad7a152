package io.cdcpipeline.runner.scripted;

import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.source.SourceConnector;

import io.debezium.config.ConfigurationNames;

/**
 * A Kafka Connect source connector that replays a script of source changes through Debezium's own SQL Server or
 * Oracle classes (see {@link ScriptedSourceTask} for the script format), so that tests get the events a real
 * connector emits without a SQL Server or Oracle server. A pipeline connector uses it through its {@code debezium:}
 * properties: {@code connector.class: io.cdcpipeline.runner.scripted.ScriptedSourceConnector},
 * {@code cdc.script.source: sqlserver|oracle}, {@code cdc.script.path: /path/to/script.jsonl}.
 * Test harness only: nothing in the product names it.
 */
public final class ScriptedSourceConnector extends SourceConnector {
    private Map<String, String> properties;

    @Override
    public void start(Map<String, String> props) {
        properties = Map.copyOf(props);
    }

    @Override
    public Class<? extends Task> taskClass() {
        return ScriptedSourceTask.class;
    }

    @Override
    public List<Map<String, String>> taskConfigs(int maxTasks) {
        // One task, numbered as SqlServerConnector numbers its tasks (its metrics name it).
        Map<String, String> task = new HashMap<>(properties);
        task.put(ConfigurationNames.TASK_ID_PROPERTY_NAME, "0");
        return List.of(task);
    }

    @Override
    public void stop() {
    }

    @Override
    public ConfigDef config() {
        return new ConfigDef();
    }

    @Override
    public String version() {
        return "1";
    }
}
