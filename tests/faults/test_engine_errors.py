"""Engine-side failures end the run with Debezium's message and what to do, in the run and in the connector's
state; the engine is stopped and nothing is marked complete. A source whose binlog was purged past the stored
offset is recovered by a new snapshot."""

from __future__ import annotations

import time

import psycopg
import pytest

from cdc_pipeline.ops import cli
from cdc_pipeline.capture.runner import engine_failure
from cdc_pipeline.errors import RunnerError

ITEMS = "CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20))"


def _failure(pipeline) -> str:
    with pytest.raises(Exception) as failed:
        pipeline.sync()
    return str(cli._root_cause(failed.value))


def _state(pipeline) -> tuple:
    return pipeline.dest_query("SELECT state, last_error FROM cdc.connector_state WHERE connector = %s",
                               (pipeline.name,))[0]


@pytest.mark.parametrize(("message", "hint"), [
    ("Unable to connect: (conn=9) Access denied for user 'dbz'@'localhost' (using password: YES)", "password"),
    ("Unable to connect: Socket fail to connect to 127.0.0.1:1. Connection refused", "not reachable"),
    ("The connector is trying to read binlog starting at Struct{...}, but this is no longer available on the server.",
     "take a new snapshot"),
    ("ERROR: replication slot \"debezium\" does not exist", "replication slot is gone"),
    ("Online REDO LOG files or archive log files do not contain the offset scn 2345678. Please perform a new "
     "snapshot.", "take a new snapshot"),
    ("The db history topic or its content is fully or partially missing. Please check database schema history "
     "topic configuration and re-execute the snapshot.", "schema history"),
    ("io.debezium.DebeziumException: The db history topic is missing. You may attempt to recover it by "
     "reconfiguring the connector to recovery.", "schema history"),
])
def test_known_engine_failures_say_what_to_do(message: str, hint: str) -> None:
    explained = engine_failure(message)
    assert explained.startswith(f"the Debezium engine failed: {message}; what to do: ")
    assert hint in explained.split("what to do: ")[1]


def test_an_unknown_engine_failure_is_reported_as_is() -> None:
    assert engine_failure("something new") == "the Debezium engine failed: something new"


# Debezium 3.5's words when MariaDB refuses a GTID position whose binlog files were purged.
PURGED_GTID = ("org.apache.kafka.connect.errors.ConnectException: An exception occurred in the change event producer. "
               "This connector will be stopped. Caused by: io.debezium.DebeziumException: Could not find GTID state "
               "requested by slave in any binlog files. Probably the slave state is too old and required binlog files "
               "have been purged. Error code: 1236; SQLSTATE: HY000.")


def test_an_engine_that_finds_its_position_purged_says_that_first_and_debeziums_text_below() -> None:
    """The engine met the loss itself (the source purged after the run's check, or could not be checked): the first
    line names the connector, the position and the command; Debezium's text is on the last line."""
    from cdc_pipeline.config import ConnectorConfig, DestinationConfig
    from cdc_pipeline.cycle import ConnectorSession
    from cdc_pipeline.errors import PositionLostError
    from tests.fixtures.recorded import closed_port

    source = ConnectorConfig(name="inventory", type="mariadb", hostname="127.0.0.1", port=closed_port(), user="dbz",
                             password="secret", database="inventory")
    session = ConnectorSession(source, DestinationConfig(dsn="host=127.0.0.1 dbname=warehouse"), spark=None)
    session.resumed_from = {"file": "mariadb-bin.000003", "pos": 1234, "gtids": "0-1-57"}

    error = session.engine_error(PURGED_GTID)

    assert isinstance(error, PositionLostError)
    first, *_, last = str(error).splitlines()
    assert first.startswith("connector 'inventory': the source no longer holds the connector's position "
                            '{"file": "mariadb-bin.000003", "pos": 1234, "gtids": "0-1-57"}: ')
    assert first.endswith("; recover with `cdc-pipeline restart inventory always`")
    assert last == f"the Debezium engine failed: {PURGED_GTID}"
    assert isinstance(session.engine_error("something new"), RunnerError)


@pytest.mark.integration
def test_bad_credentials_and_an_unreachable_source_fail_the_run_clearly(pipeline, monkeypatch):
    pipeline.source(ITEMS)
    monkeypatch.setenv("TEST_SOURCE_PASSWORD", "not-the-password")
    message = _failure(pipeline)
    assert "Access denied" in message and "check `user`" in message and pipeline.name in message
    assert "not-the-password" not in message
    state, last_error = _state(pipeline)
    assert state == "stopped" and "Access denied" in last_error

    monkeypatch.setenv("TEST_SOURCE_PASSWORD", "capture-secret-7f3a")
    pipeline.write_config(port=1)
    message = _failure(pipeline)
    assert "not reachable" in message and pipeline.name in message
    assert pipeline.dest_query("SELECT count(*) FROM cdc.debezium_offsets WHERE connector = %s",
                               (pipeline.name,)) == [(0,)], "nothing was marked complete"


