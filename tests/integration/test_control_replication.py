"""The control plane on real cycles (MariaDB -> Debezium -> Spark -> PostgreSQL): pause, set offset and resume
replay from the given position; a run's start_offset does the same; restart with `always` takes the snapshot
again; `schemasync` creates the tables and pauses; a pause ends a running cycle; the row-count check; stats across
processes and their reset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psycopg
import pytest
from psycopg import sql

from assets.connector_asset import build_connector_asset
from cdc_pipeline import control
from cdc_pipeline.decode import offsets
from cdc_pipeline.ops import requests
from cdc_pipeline.ops.cli import _root_cause, run_sync
from cdc_pipeline.config import load_config
from cdc_pipeline.errors import ConnectorPausedError

pytestmark = pytest.mark.integration

ITEMS = "CREATE TABLE items (id INT PRIMARY KEY, v VARCHAR(20))"


def _ask(pipeline, kind: str, argument: str | None = None) -> requests.Outcome:
    """Submits the request and serves it, as the request sensor does."""
    config = load_config(pipeline.config_path)
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        control.ensure_control_schema(conn, "cdc")
        requests.submit_request(conn, "cdc", pipeline.name, kind, argument)
        [outcome] = requests.serve_pending_requests(conn, "cdc", config)
    assert outcome.status == requests.DONE, outcome.reason
    return outcome


def _state(pipeline) -> dict:
    rows = pipeline.dest_query("SELECT state, stage, phase, next_snapshot_mode FROM cdc.connector_state "
                               "WHERE connector = %s", (pipeline.name,))
    return dict(zip(("state", "stage", "phase", "next_snapshot_mode"), rows[0]))


def _debezium_offset(pipeline) -> str:
    [(offset,)] = pipeline.dest_query("SELECT offset_value FROM cdc.debezium_offsets WHERE connector = %s",
                                      (pipeline.name,))
    return offset


def _assert_refused_while_paused(pipeline) -> None:
    with pytest.raises(Exception) as error:
        pipeline.sync()
    assert isinstance(_root_cause(error.value), ConnectorPausedError), error.value


def _counts(summary: dict) -> tuple[int, int, int, int]:
    return summary["inserts"], summary["updates"], summary["deletes"], summary["redelivered"]


def _delete_by_hand(pipeline, table: str, row_id: int) -> None:
    pipeline.dest_query(sql.SQL("DELETE FROM {} WHERE id = %s RETURNING id").format(
        sql.Identifier(pipeline.source_db, table)), (row_id,))


def _cli(pipeline, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cdc_pipeline.ops.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **pipeline.env}, timeout=120)


def test_set_offset_while_paused_and_start_offset_replay_from_the_given_position(pipeline):
    pipeline.source([ITEMS, "INSERT INTO items VALUES (1, 'a'), (2, 'b')"])
    pipeline.sync()
    pipeline.source("INSERT INTO items VALUES (3, 'c')")
    assert pipeline.sync()["inserts"] == 1
    offset = _debezium_offset(pipeline)
    [(key,)] = pipeline.dest_query("SELECT offset_key FROM cdc.debezium_offsets WHERE connector = %s",
                                   (pipeline.name,))
    assert key == offsets.offset_key(pipeline.name, "mariadb", pipeline.source_db), \
        "a connector that never ran gets its offset under the key the engine reads"
    pipeline.source(["INSERT INTO items VALUES (4, 'd'), (5, 'e')", "UPDATE items SET v = 'B' WHERE id = 2",
                     "DELETE FROM items WHERE id = 1"])
    assert _counts(pipeline.sync()) == (2, 1, 1, 0)

    _ask(pipeline, requests.PAUSE)
    _assert_refused_while_paused(pipeline)
    assert _state(pipeline)["state"] == control.PAUSED
    _ask(pipeline, requests.SET_OFFSET, offset)
    assert _ask(pipeline, requests.RESUME).launch_run
    _delete_by_hand(pipeline, "items", 4)

    replayed = pipeline.sync()

    assert _counts(replayed) == (2, 1, 1, 0), "every change after the offset applied again, once"
    pipeline.assert_same("items")
    after_replay = _debezium_offset(pipeline)
    assert json.loads(after_replay) != json.loads(offset)

    _delete_by_hand(pipeline, "items", 5)

    backfill = run_sync(pipeline.name, start_offset=offset)

    assert _counts(backfill) == (2, 1, 1, 0)
    pipeline.assert_same("items")
    assert pipeline.sync()["events"] == 0, "the next cycle goes on from where the backfill ended"
    [(inserts,)] = pipeline.dest_query("SELECT inserts FROM cdc.stats WHERE connector = %s", (pipeline.name,))
    assert inserts == 1 + 2 + 2 + 2


def test_restart_with_always_takes_the_snapshot_again_and_the_row_count_check_sees_lost_rows(pipeline):
    # Debezium's snapshot, superseded by the next one (the bulk engine's restart: tests/integration/test_bulk_load.py).
    pipeline.write_config(snapshot_engine="debezium")
    pipeline.source([ITEMS, "CREATE TABLE tags (name VARCHAR(20) PRIMARY KEY)",
                     "INSERT INTO items VALUES (1, 'a'), (2, 'b'), (3, 'c')", "INSERT INTO tags VALUES ('x')"])
    first = pipeline.sync()
    config = load_config(pipeline.config_path)
    _, check = build_connector_asset(config.connector(pipeline.name), str(pipeline.config_path))
    assert check().passed
    _delete_by_hand(pipeline, "items", 2)

    failed = check()

    assert not failed.passed
    assert failed.metadata["differing_tables"].value == [f"{pipeline.source_db}.items"]
    assert f"{pipeline.source_db}.items (source 3, destination 2)" in failed.description

    assert _ask(pipeline, requests.RESTART, "always").launch_run
    assert _state(pipeline)["state"] == control.RESTARTING
    summary = pipeline.sync()

    assert summary["snapshot_rows"] == 4, json.dumps(summary)
    assert check().passed
    pipeline.assert_same("items")
    assert _state(pipeline) == {"state": control.SYNCING, "stage": control.STAGE_CDC, "phase": None,
                                "next_snapshot_mode": None}
    assert pipeline.sync()["snapshot_rows"] == 0, "the restart's snapshot mode served one cycle"

    stats = json.loads(_cli(pipeline, "stats", pipeline.name, "--json").stdout)
    assert len(stats) == 1
    assert (stats[0]["snapshot_rows"], stats[0]["snapshot_tables"], stats[0]["redelivered"]) == (
        4, 2, first["events"]), "the second snapshot superseded the first (its events count as re-delivered)"
    assert stats[0]["snapshot_ended_at"] is not None and stats[0]["batches"] >= 2
    # Debezium processed each change after the source made it, and before it was applied.
    assert stats[0]["first_source_ts"] <= stats[0]["first_debezium_ts"] <= stats[0]["last_debezium_ts"] \
        <= stats[0]["last_applied_at"]
    reset = _cli(pipeline, "stats", "--reset", pipeline.name)
    assert reset.returncode == 0, reset.stderr
    stats = json.loads(_cli(pipeline, "stats", pipeline.name, "--json").stdout)
    assert (stats[0]["total_events"], stats[0]["snapshot_rows"], stats[0]["last_applied_at"]) == (0, 0, None)
    assert stats[0]["reset_at"] is not None


def test_schemasync_creates_the_tables_then_pauses_for_review(pipeline):
    pipeline.source([ITEMS, "INSERT INTO items VALUES (1, 'a')"])
    _ask(pipeline, requests.RESTART, "schemasync")

    summary = pipeline.sync()

    assert summary["ddls"] >= 1 and summary["snapshot_rows"] == 0
    assert pipeline.dest_table_exists("items") and pipeline.dest_rows("items") == []
    assert _state(pipeline)["state"] == control.SCHEMA_SYNC_DONE
    assert _state(pipeline)["stage"] == control.STAGE_SCHEMA_SYNC
    _assert_refused_while_paused(pipeline)

    _ask(pipeline, requests.RESUME)
    pipeline.source("INSERT INTO items VALUES (2, 'after review')")
    summary = pipeline.sync()

    assert summary["inserts"] == 1
    assert pipeline.dest_rows("items") == [(2, "after review")]
    state = json.loads(_cli(pipeline, "state", pipeline.name, "--json", "--verbose").stdout)[0]
    assert state["state"] == control.SYNCING and state["jvm_memory"]["heap_used"] > 0


# The bulk snapshot's slices of chunks are four rounds of the cores: on the suite's two, small chunks make about 38
# slices of a tenth of a second or more, so the pause lands long before the last.
@pytest.mark.parametrize("engine", [{"snapshot_engine": "debezium"}, {"snapshot_chunk_rows": 100}])
def test_a_pause_ends_the_running_cycle_at_a_batch_boundary_and_stays(pipeline, engine):
    """Debezium's snapshot stops at a batch boundary; the bulk snapshot between two slices of chunks."""
    pipeline.source([ITEMS, "INSERT INTO items SELECT seq, CONCAT('v', seq) FROM seq_1_to_30000"])
    pipeline.write_config(batch_size=500, apply_batch_events=500, **engine)
    run = pipeline.sync_cli()
    try:
        deadline = time.monotonic() + 240
        while not pipeline.dest_query("SELECT to_regclass('cdc.stats') IS NOT NULL")[0][0] or not pipeline.dest_query(
                "SELECT 1 FROM cdc.stats WHERE connector = %s AND snapshot_rows > 0", (pipeline.name,)):
            assert run.poll() is None, f"the cycle ended before it could be paused: {run.communicate()}"
            assert time.monotonic() < deadline, "no batch was applied in time"
            time.sleep(0.1)
        _ask(pipeline, requests.PAUSE)
        stdout, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, stderr
    [(rows,)] = pipeline.dest_query(sql.SQL("SELECT count(*) FROM {}").format(
        sql.Identifier(pipeline.source_db, "items")))
    assert 0 < rows < 30000, "the cycle ended before the snapshot was done"
    assert _state(pipeline)["state"] == control.PAUSED and _state(pipeline)["phase"] is None


def test_a_restart_whose_snapshot_reads_chosen_tables_leaves_the_others_alone(pipeline):
    pipeline.write_config(snapshot_engine="debezium")
    pipeline.source([ITEMS, "CREATE TABLE tags (name VARCHAR(20) PRIMARY KEY, n INT)",
                     "INSERT INTO items VALUES (1, 'a'), (2, 'b')", "INSERT INTO tags VALUES ('x', 1), ('y', 2)"])
    pipeline.sync()
    _delete_by_hand(pipeline, "items", 2)
    # The next restart's snapshot reads items only (Debezium's include list, a regular expression).
    pipeline.write_config(snapshot_engine="debezium",
                          debezium={"snapshot.include.collection.list": rf"{pipeline.source_db}\.ite.*"})
    pipeline.source("INSERT INTO tags VALUES ('z', 3)")
    pipeline.sync()  # (the restart's snapshot moves the position: changes of tables it does not read come first)
    assert _ask(pipeline, requests.RESTART, "always").launch_run

    summary = pipeline.sync()

    assert summary["snapshot_rows"] == 2, json.dumps(summary)
    pipeline.assert_same("items", "tags")
