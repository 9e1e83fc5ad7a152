"""A connector's table observations and freshness results are evaluated at most every TABLE_EVALUATION_SECONDS per
instance (the change sensor runs every few seconds, and each evaluation reads the instance's asset and check records):
in between, the sensor records none."""

from __future__ import annotations

from pathlib import Path

from dagster import AssetCheckEvaluation, AssetKey, instance_for_test

from assets import observations
from assets.table_assets import FRESH_CHECK
from cdc_pipeline.config import parse_config


def _connector(name: str):
    return parse_config({
        "destination": {"dsn": "postgresql://cdc@127.0.0.1:9/warehouse"},
        "connectors": {name: {"type": "mariadb", "hostname": "127.0.0.1", "user": "cdc", "password": "x",
                              "database": "shop"}}}, Path("connectors.yaml")).connector(name)


def test_the_tables_are_evaluated_at_most_every_interval_per_connector_and_instance(monkeypatch):
    keys = [AssetKey(["shop", "orders"])]
    shop, other = _connector("shop"), _connector("other")
    with instance_for_test() as instance, instance_for_test() as second:
        first = observations.table_events(instance, shop, keys, None)
        # Never brought up to date: the freshness check fails, recorded once.
        assert [(event.asset_key, event.check_name, event.passed) for event in first
                if isinstance(event, AssetCheckEvaluation)] == [(keys[0], FRESH_CHECK, False)]
        for event in first:
            instance.report_runless_asset_event(event)
        assert observations.table_events(instance, shop, keys, None) == []
        # Another connector, another instance: each has its own interval.
        assert observations.table_events(instance, other, [AssetKey(["other", "orders"])], None)
        assert observations.table_events(second, shop, keys, None)
        # Once the interval has passed, evaluated again (the same result, recent: nothing new to record).
        monkeypatch.setattr(observations, "TABLE_EVALUATION_SECONDS", 0)
        assert observations.table_events(instance, shop, keys, None) == []
        monkeypatch.setattr(observations, "TABLE_OBSERVATION_SECONDS", 0)
        assert len(observations.table_events(instance, shop, keys, None)) == 1