@pytest.mark.integration
def test_a_purged_binlog_says_to_snapshot_again_and_a_new_snapshot_recovers(pipeline):
    pipeline.source([ITEMS, "INSERT INTO items VALUES (1, 'one'), (2, 'two')"])
    pipeline.sync()
    pipeline.source(["INSERT INTO items VALUES (3, 'three')", "UPDATE items SET name = 'uno' WHERE id = 1",
                     "DELETE FROM items WHERE id = 2"])
    oldest = pipeline.purge_binlogs()

    message = _failure(pipeline)
    first_line = message.splitlines()[0]
    assert first_line.startswith(f"connector '{pipeline.name}': the source no longer holds the connector's position "
                                 "mariadb-bin."), message
    assert f"its oldest binlog is {oldest}" in first_line, message
    assert first_line.endswith(f"; recover with `cdc-pipeline restart {pipeline.name} always`"), message
    assert pipeline.dest_rows("items") == [(1, "one"), (2, "two")], "nothing after the stored offset was applied"

    pipeline.write_config(snapshot_mode="always")
    pipeline.sync()
    pipeline.assert_same("items")
    assert _state(pipeline) == ("syncing", None), "a cycle that succeeds leaves the connector syncing, error cleared"


def test_a_missing_schema_history_says_to_run_recovery_and_recovery_restores_it(pipeline):
    pipeline.source([ITEMS, "INSERT INTO items VALUES (1, 'one'), (2, 'two')"])
    pipeline.sync()
    pipeline.source(["INSERT INTO items VALUES (3, 'three')", "DELETE FROM items WHERE id = 2"])
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM cdc.debezium_schema_history WHERE connector = %s", (pipeline.name,))

    message = _failure(pipeline)
    assert "schema history" in message and "snapshot" in message
    assert _state(pipeline)[0] == "stopped" and "schema history" in _state(pipeline)[1]
    assert pipeline.dest_rows("items") == [(1, "one"), (2, "two")], "nothing after the stored offset was applied"

    pipeline.write_config(snapshot_mode="recovery")
    pipeline.sync()
    pipeline.assert_same("items")
    assert _state(pipeline) == ("syncing", None)


def test_a_locked_table_or_a_statement_that_does_not_end_fails_the_run_in_time_and_frees_the_connector(pipeline):
    pipeline.write_config(destination={"lock_timeout_seconds": 1, "statement_timeout_seconds": 3})
    pipeline.source([ITEMS, "INSERT INTO items VALUES (1, 'a')"])
    pipeline.sync()
    target = f'"{pipeline.source_db}".items'

    # Another session holds the destination table: the run gives up after the lock timeout.
    pipeline.source("INSERT INTO items VALUES (2, 'b')")
    with psycopg.connect(pipeline.dest_dsn) as locker:
        locker.execute(f"LOCK TABLE {target} IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        message = _failure(pipeline)
        waited = time.monotonic() - started
    assert "lock timeout" in message and "items" in message, message
    assert waited < 60, f"the run waited {waited:.0f} s on the lock"
    assert pipeline.sync()["inserts"] == 1, "the failed run released the connector's run lock"

    # A statement that does not end (here a trigger that sleeps) is cancelled after the statement timeout.
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        conn.execute("""CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS
                        $$ BEGIN PERFORM pg_sleep(30); RETURN NEW; END $$""")
        conn.execute(f"CREATE TRIGGER slow BEFORE INSERT ON {target} FOR EACH ROW EXECUTE FUNCTION slow()")
    pipeline.source("INSERT INTO items VALUES (3, 'c')")
    started = time.monotonic()
    message = _failure(pipeline)
    assert "statement timeout" in message and "items" in message, message
    assert time.monotonic() - started < 60
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TRIGGER slow ON {target}")
    assert pipeline.sync()["inserts"] == 1
    pipeline.assert_same("items")


def test_a_query_on_a_locked_source_table_ends_after_the_source_lock_timeout(pipeline, mariadb):
    from cdc_pipeline.config import load_config
    from cdc_pipeline.ops.row_counts import compare_row_counts

    pipeline.write_config(source_lock_timeout_seconds=1)
    pipeline.source([ITEMS, "INSERT INTO items VALUES (1, 'a')"])
    config = load_config(pipeline.config_path)
    with mariadb.connect(pipeline.source_db) as locker, locker.cursor() as cur:
        cur.execute("LOCK TABLES items WRITE")
        started = time.monotonic()
        with pytest.raises(Exception, match="Lock wait timeout"):
            compare_row_counts(config.connector(pipeline.name), config.destination)
        waited = time.monotonic() - started
    assert waited < 30, f"the count waited {waited:.0f} s on the lock"
