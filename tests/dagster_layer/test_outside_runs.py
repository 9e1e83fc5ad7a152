"""The `cdc_outside_runs` sensor against real servers: cycles run outside Dagster (the CLI's sync, in this process)
become runless materializations of the tables they wrote, with their rows and applied position, once each; none
while a Dagster run of the connector is in progress or its run lock is held; a table the definitions do not know
yet is left for the next reload."""

from __future__ import annotations

import psycopg
import pytest
from dagster import (
    AssetKey,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    Definitions,
    SensorResult,
    build_sensor_context,
)

from assets.definitions import build_definitions
from assets.outside_runs import SENSOR_NAME
from cdc_pipeline import control
from cdc_pipeline.config import load_config
from resources.destination import DestinationResource

pytestmark = pytest.mark.integration


def _evaluate(pipeline, instance: DagsterInstance, cursor: str | None, defs: Definitions | None = None
              ) -> SensorResult:
    """One evaluation of the sensor (of freshly loaded definitions unless given); its events recorded as the daemon
    records them."""
    defs = defs or build_definitions(load_config(pipeline.config_path))
    destination = DestinationResource(config_path=str(pipeline.config_path))
    context = build_sensor_context(instance=instance, cursor=cursor, definitions=defs,
                                   resources={"destination": destination})
    result = defs.resolve_sensor_def(SENSOR_NAME)(context)
    assert isinstance(result, SensorResult)
    for event in result.asset_events:
        instance.report_runless_asset_event(event)
    return result


def _materialized(result: SensorResult) -> dict[AssetKey, dict]:
    return {event.asset_key: {name: value.value for name, value in event.metadata.items()}
            for event in result.asset_events}


def test_cli_syncs_materialize_the_tables_they_wrote_once_and_never_during_a_run(pipeline):
    pipeline.source(["CREATE TABLE orders (id INT PRIMARY KEY, v VARCHAR(10))",
                     "INSERT INTO orders VALUES (1, 'a'), (2, 'b'), (3, 'c')",
                     "CREATE TABLE notes (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO notes VALUES (1, 'n')"])
    orders, notes = AssetKey([pipeline.dest_schema, "orders"]), AssetKey([pipeline.dest_schema, "notes"])
    connector = AssetKey(["cdc", pipeline.name])
    with DagsterInstance.ephemeral() as instance:
        first = build_definitions(load_config(pipeline.config_path))
        pipeline.sync()
        # Definitions loaded before the sync created the tables know none of them: the connector only.
        before = _evaluate(pipeline, instance, None, first)
        assert [event.asset_key for event in before.asset_events] == [connector]
        assert _materialized(before)[connector]["total_snapshot_rows"] == 4

        loaded = _evaluate(pipeline, instance, before.cursor)
        events = _materialized(loaded)
        assert set(events) == {orders, notes}
        assert (events[orders]["dagster/row_count"], events[notes]["dagster/row_count"]) == (3, 1)
        assert events[orders]["applied_at"] and events[orders]["source_table"] == f"{pipeline.source_db}.orders"
        assert instance.get_latest_materialization_event(orders).asset_materialization.metadata[
            "dagster/row_count"].value == 3
        # The same applied position is never recorded twice.
        again = _evaluate(pipeline, instance, loaded.cursor)
        assert again.asset_events == [] and again.skip_reason is not None

        pipeline.source(["INSERT INTO orders VALUES (4, 'd'), (5, 'e')", "DELETE FROM orders WHERE id = 1"])
        pipeline.sync()
        # While a Dagster run of the connector is in progress (it materializes its tables at its end), or any
        # process holds the connector's run lock, nothing is recorded.
        instance.add_run(DagsterRun(job_name=f"sync_{pipeline.name}", run_id="a" * 36,
                                    status=DagsterRunStatus.STARTED))
        during_run = _evaluate(pipeline, instance, again.cursor)
        assert during_run.asset_events == [] and "is started" in during_run.skip_reason.skip_message
        instance.delete_run("a" * 36)  # the run ended
        with psycopg.connect(pipeline.dest_dsn, autocommit=True) as lock:
            control.acquire_run_lock(lock, pipeline.name)
            locked = _evaluate(pipeline, instance, during_run.cursor)
            assert locked.asset_events == [] and "is running" in locked.skip_reason.skip_message
        changed = _materialized(_evaluate(pipeline, instance, locked.cursor))
        # Only the table the sync changed, with its rows now, and the connector.
        assert set(changed) == {connector, orders}
        assert changed[orders]["dagster/row_count"] == 4
        assert changed[orders]["applied_at"] > events[orders]["applied_at"]
        assert changed[connector]["total_inserts"] == 2 and changed[connector]["total_deletes"] == 1
