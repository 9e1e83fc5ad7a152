"""The destination sessions the pipeline opens run with the settings its SQL depends on, whatever the database's or
the role's defaults: the merge sees what Spark's tasks staged, values read the same, names resolve to the catalog's.

A DBA may set any of these with ALTER DATABASE ... SET or ALTER ROLE ... SET; each setting below changes either what
a transaction sees (the isolation level), how a name resolves (search_path) or how a value's text reads or writes.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql

from cdc_pipeline.capture.runner import jdbc_target
from cdc_pipeline import faults
from cdc_pipeline.config import DestinationConfig
from cdc_pipeline.errors import StagingMismatchError

pytestmark = pytest.mark.integration

# What a DBA may set, one set at the database's level and another at the role's: every value differs from what
# the pipeline pins.
DATABASE_DEFAULTS = {
    "default_transaction_isolation": "serializable", "search_path": "nowhere", "DateStyle": "SQL, DMY",
    "TimeZone": "Pacific/Chatham", "standard_conforming_strings": "off", "extra_float_digits": "-15",
    "bytea_output": "escape", "IntervalStyle": "sql_standard", "client_encoding": "LATIN1",
}
ROLE_DEFAULTS = {
    "default_transaction_isolation": "repeatable read", "search_path": "elsewhere, public", "DateStyle": "German, DMY",
    "TimeZone": "America/St_Johns", "standard_conforming_strings": "off", "extra_float_digits": "0",
    "bytea_output": "escape", "IntervalStyle": "iso_8601", "client_encoding": "WIN1252",
}
# What every session of the pipeline runs with, as SHOW writes it.
PINNED = {
    "default_transaction_isolation": "read committed", "search_path": "pg_catalog, pg_temp", "DateStyle": "ISO, MDY",
    "TimeZone": "UTC", "standard_conforming_strings": "on", "extra_float_digits": "3", "bytea_output": "hex",
    "IntervalStyle": "postgres", "client_encoding": "UTF8",
}
# How the tests read the destination back: their own settings, whatever the defaults.
READER_OPTIONS = ("-c DateStyle=ISO,MDY -c TimeZone=UTC -c IntervalStyle=postgres -c extra_float_digits=3 "
                  "-c bytea_output=hex -c client_encoding=UTF8 -c search_path=pg_catalog")


def _set_defaults(destination_pg, target: str, name: str, settings: dict[str, str]) -> None:
    destination_pg.execute([sql.SQL("ALTER {} {} SET {} = {}").format(
        sql.SQL(target), sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)).as_string()
        for setting, value in settings.items()])


def _writer_with_hostile_defaults(destination_pg, dbname: str, levels: tuple[str, ...]) -> str:
    """A superuser role of the test's own whose DSN reaches `dbname`, with the hostile defaults set at `levels`."""
    role = f"w_{uuid.uuid4().hex[:8]}"
    destination_pg.execute(f"CREATE ROLE {role} LOGIN SUPERUSER")
    if "database" in levels:
        _set_defaults(destination_pg, "DATABASE", dbname, DATABASE_DEFAULTS)
    if "role" in levels:
        _set_defaults(destination_pg, "ROLE", role, ROLE_DEFAULTS)
    return destination_pg.dsn(dbname, user=role)


def test_every_destination_session_pins_its_settings(destination_pg, spark):
    dbname = f"dst_{uuid.uuid4().hex[:8]}"
    destination_pg.create_database(dbname)
    dsn = _writer_with_hostile_defaults(destination_pg, dbname, ("database", "role"))
    destination = DestinationConfig(dsn=dsn)
    with psycopg.connect(dsn, options="-c client_encoding=UTF8") as unpinned:
        assert unpinned.execute("SHOW DateStyle").fetchone()[0] == "German, DMY", "the role's defaults hold"

    with destination.connect() as conn:
        python = {name: conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()[0]
                  for name in PINNED}
    # The JVM's sessions (the stores' and Spark's tasks') all connect through ExecutorJdbc.
    connection = spark._jvm.io.cdcpipeline.runner.ExecutorJdbc.connect(*jdbc_target(destination))
    try:
        statement = connection.createStatement()
        java = {}
        for name in PINNED:
            result = statement.executeQuery(f'SHOW "{name}"')
            result.next()
            java[name] = result.getString(1)
    finally:
        connection.close()
    for session, shown in (("psycopg", python), ("pgjdbc", java)):
        for name, wanted in PINNED.items():
            assert shown[name] == wanted, \
                f"{session}'s session shows {name} = {shown[name]!r}"


# Values whose text depends on a setting: dates (DateStyle), timestamps with time zone (TimeZone), intervals
# (IntervalStyle), floats (extra_float_digits), bytes (bytea_output), backslashes (standard_conforming_strings),
# and characters beyond Latin-1 (client_encoding).
TABLE = ("(id integer PRIMARY KEY, d date, ts timestamp(6), tstz timestamptz, iv interval, f8 double precision, "
         "f4 real, b bytea, t text)")
