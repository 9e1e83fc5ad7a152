"""`state` while a run streams: what waits in Debezium's queue and the runner's, the groups ahead, the group being
applied and the stages' rates, read from another connection; the run's summary keeps their peaks."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from cdc_pipeline.ops.cli import main
from tests.helpers.mariadb_source import Pipeline

pytestmark = pytest.mark.integration

BURST = [f"INSERT INTO items SELECT {part * 5000} + seq, REPEAT('x', 200) FROM seq_1_to_5000" for part in range(6)]


def _state(pipeline: Pipeline, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["state", pipeline.name, "--json"]) == 0
    return json.loads(capsys.readouterr().out)[0]


def test_state_shows_the_queues_of_a_streaming_run(pipeline: Pipeline, capsys: pytest.CaptureFixture[str]):
    pipeline.source("CREATE TABLE items (id INT PRIMARY KEY, note VARCHAR(200))")
    # Small groups: the burst's 30,000 changes wait in the queues while they are applied a few at a time.
    pipeline.write_config(apply_batch_events=1000, batch_size=500)
    pipeline.sync()
    pipeline.source(BURST)
    summary: dict[str, Any] = {}
    run = threading.Thread(target=lambda: summary.update(pipeline.sync()))
    run.start()
    seen = []
    while run.is_alive():
        live = _state(pipeline, capsys).get("run_progress")
        if live:
            seen.append(live)
        time.sleep(0.5)
    run.join()

    assert seen, "state showed no progress while the run streamed"
    assert all(live["age_seconds"] < 10 for live in seen)
    assert any(live["engine_queue"] and live["engine_queue"]["events"] + live["queued_events"] > 0 for live in seen)
    assert all(live["engine_queue"]["mbean"].startswith("debezium.mariadb:type=connector-metrics,context=streaming")
               for live in seen if live["streaming"] and live["engine_queue"])
    assert any(live["applying"] and live["applying"]["events"] > 0 for live in seen)
    assert any(live["rates"].get("applied", 0) > 0 and live["rates"].get("captured", 0) > 0 for live in seen)
    assert _state(pipeline, capsys).get("run_progress") is None, "the run ended: state shows no progress"
    assert summary["inserts"] == 30_000
    assert summary["queue_peak_debezium_events"] + summary["queue_peak_runner_events"] > 0
    assert summary["rate_peak_applied_events_per_second"] > 0
    pipeline.assert_same("items")
