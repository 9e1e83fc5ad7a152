package io.cdcpipeline.runner;

import java.util.List;

import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.source.SourceRecord;

import io.debezium.config.Configuration;
import io.debezium.connector.mysql.MySqlConnector;
import io.debezium.connector.mysql.MySqlConnectorTask;
import io.debezium.connector.mysql.MySqlOffsetContext;
import io.debezium.connector.mysql.MySqlPartition;
import io.debezium.pipeline.ChangeEventSourceCoordinator;

/** Debezium's MySQL connector, whose task tells the runner where its polls stand (`TaskPolls`). */
public class MySqlRunnerConnector extends MySqlConnector {

    @Override
    public Class<? extends Task> taskClass() {
        return RunnerTask.class;
    }

    /** Debezium's MySQL task, accounting for its polls. */
    public static class RunnerTask extends MySqlConnectorTask {
        private TaskPolls polls;

        @Override
        public ChangeEventSourceCoordinator<MySqlPartition, MySqlOffsetContext> start(Configuration config) {
            polls = TaskPolls.started(config.getString("topic.prefix"));
            return super.start(config);
        }

        @Override
        public List<SourceRecord> doPoll() throws InterruptedException {
            return polls.poll(super::doPoll);
        }
    }
}
