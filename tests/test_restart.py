"""A fetch cycle killed with SIGKILL in the middle of a large stream: the next runs finish the job exactly."""

from __future__ import annotations

import os
import signal
import time

import pytest

pytestmark = pytest.mark.integration

ROWS = 20_000


def _applied_events(pipeline) -> int:
    rows = pipeline.dest_query("SELECT coalesce(sum(events), 0) FROM cdc.stats WHERE connector = %s",
                               (pipeline.name,))
    return int(rows[0][0])


def test_run_killed_mid_stream_is_completed_by_the_next_run(pipeline):
    pipeline.source("CREATE TABLE readings (id INT PRIMARY KEY, sensor VARCHAR(20), value DECIMAL(12,3), at DATETIME(3))")
    pipeline.sync()
    baseline = _applied_events(pipeline)
    pipeline.source([
        f"INSERT INTO readings SELECT seq, CONCAT('sensor-', seq % 17), seq / 7, "
        f"TIMESTAMP('2024-01-01') + INTERVAL seq SECOND FROM seq_1_to_{ROWS}",
        "UPDATE readings SET value = value * 2 WHERE id % 3 = 0",
        "DELETE FROM readings WHERE id % 10 = 0",
        "INSERT INTO readings VALUES (100000, 'late', 1.5, NULL)",
    ])
    pipeline.write_config(batch_size=500, max_events_per_run=12_000)

    run = pipeline.sync_cli()
    deadline = time.monotonic() + 240
    try:
        while _applied_events(pipeline) == baseline:
            assert run.poll() is None, f"the run ended before it could be killed: {run.communicate()}"
            assert time.monotonic() < deadline, "no batch was applied within 240 s"
            time.sleep(0.05)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    applied_before_kill = _applied_events(pipeline) - baseline
    assert 0 < applied_before_kill < ROWS, "the run was killed after some, not all, of its batches committed"

    for _ in range(6):
        summary = pipeline.sync()
        # Caught up: a run that got nothing at all (a run that only skipped re-deliveries is not).
        if summary["events"] == 0 and summary["redelivered"] == 0:
            break
    else:
        pytest.fail("the connector did not catch up in 6 runs")

    pipeline.assert_same("readings")
    counted = pipeline.dest_query("SELECT inserts, updates, deletes, redelivered > 0 FROM cdc.stats WHERE connector = %s",
                                  (pipeline.name,))
    assert counted == [(ROWS + 1, ROWS // 3, ROWS // 10, True)], "every event is counted once, re-deliveries apart"
    state = pipeline.dest_query("SELECT state, last_error FROM cdc.connector_state WHERE connector = %s",
                                (pipeline.name,))
    assert state == [("stopped", None)]
