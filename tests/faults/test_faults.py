"""Faults in the middle of a run: the destination PostgreSQL or the source MariaDB restarts while batches commit.
Nothing is lost or applied twice, and the runs that follow finish the job exactly (every count once)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from cdc_pipeline.testing.servers import start_mariadb, start_postgres
from tests.helpers.mariadb_source import CAPTURE_PASSWORD, CAPTURE_USER, Pipeline, new_pipeline

pytestmark = pytest.mark.integration

READINGS = "CREATE TABLE readings (id INT PRIMARY KEY, sensor VARCHAR(20), value DECIMAL(12,3))"
AUDIT_LOG = "CREATE TABLE audit_log (actor VARCHAR(20), amount INT)"  # no key, duplicate rows
STATS = ("events", "inserts", "updates", "deletes", "redelivered")


@pytest.fixture
def own_destination(mariadb, spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    """A pipeline whose destination PostgreSQL is its own, so the test may restart it."""
    with start_postgres() as server:
        yield new_pipeline(mariadb, server, tmp_path, monkeypatch)


@pytest.fixture
def own_source(destination_pg, spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    """A pipeline whose source MariaDB is its own, so the test may restart it."""
    with start_mariadb() as server:
        server.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
        yield new_pipeline(server, destination_pg, tmp_path, monkeypatch)


def _wait_for_a_commit(pipeline, run, baseline: dict[str, int]) -> None:
    deadline = time.monotonic() + 240
    while pipeline.stats(STATS)["events"] == baseline["events"]:
        assert run.poll() is None, f"the run ended before the restart: {run.communicate()}"
        assert time.monotonic() < deadline, "no batch was applied within 240 s"
        time.sleep(0.05)


SOURCE_STREAM = [
    "INSERT INTO readings SELECT seq, CONCAT('s-', seq % 7), seq / 3 FROM seq_1_to_8000",
    "UPDATE readings SET value = -value WHERE id % 4 = 0",
    "INSERT INTO audit_log SELECT CONCAT('a-', seq % 30), seq % 3 FROM seq_1_to_2000",
]
AFTER_RESTART = [  # the source restart test writes these after the restart, into the next binlog file
    "DELETE FROM readings WHERE id % 9 = 0",
    "UPDATE audit_log SET amount = 10 WHERE amount = 0 LIMIT 300",
    "DELETE FROM audit_log WHERE amount = 1 LIMIT 200",
]


def _assert_source_changes_counted_once(pipeline, baseline: dict[str, int]) -> None:
    pipeline.catch_up("readings", "audit_log")
    stats = pipeline.stats(STATS)
    assert (stats["inserts"] - baseline["inserts"], stats["updates"], stats["deletes"]) == (
        10000, 2000 + 300, 888 + 200), "every change is counted once"
    state = pipeline.dest_query("SELECT state, last_error FROM cdc.connector_state WHERE connector = %s",
                                (pipeline.name,))
    assert state == [("syncing", None)]


def test_destination_restarted_mid_run(own_destination):
    pipeline = own_destination
    pipeline.source([READINGS, AUDIT_LOG])
    pipeline.sync()
    baseline = pipeline.stats(STATS)
    pipeline.source(SOURCE_STREAM + AFTER_RESTART)
    pipeline.write_config(batch_size=500, apply_batch_events=2000)

    run = pipeline.sync_cli()
    _wait_for_a_commit(pipeline, run, baseline)
    pipeline.destination.restart()
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 1, "the run fails when its destination goes away"
    assert f"sync of connector '{pipeline.name}' failed" in stderr

    _assert_source_changes_counted_once(pipeline, baseline)


def _run_streaming(pipeline, **config) -> tuple[dict[str, int], subprocess.Popen]:
    """Creates the tables and syncs them; then writes SOURCE_STREAM and starts a run of it that has committed a
    batch. Returns the stats before the stream and the run."""
    pipeline.source([READINGS, AUDIT_LOG])
    pipeline.sync()
    baseline = pipeline.stats(STATS)
    pipeline.source(SOURCE_STREAM)
    pipeline.write_config(batch_size=500, apply_batch_events=2000, idle_timeout_seconds=20, **config)
    run = pipeline.sync_cli()
    _wait_for_a_commit(pipeline, run, baseline)
    return baseline, run


# The binlog client's keep-alive thread reconnects at its next check, one to two intervals after the loss: at the
# default 60 s (within source_lost_timeout_seconds: tests/unit/sources/test_sources_mariadb.py) the test would wait
# for it up to 120 s.
RECONNECT_SOON = {"debezium": {"connect.keep.alive.interval.ms": "10000"}}


def test_source_restarted_mid_run(own_source):
    pipeline = own_source
    baseline, run = _run_streaming(pipeline, **RECONNECT_SOON)
    pipeline.mariadb.restart()
    pipeline.source(AFTER_RESTART)
    stdout, stderr = run.communicate(timeout=300)

    assert run.returncode == 0, stderr
    assert "13388 events" in stdout, "Debezium reconnected and the run went on with the changes made after the restart"
    _assert_source_changes_counted_once(pipeline, baseline)


def test_source_down_longer_than_the_run_waits(own_source):
    pipeline = own_source
    baseline, run = _run_streaming(pipeline, source_lost_timeout_seconds=3)
    outcome: list[str] = []
    pipeline.mariadb.restart(while_down=lambda: outcome.extend(run.communicate(timeout=300)))
    pipeline.source(AFTER_RESTART)

    assert run.returncode == 1, "the run fails while the source is down"
    assert "did not reconnect within 3 s (source_lost_timeout_seconds)" in outcome[1]
    error = pipeline.dest_query("SELECT last_error FROM cdc.connector_state WHERE connector = %s", (pipeline.name,))
    assert "did not reconnect" in error[0][0]
    _assert_source_changes_counted_once(pipeline, baseline)


@pytest.mark.parametrize("keep_alive_ms", [None, 5000])
def test_a_long_apply_keeps_the_binlog_connection_and_applies_each_change_once(pipeline, keep_alive_ms):
    """While a group waits on the destination (here a lock the test holds for 15 s), capture fills its queues and
    Debezium's binlog reader stops reading. With the connector's defaults its keep-alive does not take that for a lost
    connection: the run keeps its one binlog connection. With a 5 s check it does, and the reader reconnects and
    gives the source's transaction again from its start: the run skips what it planned already (counted as
    re-delivered), and a keyless table still gets each row once. (The suite's MariaDB: the source is not restarted,
    and the server log's binlog dumps are counted from the test's start.)"""
    pipeline.source([READINGS, AUDIT_LOG])
    pipeline.sync()
    baseline = pipeline.stats(STATS)
    # One transaction larger than the engine's queue (8,192 events), the runner's (4 batches of 200) and the groups
    # in flight (400 events each) together: the reader is held in its middle.
    pipeline.source(["INSERT INTO audit_log SELECT CONCAT('a-', seq % 30), seq % 3 FROM seq_1_to_12000",
                     "INSERT INTO readings SELECT seq, CONCAT('s-', seq % 7), seq / 3 FROM seq_1_to_500"])
    pipeline.write_config(batch_size=200, apply_batch_events=400, **(
        {"debezium": {"connect.keep.alive.interval.ms": str(keep_alive_ms)}} if keep_alive_ms else {}))
    dumps_before = pipeline.mariadb.log_file.read_text().count("Start binlog_dump")
    audit_log = sql.Identifier(pipeline.dest_schema, "audit_log")
    with psycopg.connect(pipeline.dest_dsn) as blocker:
        blocker.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(audit_log))
        run = pipeline.sync_cli()
        # The 15 s count from the moment the run's apply waits on the lock, not from the run's start.
        deadline = time.monotonic() + 240
        waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = to_regclass(%s)"
        while blocker.execute(waiting, (audit_log.as_string(blocker),)).fetchone()[0] == 0:
            assert run.poll() is None, f"the run ended before it waited on the lock: {run.communicate()}"
            assert time.monotonic() < deadline, "the run's apply never waited on the lock"
            time.sleep(0.1)
        time.sleep(15)
    stdout, stderr = run.communicate(timeout=300)

    assert run.returncode == 0, stderr
    connections = pipeline.mariadb.log_file.read_text().count("Start binlog_dump") - dumps_before
    pipeline.assert_same("audit_log", "readings")
    stats = pipeline.stats(STATS)
    assert stats["inserts"] - baseline["inserts"] == 12500, "each change applied once"
    if keep_alive_ms is None:
        assert (connections, stats["redelivered"]) == (1, 0), "the run read the binlog through one connection"
    else:
        assert connections > 1 and stats["redelivered"] > 0, "the reader reconnected and its repeats were skipped"
