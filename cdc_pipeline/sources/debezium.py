"""Debezium and runner properties that more than one source package sets: the heartbeat's."""

from __future__ import annotations

from cdc_pipeline.config import ConnectorConfig

# The topics whose records the runner counts as heartbeats (a comma-separated list, or prefixes ending in `.`).
HEARTBEAT_TOPICS_PROPERTY = "cdc.runner.heartbeat.topics"


def heartbeat_interval_ms(connector: ConnectorConfig) -> str:
    """Debezium's `heartbeat.interval.ms` of the connector's heartbeat_interval_seconds (at least 1)."""
    return str(max(1, round(connector.heartbeat_interval_seconds * 1000)))


def topic_heartbeat_properties(connector: ConnectorConfig) -> dict[str, str]:
    """The heartbeat of a source whose Debezium heartbeat is a record on the connector's heartbeat topic and nothing
    more (MariaDB/MySQL, SQL Server, Oracle): Debezium (`HeartbeatFactory`) sends the connector's offset every
    heartbeat_interval_seconds, also on a quiet source, to `<topic.heartbeat.prefix>.<topic.prefix>`
    (`AbstractTopicNamingStrategy.heartbeatTopic`); the runner commits a batch of them itself."""
    heartbeat_prefix = connector.debezium.get("topic.heartbeat.prefix", "__debezium-heartbeat")
    return {"heartbeat.interval.ms": heartbeat_interval_ms(connector),
            HEARTBEAT_TOPICS_PROPERTY: f"{heartbeat_prefix}.{connector.name}"}
