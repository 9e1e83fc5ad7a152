package io.cdcpipeline.runner;

import java.util.List;

import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.source.SourceRecord;

import io.debezium.config.Configuration;
import io.debezium.connector.mariadb.MariaDbConnector;
import io.debezium.connector.mariadb.MariaDbConnectorTask;
import io.debezium.connector.mariadb.MariaDbOffsetContext;
import io.debezium.connector.mariadb.MariaDbPartition;
import io.debezium.pipeline.ChangeEventSourceCoordinator;

/** Debezium's MariaDB connector, whose task tells the runner where its polls stand (`TaskPolls`). */
public class MariaDbRunnerConnector extends MariaDbConnector {

    @Override
    public Class<? extends Task> taskClass() {
        return RunnerTask.class;
    }

    /** Debezium's MariaDB task, accounting for its polls. */
    public static class RunnerTask extends MariaDbConnectorTask {
        private TaskPolls polls;

        @Override
        protected ChangeEventSourceCoordinator<MariaDbPartition, MariaDbOffsetContext> start(Configuration config) {
            polls = TaskPolls.started(config.getString("topic.prefix"));
            return super.start(config);
        }

        @Override
        protected List<SourceRecord> doPoll() throws InterruptedException {
            return polls.poll(super::doPoll);
        }
    }
}
