"""`linger_seconds`: a run that applied a change goes on streaming while changes keep coming, and ends once that long
passes without one (Dagster runs always; `cdc-pipeline sync` with --linger)."""

from __future__ import annotations

import threading
import time

import pytest

from cdc_pipeline.ops.cli import run_sync

pytestmark = pytest.mark.integration

LINGER = 5.0


def _arrived(pipeline, key: int, deadline: float = 60) -> float:
    ends = time.monotonic() + deadline
    while key not in {row[0] for row in pipeline.dest_rows("items")}:
        assert time.monotonic() < ends, f"row {key} did not arrive within {deadline} s"
        time.sleep(0.05)
    return time.monotonic()


def test_a_lingering_run_applies_the_changes_that_keep_coming_then_ends_after_the_linger(any_source):
    pipeline = any_source
    pipeline.write_config(linger_seconds=LINGER)  # idle_timeout_seconds: 2
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v INT)", "INSERT INTO items VALUES (1, 1)"])
    loaded = time.monotonic()
    pipeline.sync()
    assert time.monotonic() - loaded < 60
    pipeline.source("INSERT INTO items VALUES (2, 2)")
    summary: dict = {}
    run = threading.Thread(target=lambda: summary.update(run_sync(pipeline.name, linger=True)))
    run.start()
    _arrived(pipeline, 2)
    time.sleep(3)  # past the idle timeout: a run without linger would have ended
    assert run.is_alive(), "the run ended before linger_seconds without a change"
    pipeline.source("INSERT INTO items VALUES (3, 3)")
    arrived = _arrived(pipeline, 3, deadline=10)
    run.join(timeout=60)
    ended = time.monotonic()

    assert not run.is_alive()
    assert summary["events"] == 2, "one run applied both changes"
    # Its batch was fetched before it arrived: the linger counts from then, and the end waits for the idle mark.
    assert LINGER - 1.5 <= ended - arrived <= LINGER + 8, ended - arrived
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
