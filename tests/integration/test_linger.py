"""`linger_seconds`: a Dagster run that applied a change goes on streaming while changes keep coming, and ends once
that long passes without one; `cdc-pipeline sync` ends once caught up (unless --linger)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from dagster import AssetKey, instance_for_test

from assets.definitions import build_definitions
from cdc_pipeline import control
from cdc_pipeline.config import load_config

pytestmark = pytest.mark.integration

LINGER = 5.0


def _arrived(pipeline, key: int, deadline: float = 60) -> float:
    ends = time.monotonic() + deadline
    while key not in {row[0] for row in pipeline.dest_rows("items")}:
        assert time.monotonic() < ends, f"row {key} did not arrive within {deadline} s"
        time.sleep(0.05)
    return time.monotonic()


def test_a_dagster_run_applies_the_changes_that_keep_coming_then_ends_after_the_linger(any_source):
    pipeline = any_source
    pipeline.write_config(linger_seconds=LINGER)  # idle_timeout_seconds: 2
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v INT)", "INSERT INTO items VALUES (1, 1)"])
    pipeline.sync()  # the load: cdc-pipeline sync does not linger
    pipeline.source("INSERT INTO items VALUES (2, 2)")
    seen: dict = {}

    def write_while_it_runs() -> None:
        _arrived(pipeline, 2)
        time.sleep(3)  # past the idle timeout: a run without linger would have ended
        with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
            seen["running"] = control.run_lock_held(conn, pipeline.name)
        pipeline.source("INSERT INTO items VALUES (3, 3)")
        seen["arrived"] = _arrived(pipeline, 3, deadline=10)

    writer = threading.Thread(target=write_while_it_runs)
    writer.start()
    job = build_definitions(load_config(pipeline.config_path)).resolve_job_def(f"sync_{pipeline.name}")
    with instance_for_test() as instance:
        result = job.execute_in_process(instance=instance)
        ended = time.monotonic()
        recorded = instance.get_latest_materialization_event(AssetKey(["cdc", pipeline.name]))
    writer.join(timeout=30)

    assert result.success and seen["running"], "the run ended before linger_seconds without a change"
    assert recorded.asset_materialization.metadata["events"].value == 2, "one run applied both changes"
    # Its batch was fetched before it arrived: the linger counts from then, and the end waits for the idle mark.
    assert LINGER - 1.5 <= ended - seen["arrived"] <= LINGER + 8, ended - seen["arrived"]
    pipeline.assert_same("items")


def test_a_run_without_linger_ends_once_caught_up(pipeline):
    pipeline.write_config(linger_seconds=60)
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v INT)", "INSERT INTO items VALUES (1, 1)"])
    pipeline.sync()
    pipeline.source("INSERT INTO items VALUES (2, 2)")
    started = time.monotonic()
    assert pipeline.sync()["events"] == 1
    assert time.monotonic() - started < 30, "cdc-pipeline sync without --linger does not wait for linger_seconds"
    pipeline.assert_same("items")


def test_a_lingering_run_ends_once_caught_up_when_a_restart_awaits_the_next_run(pipeline):
    """A restart served while a run lingers is launched once that run ended (the request sensor waits for it): the
    run gives up the rest of its linger rather than hold the restart back for linger_seconds."""
    from cdc_pipeline.ops import requests
    from cdc_pipeline.ops.cli import run_sync

    pipeline.write_config(linger_seconds=120)
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v INT)", "INSERT INTO items VALUES (1, 1)"])
    pipeline.sync()
    pipeline.source("INSERT INTO items VALUES (2, 2)")
    asked: dict = {}

    def restart_while_it_lingers() -> None:
        _arrived(pipeline, 2)
        with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
            requests.submit_request(conn, "cdc", pipeline.name, requests.RESTART, "always")
            [outcome] = requests.serve_pending_requests(conn, "cdc", load_config(pipeline.config_path))
        asked["status"], asked["at"] = outcome.status, time.monotonic()

    asker = threading.Thread(target=restart_while_it_lingers)
    asker.start()
    assert run_sync(pipeline.name, linger=True)["events"] == 1
    ended = time.monotonic()
    asker.join(timeout=30)

    assert asked["status"] == requests.DONE
    assert ended - asked["at"] < 15, f"the run lingered {ended - asked['at']:.0f} s after the restart was served"
    with psycopg.connect(pipeline.dest_dsn) as conn:
        assert control.read_state(conn, "cdc", pipeline.name)["next_snapshot_mode"] == "always"
    pipeline.assert_same("items")
