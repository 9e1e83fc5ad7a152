"""The change check behind the `trigger: changes` sensor, against real servers: no work once a connector has caught
up and ended idle, none for writes to other tables, work (naming the table) once a captured table changes, and the
Dagster sensor launching a run only then; the same from a PostgreSQL source through its slot."""

from __future__ import annotations

import json
import time

import pytest
from dagster import RunRequest, SensorResult, SkipReason, build_sensor_context, instance_for_test

from assets.definitions import build_definitions
from cdc_pipeline.ops import pending
from cdc_pipeline.ops.cli import main
from cdc_pipeline.config import load_config
from resources.destination import DestinationResource
from tests.helpers.postgres_source import SOURCE_SCHEMA, PostgresPipeline
from tests.helpers.mariadb_source import Pipeline

pytestmark = pytest.mark.integration


def _check(name: str) -> pending.Pending:
    """The check once the source could be checked: a run's replication connection (its slot in use) may outlive
    the run by a moment."""
    config = load_config()
    deadline = time.monotonic() + 10
    found = pending.check(config.connector(name), config.destination)
    while not found.known and "is in use" in found.reason and time.monotonic() < deadline:
        time.sleep(0.1)
        found = pending.check(config.connector(name), config.destination)
    return found


def _check_soon(name: str) -> pending.Pending:
    """The check once it finds work, or after 5 s: the test server commits asynchronously
    (`synchronous_commit=off`), and a slot is decoded up to the WAL flushed."""
    deadline = time.monotonic() + 5
    found = _check(name)
    while not found.work and time.monotonic() < deadline:
        time.sleep(0.2)
        found = _check(name)
    return found


def _sensor(pipeline, name: str):
    config = load_config()
    defs = build_definitions(config)
    sensor = defs.resolve_sensor_def(f"sync_{name}_on_changes")
    with instance_for_test() as instance:
        with build_sensor_context(instance=instance, resources={
                "destination": DestinationResource(config_path=str(pipeline.config_path))}) as context:
            result = sensor(context)
    # The sensor's result also records the connector's lag: its decision is the run request or the skip.
    assert isinstance(result, SensorResult)
    return result.run_requests[0] if result.run_requests else result.skip_reason


