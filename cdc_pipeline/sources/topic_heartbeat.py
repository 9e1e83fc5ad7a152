"""The heartbeat properties of a source whose Debezium heartbeat is a record on the connector's heartbeat topic and
nothing more (SQL Server, Oracle): how often it comes, and the topic the runner counts as heartbeats."""

from __future__ import annotations

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.sources.debezium import HEARTBEAT_TOPICS_PROPERTY


def heartbeat_properties(connector: ConnectorConfig) -> dict[str, str]:
    """Debezium's heartbeat (`HeartbeatFactory`) sends the connector's offset every heartbeat_interval_seconds, also
    on a quiet source, to `<topic.heartbeat.prefix>.<topic.prefix>` (`AbstractTopicNamingStrategy.heartbeatTopic`);
    the runner commits a batch of them itself."""
    props = {"heartbeat.interval.ms": str(max(1, round(connector.heartbeat_interval_seconds * 1000)))}
    heartbeat_prefix = connector.debezium.get("topic.heartbeat.prefix", "__debezium-heartbeat")
    props[HEARTBEAT_TOPICS_PROPERTY] = f"{heartbeat_prefix}.{connector.name}"
    return props
