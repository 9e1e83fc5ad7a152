"""A source that takes writes from before the first run on and never pauses (as a production database does): the
first run takes the schema snapshot, loads the rows and keeps its time budget; no change is applied before the load;
once the writer stops, the destination equals the source."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

import pytest

from tests.helpers.mariadb_source import Pipeline

pytestmark = pytest.mark.integration

ACCOUNTS = "CREATE TABLE accounts (id INT PRIMARY KEY, balance INT NOT NULL, touched INT NOT NULL DEFAULT 0)"
WRITER_MAX_SECONDS = 240  # the writer stops by itself, whatever happens to the test
BUDGET_SECONDS = 8
MAX_LOADING_RUNS = 6
# A run that has not ended this long after its start has ignored its budget (its start and stop take seconds).
RUN_TIMEOUT_SECONDS = BUDGET_SECONDS + 150


@contextmanager
def busy_writer(pipeline: Pipeline, rows: int) -> Iterator[list[int]]:
    """Writes small transactions to `accounts` back to back (an update, and every tenth time an insert) until the
    block ends; yields the running count of transactions."""
    stop = threading.Event()
    done = [0]

    def write() -> None:
        deadline = time.monotonic() + WRITER_MAX_SECONDS
        next_id = rows + 1
        with pipeline.mariadb.connect(pipeline.source_db) as connection, connection.cursor() as cursor:
            while not stop.is_set() and time.monotonic() < deadline:
                n = done[0]
                cursor.execute("UPDATE accounts SET balance = balance + 1, touched = touched + 1 WHERE id = %s",
                               (n % rows + 1,))
                if n % 10 == 0:
                    cursor.execute("INSERT INTO accounts (id, balance) VALUES (%s, %s)", (next_id, next_id))
                    next_id += 1
                done[0] = n + 1
                time.sleep(0.005)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join(30)


def _log_tail(log: str) -> str:
    """The run's own log lines (not Debezium's nor Spark's), the last of them."""
    return "\n".join([line for line in log.splitlines() if "cdc_pipeline" in line][-40:])


def _run(pipeline: Pipeline, timeout: float) -> str:
    """Runs `cdc-pipeline sync -v` in its own process; returns its output. A run past `timeout` is killed and fails
    the test."""
    run = pipeline.sync_cli("-v")
    try:
        out, err = run.communicate(timeout=timeout)
    except Exception:
        run.kill()
        out, err = run.communicate()
        pytest.fail(f"the sync did not end within {timeout:.0f} s on a busy source:\n{_log_tail(err)}")
    assert run.returncode == 0, _log_tail(err)
    return out + err


def _load_finished(pipeline: Pipeline) -> bool:
    return pipeline.dest_query("SELECT finished_at IS NOT NULL FROM cdc.bulk_loads WHERE connector = %s",
                               (pipeline.name,)) == [(True,)]


def test_runs_on_a_busy_source_load_then_stream_within_their_budget(pipeline: Pipeline):
    rows = 4_000
    pipeline.source([ACCOUNTS, f"INSERT INTO accounts (id, balance) SELECT seq, seq FROM seq_1_to_{rows}"])
    pipeline.write_config(snapshot_chunk_rows=1_000, max_seconds_per_run=BUDGET_SECONDS, idle_timeout_seconds=1)
    with busy_writer(pipeline, rows) as written:
        time.sleep(1)  # busy before the first run starts
        for _ in range(MAX_LOADING_RUNS):
            before = written[0]
            output = _run(pipeline, timeout=RUN_TIMEOUT_SECONDS)
            assert written[0] - before > 50, "the writer kept writing through the run"
            if _load_finished(pipeline):
                break
        assert _load_finished(pipeline), f"the bulk load finished within {MAX_LOADING_RUNS} runs"
        assert pipeline.stats(["snapshot_rows"])["snapshot_rows"] >= rows
        # Still busy, a run streams and ends at its budget.
        _run(pipeline, timeout=RUN_TIMEOUT_SECONDS)
        assert pipeline.stats(["inserts"])["inserts"] > 0
    # The writer stopped: runs with a larger budget take the backlog to its end.
    pipeline.write_config(snapshot_chunk_rows=1_000, max_seconds_per_run=300, idle_timeout_seconds=1)
    for _ in range(3):
        pipeline.sync()
        if pipeline.dest_rows("accounts") == pipeline.source_rows("accounts"):
            break
    source, dest = set(pipeline.source_rows("accounts")), set(pipeline.dest_rows("accounts"))
    assert dest == source, f"missing {sorted(source - dest)[:20]}, extra {sorted(dest - source)[:20]}"
