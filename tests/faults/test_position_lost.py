"""A source that no longer holds a connector's position: a MariaDB binlog purged while the connector was stopped, a
PostgreSQL slot the server invalidated (`max_slot_wal_keep_size`). The run is refused before its engine starts, with
a first line naming the connector, the position, what the source holds and the command that recovers; that command
works from the CLI alone, and `on_position_lost: snapshot` or `snapshot_mode: when_needed` take the new snapshot by
themselves. Either way the destination ends exact: rows deleted while the position was lost are gone."""

from __future__ import annotations

import re

import psycopg
import pytest

from cdc_pipeline.ops import cli

pytestmark = pytest.mark.integration

ITEMS = "CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20))"
# Changes made while the connector is stopped, a delete among them.
CHANGES = ["INSERT INTO items VALUES (4, 'four')", "UPDATE items SET name = 'uno' WHERE id = 1",
           "DELETE FROM items WHERE id = 2"]


def _cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _refused_line(capsys: pytest.CaptureFixture, name: str) -> str:
    """The failure's first line, also the first line the command prints (no note that the connector is stopped
    and may be resumed, from the second refusal on: a resume would not recover)."""
    code, _, err = _cli(capsys, "sync", name)
    assert code == 1, err
    return err.splitlines()[0]


def _state(pipeline) -> tuple:
    return pipeline.dest_query("SELECT state, next_snapshot_mode FROM cdc.connector_state WHERE connector = %s",
                               (pipeline.name,))[0]


def _stopped_with_changes(pipeline) -> str:
    """A connector that applied the items table, then changes made while it was stopped, then the binlog holding them
    purged; returns the oldest binlog the server keeps."""
    pipeline.source([ITEMS, "INSERT INTO items VALUES (1, 'one'), (2, 'two'), (3, 'three')"])
    pipeline.sync()
    pipeline.source(CHANGES)
    return pipeline.purge_binlogs()


def test_a_purged_binlog_is_refused_by_name_and_the_named_command_recovers_from_the_cli(pipeline, capsys):
    oldest = _stopped_with_changes(pipeline)
    name = pipeline.name

    line = _refused_line(capsys, name)
    match = re.fullmatch(
        rf"connector '{name}': the source no longer holds the connector's position "
        rf"mariadb-bin\.\d+:\d+ \(GTID 0-1-\d+\): its oldest binlog is {re.escape(oldest)}, which begins after GTID "
        rf"0-1-\d+; recover with `cdc-pipeline restart {name} always`", line)
    assert match, line
    assert _refused_line(capsys, name) == line, "a sync again is refused the same way"
    assert pipeline.dest_rows("items") == [(1, "one"), (2, "two"), (3, "three")], "nothing was applied"

    code, out, _ = _cli(capsys, "restart", name, "always")
    assert code == 0 and "pending" in out and f"cdc-pipeline sync {name}" in out, out
    code, out, err = _cli(capsys, "sync", name)
    assert code == 0, err
    assert "served request" in out and "restart always" in out, out
    pipeline.assert_same("items")
    assert pipeline.dest_rows("items") == [(1, "uno"), (3, "three"), (4, "four")]
    assert _state(pipeline) == ("syncing", None), "the restart's mode served one cycle"

    pipeline.source("DELETE FROM items WHERE id = 3")
    assert _cli(capsys, "sync", name)[0] == 0
    pipeline.assert_same("items")


@pytest.mark.parametrize("settings", [{"on_position_lost": "snapshot"},
                                      {"snapshot_mode": "when_needed", "snapshot_engine": "debezium"}],
                         ids=["on_position_lost_snapshot", "when_needed_debezium_snapshot"])
def test_a_purged_binlog_is_snapshotted_again_by_the_connectors_policy(pipeline, settings, caplog):
    pipeline.write_config(**settings)
    _stopped_with_changes(pipeline)

    summary = pipeline.sync()

    assert summary["snapshot_rows"] == 3, summary
    assert pipeline.dest_rows("items") == [(1, "uno"), (3, "three"), (4, "four")]
    assert "the source no longer holds the connector's position" in caplog.text and "taking a new snapshot" in caplog.text
    pipeline.source("INSERT INTO items VALUES (5, 'five')")
    assert pipeline.sync()["inserts"] == 1, "the stream goes on from the new snapshot's position"
    pipeline.assert_same("items")


def _invalidate_slot(pipeline) -> None:
    """Bounds the WAL a slot keeps to 1 MB, writes past it (three WAL segments) and checkpoints: the server
    invalidates the connector's slot (wal_status lost)."""
    server = pipeline.source_server
    server.execute(["ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'", "SELECT pg_reload_conf()"])
    for _ in range(3):
        pipeline.source(["INSERT INTO filler SELECT g, repeat('x', 100) FROM generate_series(1, 2000) g",
                         "SELECT pg_switch_wal()"])
    server.execute("CHECKPOINT")
    [(status,)] = server.query(f"SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'cdc_{pipeline.name}'")
    assert status == "lost"


@pytest.mark.parametrize("policy", ["fail", "snapshot"])
def test_an_invalidated_slot_is_refused_by_name_or_snapshotted_again_by_the_policy(pg_pipeline, policy, capsys):
    pipeline, name = pg_pipeline, pg_pipeline.name
    pipeline.write_config(on_position_lost=policy)
    pipeline.source(["CREATE TABLE items (id integer PRIMARY KEY, name text)", "CREATE TABLE filler (n int, t text)",
                     "INSERT INTO items VALUES (1, 'one'), (2, 'two'), (3, 'three')"])
    pipeline.sync()
    pipeline.source("INSERT INTO items VALUES (9, 'streamed')")
    pipeline.sync()  # the engine stores an offset
    pipeline.source(["DELETE FROM items WHERE id = 9", *CHANGES])
    try:
        _invalidate_slot(pipeline)
        if policy == "fail":
            line = _refused_line(capsys, name)
            assert re.fullmatch(
                rf"connector '{name}': the source no longer holds the connector's "
                rf"position LSN [0-9A-F]+/[0-9A-F]+: its replication slot cdc_{name} was invalidated \(wal_status "
                rf"lost\): the server removed WAL the slot held, past max_slot_wal_keep_size \(1MB\); recover with "
                rf"`cdc-pipeline restart {name} always`", line), line
            assert _cli(capsys, "restart", name, "always")[0] == 0
        code, _, err = _cli(capsys, "sync", name)
        assert code == 0, err
    finally:
        pipeline.source_server.execute(["ALTER SYSTEM RESET max_slot_wal_keep_size", "SELECT pg_reload_conf()"])
    assert pipeline.dest_rows("items") == [(1, "uno"), (3, "three"), (4, "four")]
    pipeline.source("DELETE FROM items WHERE id = 3")
    pipeline.sync()
    pipeline.assert_same("items")
    with psycopg.connect(pipeline.source_dsn) as conn:
        assert conn.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s",
                            (f"cdc_{name}",)).fetchone()[0] == "reserved", "the new snapshot made a new slot"
