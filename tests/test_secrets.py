"""Source and destination passwords never reach logs, Dagster's run storage or the control schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import CAPTURE_PASSWORD

pytestmark = pytest.mark.integration

DEST_PASSWORD = "dest-pw-4e1b9c"


def test_passwords_stay_out_of_logs_and_run_storage(pipeline):
    pipeline.source(["CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO t VALUES (1, 'x')"])
    # The throwaway destination trusts local connections: the password is carried everywhere, checked nowhere.
    pipeline.env["TEST_DEST_DSN"] = pipeline.destination.dsn(pipeline.dest_db, user="postgres", password=DEST_PASSWORD)
    pipeline.env["CDC_SPARK_LOG_LEVEL"] = "INFO"
    pipeline.env["CDC_RUNNER_LOG_LEVEL"] = "DEBUG"

    run = pipeline.sync_cli("-v")
    out, err = run.communicate(timeout=600)

    assert run.returncode == 0, err[-3000:]
    assert "Starting Debezium engine" in err or "Starting Debezium engine" in out, "the engine's INFO log was shown"
    for secret in (CAPTURE_PASSWORD, DEST_PASSWORD):
        leaks = [line for line in (out + err).splitlines() if secret in line]
        assert not leaks, f"{secret!r} appears in the output: {leaks[:3]}"
        for stored in Path(pipeline.env["DAGSTER_HOME"]).rglob("*"):
            if stored.is_file():
                assert secret.encode() not in stored.read_bytes(), f"{secret!r} found in {stored}"
    control_text = str(pipeline.dest_query(
        "SELECT s::text FROM cdc.connector_state s UNION ALL SELECT a::text FROM cdc.applied_positions a"))
    assert CAPTURE_PASSWORD not in control_text and DEST_PASSWORD not in control_text
    pipeline.assert_same("t")
