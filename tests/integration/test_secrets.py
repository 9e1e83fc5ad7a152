"""Source and destination passwords never reach logs, Dagster's run storage or the control schema."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.helpers.mariadb_source import CAPTURE_PASSWORD


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


WRITER = "cdc_writer"
WRITER_PASSWORD = "writer-pw-93d0aa"
# The rights the README lists for the destination role: nothing else, not even what PUBLIC gets by default.
WRITER_RIGHTS = "GRANT CONNECT, CREATE, TEMPORARY ON DATABASE {db} TO " + WRITER


def test_a_destination_role_with_only_the_listed_rights_replicates_and_stores_no_secret(pipeline):
    """Snapshot, stream, a dead letter and the control commands as a role holding only the README's rights; then
    no table of the destination database holds a password (offsets, schema history, state, stats, dead letters,
    the replicated rows)."""
    from cdc_pipeline.ops import cli

    destination = pipeline.destination
    destination.execute([f"DROP ROLE IF EXISTS {WRITER}",
                         f"CREATE ROLE {WRITER} LOGIN PASSWORD '{WRITER_PASSWORD}'",
                         f'REVOKE ALL ON DATABASE "{pipeline.dest_db}" FROM PUBLIC',
                         WRITER_RIGHTS.format(db=f'"{pipeline.dest_db}"')])
    pipeline.env["TEST_DEST_DSN"] = destination.dsn(pipeline.dest_db, user=WRITER, password=WRITER_PASSWORD)
    pipeline.source(["CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10), n INT)",
                     "INSERT INTO t VALUES (1, 'x', 1), (2, 'y', 2)"])
    pipeline.write_config(error_strategy="skip")

    run = pipeline.sync_cli()
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err[-3000:]
    destination.execute(f'ALTER TABLE "{pipeline.source_db}".t ADD CONSTRAINT small_n CHECK (n < 100)',
                        dbname=pipeline.dest_db)
    pipeline.source(["INSERT INTO t VALUES (3, 'z', 3), (4, 'poison', 500)", "UPDATE t SET v = 'x2' WHERE id = 1"])
    run = pipeline.sync_cli()
    out2, err2 = run.communicate(timeout=600)
    assert run.returncode == 0, err2[-3000:]
    for command in (["dead-letters", "list", pipeline.name], ["stats", pipeline.name], ["pause", pipeline.name]):
        assert cli.main(command) == 0

    assert pipeline.dest_rows("t") == [row for row in pipeline.source_rows("t") if row[0] != 4]
    tables = pipeline.dest_query(
        "SELECT table_schema, table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE' "
        "AND table_schema NOT IN ('pg_catalog', 'information_schema')")
    assert {"dead_letters", "debezium_offsets", "debezium_schema_history", "connector_state", "requests"} <= {
        name for _, name in tables}
    owners = pipeline.dest_query("SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class c JOIN pg_namespace n "
                                 "ON n.oid = c.relnamespace WHERE n.nspname IN ('cdc', %s)", (pipeline.source_db,))
    assert owners == [(WRITER,)], "the role owns what it created"
    letters = pipeline.dest_query("SELECT raw_event FROM cdc.dead_letters")
    assert len(letters) == 1 and "poison" in letters[0][0]
    for schema, name in tables:
        text = str(pipeline.dest_query(f'SELECT x::text FROM "{schema}"."{name}" x'))
        for secret in (CAPTURE_PASSWORD, WRITER_PASSWORD):
            assert secret not in text, f"{secret!r} is stored in {schema}.{name}"
    for secret in (CAPTURE_PASSWORD, WRITER_PASSWORD):
        assert secret not in out + err + out2 + err2


ACCOUNT_SECRET = "acct-secret-5f1c"


def test_account_statements_of_the_source_never_reach_the_schema_history(pipeline):
    pipeline.source(["CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO t VALUES (1, 'x')"])
    pipeline.sync()
    user = f"u_{pipeline.name}"
    pipeline.source([f"CREATE USER '{user}'@'%' IDENTIFIED BY '{ACCOUNT_SECRET}'",
                     f"ALTER USER '{user}'@'%' IDENTIFIED BY '{ACCOUNT_SECRET}-2'",
                     f"SET PASSWORD FOR '{user}'@'%' = PASSWORD('{ACCOUNT_SECRET}-3')",
                     f"GRANT SELECT ON *.* TO '{user}'@'%'",
                     "ALTER TABLE t ADD COLUMN w INT", "INSERT INTO t VALUES (2, 'y', 2)"])
    try:
        pipeline.sync()
    finally:
        pipeline.mariadb.execute([f"DROP USER IF EXISTS '{user}'@'%'"])

    history = str(pipeline.dest_query("SELECT h::text FROM cdc.debezium_schema_history h"))
    assert "ADD COLUMN w" in history, "the table's DDL is kept"
    assert ACCOUNT_SECRET not in history, "an account statement (with its password) was stored"
    for table in ("connector_state", "applied_positions", "stats", "dead_letters"):
        assert ACCOUNT_SECRET not in str(pipeline.dest_query(f"SELECT x::text FROM cdc.{table} x"))
    pipeline.assert_same("t")


def test_an_operator_submits_requests_and_rules_and_can_do_nothing_else(pipeline):
    OPERATOR = f"op_{pipeline.name}"  # noqa: N806 (a role of this test's own)
    pipeline.destination.execute([f"CREATE ROLE {OPERATOR} LOGIN"])
    pipeline.write_config(destination={"operator_role": OPERATOR})
    pipeline.source(["CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(40))", "INSERT INTO t VALUES (1, 'x')"])
    pipeline.sync()
    db, name = pipeline.source_db, pipeline.name
    operator_dsn = pipeline.destination.dsn(pipeline.dest_db, user=OPERATOR)

    with psycopg.connect(operator_dsn, autocommit=True) as operator:
        # What it may do: read the state and the numbers, submit a request, manage rules.
        assert operator.execute("SELECT state FROM cdc.connector_state WHERE connector = %s", (name,)).fetchone()
        operator.execute("SELECT * FROM cdc.stats").fetchall()
        operator.execute("INSERT INTO cdc.objmap (connector, kind, source_object, destination_object) VALUES "
                         "(%s, 'transform', %s, 'upper(%%d)')", (name, f"{db}.t.v"))
        # What it may not: the rows, the offsets, the state's own columns, others' requests.
        for statement in (f'SELECT * FROM "{db}".t', "SELECT * FROM cdc.debezium_offsets",
                          "SELECT * FROM cdc.debezium_schema_history", "SELECT * FROM cdc.dead_letters",
                          "UPDATE cdc.connector_state SET state = 'syncing'", "DELETE FROM cdc.stats",
                          "UPDATE cdc.requests SET status = 'done'", f'CREATE TABLE "{db}".mine (i int)',
                          "INSERT INTO cdc.requests (connector, kind, status) VALUES ('x', 'pause', 'done')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                operator.execute(statement)
    pipeline.source("INSERT INTO t VALUES (2, 'y')")
    assert pipeline.sync()["inserts"] == 1
    assert pipeline.dest_rows("t") == [(1, "x"), (2, "Y")], "the operator's rule applies to new changes"

    # A transform that would read other data, written into the rules table by hand, never runs: the run fails
    # naming the rule, and nothing is applied.
    with psycopg.connect(operator_dsn, autocommit=True) as operator:
        operator.execute("UPDATE cdc.objmap SET destination_object = %s WHERE connector = %s",
                         ("(SELECT string_agg(offset_value, ',') FROM cdc.debezium_offsets)", name))
    pipeline.source("INSERT INTO t VALUES (3, 'z')")
    with pytest.raises(Exception) as failed:
        pipeline.sync()
    assert "a sub-query is not allowed" in str(failed.value)
    assert pipeline.dest_rows("t") == [(1, "x"), (2, "Y")]
    pipeline.destination.execute([f"DROP OWNED BY {OPERATOR}", f"DROP ROLE {OPERATOR}"], dbname=pipeline.dest_db)