ROWS = [
    "(1, '2024-03-05', '2024-03-05 01:02:03.456789', '2024-03-05 23:30:00+00', '-1 day +02:03:04.5', 0.1, 0.1, "
    "'\\x005c27ff', E'a\\\\b''c ł €')",
    "(2, '0099-12-31', '1999-12-31 23:59:59', '2000-01-01 00:00:00-12', '1 year 2 mons -3 days -00:00:01', "
    "1e-300, 3.4e38, '\\x', E'\\\\x41')",
    "(3, '2024-01-02', '2024-01-02 00:00:00', '2024-06-30 12:00:00+05:45', '00:00:00.000001', "
    "1.7976931348623157e308, -0.5, '\\x5c5c', 'back\\slash')",
]
CHANGES = [
    "UPDATE items SET d = d + 1, tstz = tstz + interval '90 minutes', iv = iv * 2, f8 = f8 / 3, "
    "b = b || '\\x5c'::bytea, t = t || E'\\\\n' WHERE id IN (1, 3)",
    "DELETE FROM items WHERE id = 2",
    "INSERT INTO items VALUES (4, '2024-12-31', '2024-12-31 23:59:59.999999', '2024-12-31 23:59:59.999999+14', "
    "'-178000000 years', 2.2250738585072014e-308, 1.17549435e-38, '\\x00', E'\\\\\\\\')",
    "INSERT INTO notes SELECT d, tstz, iv, f8, b, t FROM items",
    "DELETE FROM notes WHERE f8 > 1",
    "UPDATE notes SET t = t || ' ł' WHERE b = '\\x00'",
]


def _reader_rows(dsn: str, table: str) -> list[tuple]:
    with psycopg.connect(dsn, options=READER_OPTIONS) as conn:
        return conn.execute(sql.SQL("SELECT * FROM {} ORDER BY 1, 2").format(
            sql.Identifier("public", table))).fetchall()


def test_a_destination_with_other_defaults_gets_an_exact_copy(pg_pipeline, destination_pg, monkeypatch):
    pipe = pg_pipeline
    pipe.write_config(tables=["public.items", "public.notes"])
    pipe.source([f"CREATE TABLE items {TABLE}", f"INSERT INTO items VALUES {', '.join(ROWS)}",
                 "CREATE TABLE notes (d date, tstz timestamptz, iv interval, f8 double precision, b bytea, t text)",
                 "ALTER TABLE notes REPLICA IDENTITY FULL",
                 "INSERT INTO notes SELECT d, tstz, iv, f8, b, t FROM items"])
    writer_dsn = _writer_with_hostile_defaults(destination_pg, pipe.dest_db, ("database", "role"))
    monkeypatch.setenv("TEST_DEST_DSN", writer_dsn)
    pipe.sync()
    for table in ("items", "notes"):
        assert _reader_rows(pipe.dest_dsn, table) == _reader_rows(pipe.source_dsn, table), f"snapshot of {table}"

    pipe.source(CHANGES)
    counts = pipe.sync()
    assert counts["deletes"] >= 1 and counts["updates"] >= 2
    for table in ("items", "notes"):
        assert _reader_rows(pipe.dest_dsn, table) == _reader_rows(pipe.source_dsn, table), f"changes of {table}"


def test_a_merge_that_cannot_see_the_staged_rows_fails_the_batch(pg_pipeline, monkeypatch):
    pipe = pg_pipeline
    pipe.source(["CREATE TABLE items (id integer PRIMARY KEY, v text)",
                 "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 20) AS g"])
    pipe.sync()
    pipe.source(["UPDATE items SET v = 'changed' WHERE id <= 5", "DELETE FROM items WHERE id > 15",
                 "INSERT INTO items VALUES (21, 'new')"])
    rows, positions = pipe.dest_rows("items"), pipe.dest_query("SELECT * FROM cdc.applied_positions")

    # The batch's snapshot taken before the tasks commit the staged rows, as REPEATABLE READ did.
    monkeypatch.setenv(faults.EARLY_SNAPSHOT_ENV, "1")
    with pytest.raises(StagingMismatchError, match=r"the merge sees 0 of the \d+ rows Spark's tasks staged") as failed:
        pipe.sync()
    assert failed.value.connector == pipe.name and failed.value.table == "public.items"
    assert failed.value.position is not None
    assert pipe.dest_rows("items") == rows, "nothing of the batch is applied"
    assert pipe.dest_query("SELECT * FROM cdc.applied_positions") == positions, "the position does not move"

    monkeypatch.delenv(faults.EARLY_SNAPSHOT_ENV)
    pipe.sync()
    pipe.assert_same("items")
