"""A PostgreSQL connector's Debezium properties and its heartbeat: Debezium writes the heartbeat table, which is in the publication (the include
list) and never replicated."""

from __future__ import annotations

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.sources import captures, postgres
from cdc_pipeline.sources.debezium import HEARTBEAT_TOPICS_PROPERTY


def _connector(**fields) -> ConnectorConfig:
    return ConnectorConfig(name="shop", type="postgres", hostname="h", user="u", password="p", database="shop",
                           **fields)


def test_the_heartbeat_writes_the_connectors_row_of_the_heartbeat_table():
    props = postgres.debezium_properties(_connector(tables=["sales.orders"], idle_timeout_seconds=4))
    assert props["heartbeat.interval.ms"] == "2000"
    assert props["heartbeat.action.query"] == (
        'INSERT INTO "public"."cdc_heartbeat" (slot_name, beat_at) VALUES (\'cdc_shop\', now()) '
        "ON CONFLICT (slot_name) DO UPDATE SET beat_at = EXCLUDED.beat_at")
    assert props["table.include.list"] == r"sales\.orders,public\.cdc_heartbeat"
    assert props["schema.include.list"] == "sales,public"
    assert props[HEARTBEAT_TOPICS_PROPERTY] == "shop.public.cdc_heartbeat"


def test_the_heartbeat_table_is_never_replicated():
    connector = _connector(heartbeat_table='ops."beats"', heartbeat_interval_seconds=10)
    assert postgres.debezium_properties(connector)["heartbeat.interval.ms"] == "10000"
    assert 'INSERT INTO "ops"."""beats"""' in postgres.heartbeat_query(connector)
    assert not captures(connector, 'ops."beats"') and captures(connector, "ops.orders")
    assert not captures(_connector(), "public.cdc_heartbeat")
