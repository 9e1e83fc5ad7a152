"""The table assets against real servers: their keys (the destination's schema and table, in the connector's group)
after a run, the metadata a sync run records on the tables it changed, `dagster asset materialize` of one table
asset (the real CLI), and what the change sensor records while the connector is idle (its lag, the tables'
caught-up observations and freshness)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetKey,
    AssetObservation,
    DagsterInstance,
    Definitions,
    RunRequest,
    SensorResult,
    build_sensor_context,
    instance_for_test,
)

from assets.definitions import build_definitions
from assets.table_assets import FRESH_CHECK, LAST_UPDATED
from cdc_pipeline import control
from cdc_pipeline.config import load_config
from cdc_pipeline.ops import lag
from resources.destination import DestinationResource
from tests.dagster_layer.automations import automations
from tests.helpers import PROJECT_ROOT

pytestmark = pytest.mark.integration


def _connector_assets(defs: Definitions, name: str) -> set[AssetKey]:
    """The assets in the connector's group (its own and its tables')."""
    return {spec.key for spec in defs.resolve_all_asset_specs() if spec.group_name == name}


def _materialization(instance: DagsterInstance, key: AssetKey) -> dict:
    event = instance.get_latest_materialization_event(key)
    assert event is not None, f"no materialization of {key.to_user_string()}"
    return {name: value.value for name, value in event.asset_materialization.metadata.items()}


def test_table_assets_after_runs_and_materialize_of_one_with_the_cli(pipeline):
    pipeline.source(["CREATE TABLE orders (id INT PRIMARY KEY, v VARCHAR(10))",
                     "INSERT INTO orders VALUES (1, 'a'), (2, 'b'), (3, 'c')",
                     "CREATE TABLE notes (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO notes VALUES (1, 'n')"])
    config = load_config(pipeline.config_path)
    # Before any run the control schema records no table: the connector's asset only.
    assert _connector_assets(build_definitions(config), pipeline.name) == {AssetKey(["cdc", pipeline.name])}
    orders, notes = AssetKey([pipeline.dest_schema, "orders"]), AssetKey([pipeline.dest_schema, "notes"])

    with DagsterInstance.get() as instance:
        assert build_definitions(config).resolve_job_def(f"sync_{pipeline.name}").execute_in_process(
            instance=instance).success
        loaded = _materialization(instance, orders)
        assert loaded["dagster/row_count"] == 3 and loaded["bulk_snapshot/rows_done"] == 3

        pipeline.source(["INSERT INTO orders VALUES (4, 'd'), (5, 'e')", "UPDATE orders SET v = 'B' WHERE id = 2",
                         "DELETE FROM orders WHERE id = 1"])
        defs = build_definitions(config)
        assert _connector_assets(defs, pipeline.name) == {AssetKey(["cdc", pipeline.name]), orders, notes}
        # Each table's page lists the change sensor and the schedule as its automations.
        assert automations(defs, orders) == ({f"sync_{pipeline.name}_on_changes", "cdc_requests"},
                                             {f"sync_{pipeline.name}_schedule"})
        notes_before = instance.get_latest_materialization_event(notes).run_id

        # One table asset selected: the cycle applies every change of the connector, and records the table it
        # changed (orders) with the selected one (notes, unchanged).
        dagster = Path(sys.executable).parent / "dagster"
        result = subprocess.run([str(dagster), "asset", "materialize", "-m", "assets.definitions", "--select",
                                 notes.to_user_string()], cwd=PROJECT_ROOT,
                                env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        pipeline.assert_same("orders", "notes")

        changed = _materialization(instance, orders)
        assert (changed["inserts"], changed["updates"], changed["deletes"]) == (2, 1, 1)
        assert changed["dagster/row_count"] == 4
        assert changed["applied_position"]["file"] and changed["source_table"] == f"{pipeline.source_db}.orders"
        # The source commit the destination is consistent as of, on the table's and on the run's materialization.
        assert changed["consistent"] is True and changed["consistent_as_of"] == changed["applied_position"]
        assert changed["consistent_as_of_source_time"] > 0
        run = instance.get_latest_materialization_event(AssetKey(["cdc", pipeline.name])).asset_materialization
        assert run.metadata["consistent_as_of"].value == changed["consistent_as_of"]
        selected = instance.get_latest_materialization_event(notes)
        assert selected.run_id != notes_before
        assert selected.asset_materialization.metadata["inserts"].value == 0
        assert selected.asset_materialization.metadata["dagster/row_count"].value == 1
        assert instance.get_latest_materialization_event(AssetKey(["cdc", pipeline.name])) is not None


def test_the_change_sensor_records_lag_and_freshness_while_idle(pipeline):
    pipeline.source(["CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO t VALUES (1, 'x')"])
    pipeline.sync()
    pipeline.sync()  # ends idle: the source's position is recorded as read
    config = load_config(pipeline.config_path)
    sensor = build_definitions(config).resolve_sensor_def(f"sync_{pipeline.name}_on_changes")
    table = AssetKey([pipeline.dest_schema, "t"])

    def evaluate(instance):
        with build_sensor_context(instance=instance, resources={
                "destination": DestinationResource(config_path=str(config.path))}) as context:
            result = sensor(context)
        assert isinstance(result, SensorResult)
        return result

    with instance_for_test() as instance:
        idle = evaluate(instance)
        assert not idle.run_requests
        observed = {event.asset_key: event for event in idle.asset_events if isinstance(event, AssetObservation)}
        connector = observed[AssetKey(["cdc", pipeline.name])].metadata
        assert connector["caught_up"].value is True and connector["lag_bytes"].value == 0
        assert connector["lag_events"].value == 0
        assert LAST_UPDATED in observed[table].metadata
        fresh = [event for event in idle.asset_events if isinstance(event, AssetCheckEvaluation)]
        assert [(event.asset_key, event.check_name, event.passed) for event in fresh] == [(table, FRESH_CHECK, True)]

        pipeline.source(["INSERT INTO t VALUES (2, 'y')", "UPDATE t SET v = 'z' WHERE id = 1"])
        behind = evaluate(instance)
        assert behind.run_requests and isinstance(behind.run_requests[0], RunRequest)
        connector = {event.asset_key: event for event in behind.asset_events}[AssetKey(["cdc", pipeline.name])]
        assert connector.metadata["caught_up"].value is False
        assert connector.metadata["lag_bytes"].value > 0 and connector.metadata["lag_events"].value >= 4

        # A cycle the sensor did not launch (a materialization of the assets, the CLI) holds the run lock: no run.
        with psycopg.connect(pipeline.dest_dsn, autocommit=True) as holder:
            control.acquire_run_lock(holder, pipeline.name)
            busy = evaluate(instance)
        assert not busy.run_requests and "run lock" in busy.skip_reason.skip_message


def test_a_table_renamed_by_a_rule_has_its_new_key_when_the_definitions_reload(pipeline):
    from cdc_pipeline.ops.cli import main

    pipeline.source(["CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)"])
    pipeline.sync()
    assert main(["objmap", "add", pipeline.name, "table", f"{pipeline.source_db}.t", "renamed.t2"]) == 0
    assert main(["objmap", "reload", pipeline.name]) == 0

    keys = _connector_assets(build_definitions(load_config()), pipeline.name)
    assert keys == {AssetKey(["cdc", pipeline.name]), AssetKey(["renamed", "t2"])}


def test_the_lag_of_a_postgres_connector_is_its_slot_wal_diff(pg_pipeline):
    pg_pipeline.source(["CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, 'x')"])
    pg_pipeline.sync()
    config = load_config(pg_pipeline.config_path)
    connector = config.connector(pg_pipeline.name)
    before = lag.measure(connector, config.destination)

    pg_pipeline.source(["INSERT INTO t SELECT g, repeat('v', 100) FROM generate_series(2, 500) g"])
    after = lag.measure(connector, config.destination)

    assert before is not None and after is not None
    assert after.bytes - before.bytes > 500 * 100
    assert after.position.startswith(f"slot {connector.replication_slot} at ")
    with psycopg.connect(pg_pipeline.source_dsn, autocommit=True) as source:
        assert source.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, confirmed_flush_lsn) FROM pg_replication_slots "
                              "WHERE slot_name = %s", (after.source_position, connector.replication_slot)
                              ).fetchone()[0] == after.bytes
