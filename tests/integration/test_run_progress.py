"""`state` while a run streams: what waits in Debezium's queue and the runner's, the groups ahead, the group being
applied and the stages' rates, read from another connection; the run's summary keeps their peaks."""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any

import psycopg
import pytest

from cdc_pipeline import control
from cdc_pipeline.ops.cli import main
from tests.helpers.mariadb_source import Pipeline

pytestmark = pytest.mark.integration

BURST_PARTS, PART_ROWS = 6, 5000


def _state(pipeline: Pipeline, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["state", pipeline.name, "--json"]) == 0
    return json.loads(capsys.readouterr().out)[0]


def test_state_shows_the_queues_of_a_streaming_run(pipeline: Pipeline, capsys: pytest.CaptureFixture[str],
                                                   caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="cdc_pipeline.run_progress")
    pipeline.source("CREATE TABLE items (id INT PRIMARY KEY, note VARCHAR(200))")
    # Small groups: the burst's 30,000 changes wait in the queues while they are applied a few at a time.
    pipeline.write_config(apply_batch_events=1000, batch_size=500)
    pipeline.sync()
    pipeline.source([f"INSERT INTO items SELECT {part * PART_ROWS} + seq, REPEAT('x', 200) "
                     f"FROM {pipeline.numbers(PART_ROWS)}" for part in range(BURST_PARTS)])
    summary: dict[str, Any] = {}
    before = datetime.now(timezone.utc)
    run = threading.Thread(target=lambda: summary.update(pipeline.sync()))
    run.start()
    seen, text = [], ""
    while run.is_alive():
        live = _state(pipeline, capsys).get("run_progress")
        if live:
            seen.append(live)
            if not text:
                assert main(["state", pipeline.name]) == 0
                out = capsys.readouterr().out
                text = out if "  running now, as of " in out else ""  # unless the run ended in between
        time.sleep(0.5)
    run.join()

    assert seen, "state showed no progress while the run streamed"
    assert all(live["age_seconds"] < 10 and datetime.fromisoformat(live["run_started_at"]) > before
               for live in seen), seen
    assert any(live["engine_queue"] and live["engine_queue"]["events"] + live["queued_events"] > 0
               for live in seen), seen
    assert all(live["engine_queue"]["mbean"].startswith("debezium.mariadb:type=connector-metrics,context=streaming")
               for live in seen if live["streaming"] and live["engine_queue"]), seen
    assert any(live["applying"] and live["applying"]["events"] > 0 for live in seen), seen
    assert any(live["rates"].get("applied", 0) > 0 and live["rates"].get("captured", 0) > 0 for live in seen), seen
    assert "    Debezium's queue: " in text and "    runner's queue: " in text, text
    logged = [record.getMessage() for record in caplog.records if record.name == "cdc_pipeline.run_progress"]
    assert any(f"{pipeline.name}: Debezium's queue: " in line and "; runner's queue: " in line for line in logged), logged
    assert _state(pipeline, capsys).get("run_progress") is None, "the run ended: state shows no progress"
    assert summary["inserts"] == BURST_PARTS * PART_ROWS
    assert summary["queue_peak_debezium_events"] + summary["queue_peak_runner_events"] > 0
    assert summary["rate_peak_applied_events_per_second"] > 0
    pipeline.assert_same("items")


def test_state_never_shows_a_row_an_earlier_run_left_as_the_running_one(pipeline: Pipeline,
                                                                       capsys: pytest.CaptureFixture[str]):
    # A run killed leaves its progress row; the next run takes the lock a moment before it clears the row.
    pipeline.source("CREATE TABLE items (id INT PRIMARY KEY)")
    pipeline.sync()
    schema = "cdc"
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as earlier, \
            psycopg.connect(pipeline.dest_dsn, autocommit=True) as running:
        control.record_run_progress(earlier, schema, pipeline.name, datetime.now(timezone.utc),
                                    {"session_pid": earlier.info.backend_pid, "applied_events": 7})
        control.acquire_run_lock(running, pipeline.name)
        assert _state(pipeline, capsys).get("run_progress") is None
        control.record_run_progress(running, schema, pipeline.name, datetime.now(timezone.utc),
                                    {"session_pid": running.info.backend_pid, "applied_events": 9})
        assert _state(pipeline, capsys)["run_progress"]["applied_events"] == 9
        control.release_run_lock(running, pipeline.name)
        assert _state(pipeline, capsys).get("run_progress") is None
