"""Runs killed with SIGKILL in the middle of a large stream and of an initial snapshot: the next runs finish the
job exactly (table contents, duplicates of keyless tables included, and every count). The planner's snapshot
bookkeeping these rely on is tested on captured events in tests/unit/sink/test_plan.py.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.helpers.runs import kill_when

READINGS = "CREATE TABLE readings (id INT PRIMARY KEY, sensor VARCHAR(20), value DECIMAL(12,3), at DATETIME(3))"
ACCOUNTS = "CREATE TABLE accounts (id INT PRIMARY KEY, owner VARCHAR(20), balance DECIMAL(12,2))"
AUDIT_LOG = "CREATE TABLE audit_log (actor VARCHAR(20), action VARCHAR(10), amount INT)"  # no key, duplicate rows
STATS = ("events", "ddls", "snapshot_rows", "inserts", "updates", "deletes", "other_events", "redelivered")


def _kill_after_first_commit(pipeline, applied) -> dict[str, int]:
    """Starts `cdc-pipeline sync` and kills its process group with SIGKILL as soon as `applied(stats)` holds."""
    kill_when(pipeline.name, lambda: applied(pipeline.stats(STATS)), "a batch applied", env=pipeline.env)
    return pipeline.stats(STATS)


def _assert_ended_cleanly(pipeline) -> None:
    state = pipeline.dest_query("SELECT state, phase, last_error FROM cdc.connector_state WHERE connector = %s",
                                (pipeline.name,))
    assert state == [("syncing", None, None)], "the last cycle succeeded and none runs"


@pytest.mark.integration
def test_run_killed_mid_stream_is_completed_by_the_next_run(pipeline):
    pipeline.source([READINGS, AUDIT_LOG])
    pipeline.sync()
    baseline = pipeline.stats(STATS)
    inserts, doubled, deleted, late, logged, log_updates, log_deletes = pipeline.source_changes([
        "INSERT INTO readings SELECT seq, CONCAT('sensor-', seq % 17), seq / 7, "
        "TIMESTAMP('2024-01-01') + INTERVAL seq SECOND FROM seq_1_to_26000",
        "UPDATE readings SET value = value * 2 WHERE id % 3 = 0",
        "DELETE FROM readings WHERE id % 10 = 0",
        "INSERT INTO readings VALUES (100000, 'late', 1.5, NULL)",
        # 100 distinct rows, each 100 times; every update and delete below must touch one of the copies only.
        "INSERT INTO audit_log SELECT CONCAT('actor-', seq % 50), ELT(1 + seq % 2, 'read', 'write'), seq % 4 "
        "FROM seq_1_to_10000",
        "UPDATE audit_log SET amount = amount + 10 WHERE amount = 0 LIMIT 1500",
        "DELETE FROM audit_log WHERE amount = 1 LIMIT 1200",
    ])
    stream_events = inserts + doubled + deleted + late + logged + log_updates + log_deletes
    assert stream_events >= 49_000
    # The killed run fetches part of the stream and commits it in several transactions; the run after it takes
    # all of it in few (each one Spark job).
    pipeline.write_config(batch_size=1000, apply_batch_events=10_000, max_events_per_run=20_000)

    killed = _kill_after_first_commit(pipeline, lambda stats: stats["events"] > baseline["events"])
    assert 0 < killed["events"] - baseline["events"] < stream_events, "killed after some, not all, batches committed"
    pipeline.write_config(batch_size=2048, max_events_per_run=60_000)

    pipeline.catch_up("readings", "audit_log")
    stats = pipeline.stats(STATS)
    assert (stats["inserts"], stats["updates"], stats["deletes"]) == (
        inserts + late + logged, doubled + log_updates, deleted + log_deletes), "every change is counted once"
    assert stats["events"] - baseline["events"] == stream_events
    # Each destination transaction is marked complete once committed: a kill right after a commit may come before
    # its marking. It is a group, or the groups of one source transaction larger than a group (the 26,000-row
    # INSERT spans three), which are committed as one.
    assert 0 <= stats["redelivered"] - baseline["redelivered"] <= max(10_000, inserts), \
        "at most the destination transaction in flight came again"
    _assert_ended_cleanly(pipeline)


@pytest.mark.integration
def test_run_killed_mid_snapshot_is_taken_again_exactly(pipeline):
    tables = ["accounts", "archive", "audit_log"]
    pipeline.source([ACCOUNTS, "CREATE TABLE archive (id INT PRIMARY KEY, v INT)", AUDIT_LOG])
    pipeline.source_changes([
        "INSERT INTO accounts SELECT seq, CONCAT('owner-', seq % 97), seq / 3 FROM seq_1_to_10000",
        "INSERT INTO archive VALUES (1, 1), (2, 2), (3, 3)",
        # 120 distinct rows, each 166 or 167 times.
        "INSERT INTO audit_log SELECT CONCAT('actor-', seq % 40), ELT(1 + seq % 3, 'read', 'write', 'drop'), seq % 4 "
        "FROM seq_1_to_20000",
    ])
    rows_before_kill = {table: len(pipeline.source_rows(table)) for table in tables}
    # Debezium's snapshot engine, in commits of at most 15k events (the bulk engine's kills: test_bulk_load.py).
    engine = {"snapshot_engine": "debezium"}
    pipeline.write_config(batch_size=1000, apply_batch_events=15_000, **engine)

    # Debezium reads the tables in name order: once more rows than the two keyed tables hold are committed, the
    # keyless one has some of its rows in the destination (how many batches a commit holds depends on the load).
    keyed_rows = rows_before_kill["accounts"] + rows_before_kill["archive"]
    killed = _kill_after_first_commit(pipeline, lambda stats: stats["snapshot_rows"] > keyed_rows)
    assert 0 < killed["snapshot_rows"] < sum(rows_before_kill.values()), "the kill came in the middle of the snapshot"
    assert len(pipeline.dest_rows("accounts")) == rows_before_kill["accounts"]
    assert 0 < len(pipeline.dest_rows("audit_log")) < rows_before_kill["audit_log"], "... and of the keyless table"
    offsets = pipeline.dest_query("SELECT offset_value FROM cdc.debezium_offsets WHERE connector = %s",
                                  (pipeline.name,))
    assert all(str(json.loads(offset).get("snapshot", "false")).lower() != "false" for (offset,) in offsets), \
        f"Debezium had recorded no offset past its snapshot: the next run takes it again from its start: {offsets}"
    # Rows go away between the two snapshots: the destination must lose them too, also from a keyed table and from
    # a table the new snapshot reads no rows of.
    pipeline.source_changes(["DELETE FROM accounts WHERE id % 1000 = 0",
                               "DELETE FROM archive",
                               "DELETE FROM audit_log WHERE amount = 3 LIMIT 50"])
    pipeline.write_config(**engine)

    pipeline.sync()

    pipeline.assert_same("accounts", "archive")
    assert Counter(pipeline.dest_rows("audit_log")) == Counter(pipeline.source_rows("audit_log"))
    rows_after_kill = {table: len(pipeline.source_rows(table)) for table in tables}
    stats = pipeline.stats(STATS)
    assert stats["snapshot_rows"] == sum(rows_after_kill.values()), "rows read again are not counted again"
    assert stats["redelivered"] == killed["events"], "what the killed run applied was delivered again"
    assert stats["ddls"] == len(tables)
    assert stats["events"] == stats["ddls"] + stats["snapshot_rows"] + stats["other_events"]
    progress = pipeline.dest_query(
        "SELECT source_table, snapshot_rows, rows_replaced FROM cdc.snapshot_progress WHERE connector = %s "
        "AND source_table <> '' ORDER BY 1", (pipeline.name,))
    assert progress == [(f"{pipeline.source_db}.{table}", rows, True) for table, rows in rows_after_kill.items()]
    _assert_ended_cleanly(pipeline)
