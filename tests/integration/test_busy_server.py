"""The change check on a server whose other databases write much more than the connector's: a change of a captured
table behind tens of thousands of other databases' binlog events is found (sync runs a cycle for it, the sensor's
check says there is work), a check out of time says there is work rather than none, and a check that read to the
binlog's end over other databases' events only says there is none and records how far it read (unless a run recorded
a later position meanwhile). What a check records is a transaction's start or the binlog's end, where a run's engine
may start (tests/integration/test_quiet_on_busy_server.py)."""

from __future__ import annotations

import json

import pytest

from cdc_pipeline.config import load_config
from cdc_pipeline.ops import pending
from cdc_pipeline.sources import mariadb
from tests.helpers.mariadb_source import Pipeline

pytestmark = pytest.mark.integration

# More binlog events than a check read before issue 38 (20,000): each transaction is five (GTID, the statement's
# annotation, table map, rows, XID).
FOREIGN_TRANSACTIONS = 8_000


def _write_elsewhere(pipeline: Pipeline, transactions: int = FOREIGN_TRANSACTIONS) -> None:
    """Commits `transactions` one-row inserts in a database of the same server the connector does not capture, in
    one round trip (a loop run by the server, each insert its own transaction)."""
    other = f"elsewhere_{pipeline.name}"  # the check takes a statement naming the connector's database for its DDL
    pipeline.mariadb.execute([f"CREATE DATABASE IF NOT EXISTS `{other}`",
                              f"CREATE TABLE IF NOT EXISTS `{other}`.log (id INT AUTO_INCREMENT PRIMARY KEY, v TEXT)",
                              f"BEGIN NOT ATOMIC DECLARE i INT DEFAULT 0; WHILE i < {transactions} DO "
                              f"INSERT INTO `{other}`.log (v) VALUES ('written elsewhere'); SET i = i + 1; END WHILE; "
                              "END"])


def _binlog_end(pipeline: Pipeline) -> dict:
    file, pos = pipeline.mariadb.query("SHOW MASTER STATUS")[0][:2]
    return {"file": file, "pos": int(pos)}


def _source_checked(pipeline: Pipeline) -> dict:
    return pipeline.dest_query("SELECT source_checked FROM cdc.connector_state WHERE connector = %s",
                               (pipeline.name,))[0][0]


def _binlog_events(pipeline: Pipeline, start: dict, end: dict) -> int:
    rows = pipeline.mariadb.query(f"SHOW BINLOG EVENTS IN '{start['file']}' FROM {start['pos']}")
    return sum(1 for row in rows if row[1] < end["pos"])


def _event_kind(pipeline: Pipeline, position: dict) -> str:
    return pipeline.mariadb.query(f"SHOW BINLOG EVENTS IN '{position['file']}' FROM {position['pos']} LIMIT 1")[0][2]


def test_a_change_behind_more_events_of_other_databases_than_a_page_is_found(pipeline: Pipeline, monkeypatch):
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v TEXT)"])
    pipeline.write_config(tables=[f"{pipeline.source_db}.items"])
    pipeline.sync()
    checked = _source_checked(pipeline)
    _write_elsewhere(pipeline)
    pipeline.source(["INSERT INTO items VALUES (1, 'a')"])
    assert _binlog_events(pipeline, checked, _binlog_end(pipeline)) > 2 * mariadb.BINLOG_PAGE_EVENTS
    config = load_config()
    connector = config.connector(pipeline.name)

    # Out of time after one page: the check says there is work and records how far it read; sync runs a cycle.
    with monkeypatch.context() as patch:
        patch.setattr(mariadb.checks, "CHECK_SECONDS", 0)
        short = pending.check(connector, config.destination)
        assert short.work and not short.caught_up and "was not read to its end" in short.reason, short
        moved = _source_checked(pipeline)
        # The last transaction's start in the page read, where a run's engine may start.
        assert mariadb.BINLOG_PAGE_EVENTS - 5 < _binlog_events(pipeline, checked, moved) <= mariadb.BINLOG_PAGE_EVENTS
        assert _event_kind(pipeline, moved) == "Gtid"
        assert pending.nothing_to_do(connector, config.destination) is None

    found = pending.check(connector, config.destination)
    assert found.work and f"a change of {pipeline.source_db}.items" in found.reason, found
    # Recorded: where the change's transaction begins, past every other database's event.
    assert _event_kind(pipeline, _source_checked(pipeline)) == "Gtid"
    assert _binlog_events(pipeline, _source_checked(pipeline), _binlog_end(pipeline)) == 5
    assert pending.nothing_to_do(connector, config.destination) is None
    changed = pipeline.sync()
    assert "nothing_to_do" not in changed and changed["inserts"] == 1
    pipeline.assert_same("items")


def test_a_check_that_read_to_the_end_over_other_databases_only_says_no_work(pipeline: Pipeline):
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v TEXT)"])
    pipeline.write_config(tables=[f"{pipeline.source_db}.items"])
    pipeline.sync()
    _write_elsewhere(pipeline)
    end = _binlog_end(pipeline)
    config = load_config()
    connector = config.connector(pipeline.name)

    idle = pending.check(connector, config.destination)
    assert not idle.work and idle.caught_up, idle
    assert idle.reason == f"no change of the connector's tables up to {end['file']}:{end['pos']}"
    assert _source_checked(pipeline) == end, "the next check starts where this one ended"
    assert pending.check(connector, config.destination).reason == f"no binlog event since {end['file']}:{end['pos']}"

    _write_elsewhere(pipeline)
    later = _binlog_end(pipeline)
    assert pending.nothing_to_do(connector, config.destination) \
        == f"no change of the connector's tables up to {later['file']}:{later['pos']}"


def test_a_check_leaves_the_later_position_a_run_recorded_while_it_read(pipeline: Pipeline, monkeypatch):
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v TEXT)"])
    pipeline.write_config(tables=[f"{pipeline.source_db}.items"])
    pipeline.sync()
    _write_elsewhere(pipeline, 100)
    config = load_config()
    connector = config.connector(pipeline.name)
    run_end = {"file": "mariadb-bin.999999", "pos": 4}
    check_changes = mariadb.check_changes

    def check_while_a_run_ends_idle(*args, **kwargs):
        found = check_changes(*args, **kwargs)
        pipeline.dest_query("UPDATE cdc.connector_state SET source_checked = %s WHERE connector = %s RETURNING 1",
                            (json.dumps(run_end), pipeline.name))
        return found

    monkeypatch.setattr(mariadb, "check_changes", check_while_a_run_ends_idle)
    found = pending.check(connector, config.destination)
    assert not found.work and found.caught_up, found
    assert _source_checked(pipeline) == run_end
