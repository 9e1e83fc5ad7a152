"""Faults in the middle of a run: the destination PostgreSQL restarts while batches commit. The run fails with a
clear error, nothing is lost or applied twice, and the next runs finish the job exactly (every count once)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from cdc_pipeline.servers import start_postgres
from conftest import CAPTURE_PASSWORD, Pipeline

pytestmark = pytest.mark.integration

READINGS = "CREATE TABLE readings (id INT PRIMARY KEY, sensor VARCHAR(20), value DECIMAL(12,3))"
AUDIT_LOG = "CREATE TABLE audit_log (actor VARCHAR(20), amount INT)"  # no key, duplicate rows
STATS = ("events", "inserts", "updates", "deletes", "redelivered")


@pytest.fixture
def own_destination(mariadb, spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    """A pipeline whose destination PostgreSQL is its own, so the test may restart it."""
    server = start_postgres()
    suffix = uuid.uuid4().hex[:8]
    pipe = Pipeline(mariadb, server, name=f"c_{suffix}", source_db=f"src_{suffix}", dest_db=f"dst_{suffix}",
                    config_path=tmp_path / "connectors.yaml")
    mariadb.execute(f"CREATE DATABASE `{pipe.source_db}`")
    server.create_database(pipe.dest_db)
    pipe.write_config()
    pipe.env = {"CDC_PIPELINE_CONFIG": str(pipe.config_path), "TEST_SOURCE_PASSWORD": CAPTURE_PASSWORD,
                "TEST_DEST_DSN": pipe.dest_dsn, "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    (tmp_path / "dagster_home").mkdir()
    (tmp_path / "dagster_home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    for key, value in pipe.env.items():
        monkeypatch.setenv(key, value)
    try:
        yield pipe
    finally:
        server.stop()


def _stats(pipeline) -> dict[str, int]:
    rows = pipeline.dest_query(f"SELECT {', '.join(STATS)} FROM cdc.stats WHERE connector = %s", (pipeline.name,))
    return dict(zip(STATS, map(int, rows[0]))) if rows else dict.fromkeys(STATS, 0)


def test_destination_restarted_mid_run(own_destination):
    pipeline = own_destination
    pipeline.source([READINGS, AUDIT_LOG])
    pipeline.sync()
    baseline = _stats(pipeline)
    pipeline.source([
        "INSERT INTO readings SELECT seq, CONCAT('s-', seq % 7), seq / 3 FROM seq_1_to_8000",
        "UPDATE readings SET value = -value WHERE id % 4 = 0",
        "DELETE FROM readings WHERE id % 9 = 0",
        "INSERT INTO audit_log SELECT CONCAT('a-', seq % 30), seq % 3 FROM seq_1_to_2000",
        "UPDATE audit_log SET amount = 10 WHERE amount = 0 LIMIT 300",
        "DELETE FROM audit_log WHERE amount = 1 LIMIT 200",
    ])
    pipeline.write_config(batch_size=500, apply_batch_events=2000)

    run = pipeline.sync_cli()
    deadline = time.monotonic() + 240
    while _stats(pipeline)["events"] == baseline["events"]:
        assert run.poll() is None, f"the run ended before the restart: {run.communicate()}"
        assert time.monotonic() < deadline, "no batch was applied within 240 s"
        time.sleep(0.05)
    pipeline.destination.restart()
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 1, "the run fails when its destination goes away"
    assert f"sync of connector '{pipeline.name}' failed" in stderr

    pipeline.catch_up("readings", "audit_log")
    stats = _stats(pipeline)
    assert (stats["inserts"] - baseline["inserts"], stats["updates"], stats["deletes"]) == (
        10000, 2000 + 300, 888 + 200), "every change is counted once"
    state = pipeline.dest_query("SELECT state, last_error FROM cdc.connector_state WHERE connector = %s",
                                (pipeline.name,))
    assert state == [("syncing", None)], "the last cycle succeeded: the error is cleared"
