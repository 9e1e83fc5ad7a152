"""Debezium and runner property names that more than one source package sets."""

# The topics whose records the runner counts as heartbeats (a comma-separated list, or prefixes ending in `.`).
HEARTBEAT_TOPICS_PROPERTY = "cdc.runner.heartbeat.topics"