def test_a_run_is_launched_only_after_a_change_of_a_captured_table(pipeline: Pipeline, capsys):
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v TEXT)", "CREATE TABLE other (id INT PRIMARY KEY)",
                     "INSERT INTO items VALUES (1, 'a')"])
    pipeline.write_config(tables=[f"{pipeline.source_db}.items"])
    assert _check(pipeline.name) == pending.Pending(True, "the connector has not run yet")
    assert isinstance(_sensor(pipeline, pipeline.name), RunRequest)

    pipeline.sync()
    idle = _check(pipeline.name)
    assert not idle.work and "no binlog event since" in idle.reason
    assert isinstance(_sensor(pipeline, pipeline.name), SkipReason)
    checked = pipeline.dest_query("SELECT source_checked FROM cdc.connector_state WHERE connector = %s",
                                  (pipeline.name,))[0][0]

    # Writes to a table the connector does not capture: no run, and the position checked moves past them.
    pipeline.source(["INSERT INTO other VALUES (1), (2)", "DELETE FROM other WHERE id = 1"])
    elsewhere = _check(pipeline.name)
    assert not elsewhere.work and "no change of the connector's tables" in elsewhere.reason
    moved = pipeline.dest_query("SELECT source_checked FROM cdc.connector_state WHERE connector = %s",
                                (pipeline.name,))[0][0]
    assert (moved["file"], moved["pos"]) > (checked["file"], checked["pos"])
    assert _check(pipeline.name).reason.startswith("no binlog event since")

    pipeline.source(["INSERT INTO other VALUES (3)", "UPDATE items SET v = 'b' WHERE id = 1"])
    changed = _check(pipeline.name)
    assert changed.work and f"a change of {pipeline.source_db}.items" in changed.reason
    result = _sensor(pipeline, pipeline.name)
    assert isinstance(result, RunRequest) and "items" in result.tags["cdc/trigger"]
    assert main(["pending", pipeline.name, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[pipeline.name]["work"] is True

    pipeline.sync()
    pipeline.assert_same("items")
    assert not _check(pipeline.name).work
    assert main(["pending", pipeline.name]) == 1
    assert "no work" in capsys.readouterr().out

    # A paused connector has no work whatever its source holds.
    pipeline.source(["DELETE FROM items"])
    assert main(["pause", pipeline.name]) == 0
    main(["requests", "--serve"])
    assert _check(pipeline.name) == pending.Pending(False, "the connector is paused")


def test_a_postgresql_connector_is_checked_through_its_slot(pg_pipeline: PostgresPipeline):
    pg_pipeline.source(["CREATE TABLE items (id integer PRIMARY KEY, v text)",
                        "CREATE TABLE other (id integer PRIMARY KEY)", "INSERT INTO items VALUES (1, 'a')"])
    pg_pipeline.write_config(tables=[f"{SOURCE_SCHEMA}.items"])
    pg_pipeline.sync()
    quiet = _check(pg_pipeline.name)
    assert not quiet.work and "holds no change" in quiet.reason, quiet

    pg_pipeline.source(["INSERT INTO other VALUES (1)"])
    assert not _check_soon(pg_pipeline.name).work, "a table outside the publication launches nothing"
    pg_pipeline.source(["UPDATE items SET v = 'b'"])
    changed = _check_soon(pg_pipeline.name)
    assert changed.work and "holds changes" in changed.reason
    pg_pipeline.sync()
    pg_pipeline.assert_same("items")
    assert not _check(pg_pipeline.name).work, "the changes applied are confirmed to the slot"


def test_state_shows_the_wal_a_postgresql_connector_slot_retains(pg_pipeline: PostgresPipeline, capsys):
    pg_pipeline.source(["CREATE TABLE items (id integer PRIMARY KEY, v text)"])
    pg_pipeline.write_config(tables=[f"{SOURCE_SCHEMA}.items"])
    assert main(["state", pg_pipeline.name, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["source_slot"] is None, "no slot before the first run"
    pg_pipeline.sync()
    # WAL written after the slot's restart point (other tables count too: the slot keeps all WAL after it).
    pg_pipeline.source(["CREATE TABLE other AS SELECT i, repeat('x', 500) AS t FROM generate_series(1, 20000) AS i"])
    assert main(["state", pg_pipeline.name, "--json"]) == 0
    slot = json.loads(capsys.readouterr().out)[0]["source_slot"]
    assert slot["slot"] == f"cdc_{pg_pipeline.name}" and not slot["active"] and slot["wal_status"] == "reserved"
    assert slot["retained_wal_bytes"] > 10_000_000 and "warning" not in slot
    assert main(["state", pg_pipeline.name]) == 0
    assert f"replication slot: cdc_{pg_pipeline.name} retains" in capsys.readouterr().out

    # Each run's materialization of the connector's asset carries it too.
    from dagster import AssetKey, DagsterInstance

    from assets.definitions import build_definitions

    job = build_definitions(load_config()).resolve_job_def(f"sync_{pg_pipeline.name}")
    with DagsterInstance.ephemeral() as instance:
        assert job.execute_in_process(instance=instance).success
        event = instance.get_latest_materialization_event(AssetKey(["cdc", pg_pipeline.name]))
    assert event.asset_materialization.metadata["source_slot/retained_wal_mb"].value >= 0


def test_a_sync_with_nothing_to_do_starts_no_jvm_and_one_with_work_runs(pipeline: Pipeline):
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v TEXT)", "CREATE TABLE other (id INT PRIMARY KEY)",
                     "INSERT INTO items VALUES (1, 'a')"])
    pipeline.write_config(tables=[f"{pipeline.source_db}.items"])
    assert "nothing_to_do" not in pipeline.sync()

    # Nothing changed, or only a table it does not capture: the sync ends at the change check.
    pipeline.source(["INSERT INTO other VALUES (1)"])
    idle = pipeline.sync()
    assert idle["events"] == 0 and "no change of the connector's tables" in idle["nothing_to_do"]

    # Another configuration may have work the check cannot see (a setting changed): a cycle runs.
    pipeline.write_config(tables=[f"{pipeline.source_db}.items"], batch_size=1000)
    assert "nothing_to_do" not in pipeline.sync()
    assert "nothing_to_do" in pipeline.sync()

    pipeline.source(["UPDATE items SET v = 'b' WHERE id = 1"])
    changed = pipeline.sync()
    assert "nothing_to_do" not in changed and changed["updates"] == 1
    pipeline.assert_same("items")
