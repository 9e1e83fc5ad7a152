"""One MariaDB connector of several databases (`databases` with a pattern): one engine and one run for all of them,
each database in its own destination schema; a database created while it streams is picked up, a dropped one's tables
are dropped, and a database the pattern does not match is never read."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

TABLES = ("orders", "customers")


def tenant(pipeline, index: int) -> str:
    return f"{pipeline.source_db}_t{index}"


def make_tenant(pipeline, database: str, rows: int) -> None:
    pipeline.mariadb.execute(f"CREATE DATABASE `{database}`")
    pipeline.mariadb.execute([
        "CREATE TABLE orders (id INT PRIMARY KEY, amount DECIMAL(10,2), note VARCHAR(40))",
        "CREATE TABLE customers (id INT PRIMARY KEY, name VARCHAR(40))",
        f"INSERT INTO orders SELECT seq, seq * 1.5, CONCAT('{database}-', seq) FROM seq_1_to_{rows}",
        f"INSERT INTO customers SELECT seq, CONCAT('c', seq) FROM seq_1_to_{rows}",
    ], database=database)


def assert_tenant_exact(pipeline, database: str) -> None:
    for table in TABLES:
        source = pipeline.mariadb.query(f"SELECT * FROM `{table}` ORDER BY 1", database=database)
        assert pipeline.dest_rows(table, schema=database) == [tuple(row) for row in source], f"{database}.{table}"


def dest_schemas(pipeline) -> set[str]:
    return {name for (name,) in pipeline.dest_query(
        "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (f"{pipeline.source_db}%",))}


def cli(pipeline, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cdc_pipeline.ops.cli", *args], env={**pipeline.env,
                          "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=300)


def test_one_connector_loads_streams_and_follows_databases_that_come_and_go(pipeline):
    first, second, third = (tenant(pipeline, index) for index in (1, 2, 3))
    outside = f"{pipeline.source_db}_x1"  # matched by no pattern
    late = f"{pipeline.source_db}_late"  # matched later
    for database in (first, second, outside, late):
        make_tenant(pipeline, database, 300)
    pipeline.write_config(database=None, databases=[f"{pipeline.source_db}_t*"])

    pipeline.sync()

    for database in (first, second):
        assert_tenant_exact(pipeline, database)
    assert dest_schemas(pipeline) == {first, second}, "a schema per database, none for the one outside the pattern"
    check = cli(pipeline, "check", pipeline.name)
    assert check.returncode == 0 and "databases" not in check.stdout, check.stdout + check.stderr

    pipeline.mariadb.execute(["UPDATE orders SET note = 'changed' WHERE id <= 10", "DELETE FROM customers WHERE id > 290",
                              "INSERT INTO orders VALUES (1000, 1, 'new')"], database=first)
    pipeline.mariadb.execute("UPDATE customers SET name = 'renamed' WHERE id = 1", database=second)
    pipeline.mariadb.execute("INSERT INTO orders VALUES (1000, 1, 'outside')", database=outside)
    pending = cli(pipeline, "pending", pipeline.name)
    assert pending.returncode == 0, pending.stdout + pending.stderr
    make_tenant(pipeline, third, 200)  # created while the connector streams

    pipeline.sync()

    for database in (first, second, third):
        assert_tenant_exact(pipeline, database)
    assert dest_schemas(pipeline) == {first, second, third}
    pipeline.mariadb.execute("UPDATE customers SET name = 'before it matched' WHERE id = 5", database=late)
    pipeline.sync()  # the stream passes that change of a database it does not capture

    # A database that existed before it matched (a name added to `databases`), with rows the stream never carried,
    # and a table created outside the binlog: each is copied by a load while the others stream.
    pipeline.mariadb.execute(["SET SESSION sql_log_bin = 0", "CREATE TABLE hidden (id INT PRIMARY KEY, v TEXT)",
                              "INSERT INTO hidden SELECT seq, REPEAT('h', seq) FROM seq_1_to_40"], database=first)
    pipeline.write_config(database=None, databases=[f"{pipeline.source_db}_t*", late])
    pipeline.mariadb.execute("UPDATE orders SET note = 'after it matched' WHERE id = 3", database=late)

    pipeline.sync()  # streams to its idle end, and finds the tables it never created
    pipeline.mariadb.execute("UPDATE customers SET name = 'streamed' WHERE id = 2", database=first)
    pipeline.sync()  # copies them, and streams on

    for database in (first, third, late):
        assert_tenant_exact(pipeline, database)
    assert pipeline.dest_rows("hidden", schema=first) == [tuple(row) for row in pipeline.mariadb.query(
        "SELECT * FROM hidden ORDER BY 1", database=first)]
    pipeline.mariadb.execute("INSERT INTO orders VALUES (2000, 2, 'streamed after its load')", database=late)
    pipeline.sync()
    assert_tenant_exact(pipeline, late)

    # One database paused alone: its changes are let go while the others stream; its resume copies it again.
    assert cli(pipeline, "pause", pipeline.name, f"{first}.*").returncode == 0
    pipeline.mariadb.execute("UPDATE orders SET note = 'while paused' WHERE id <= 5", database=first)
    pipeline.mariadb.execute("UPDATE orders SET note = 'streams on' WHERE id <= 5", database=third)
    pipeline.sync()
    assert_tenant_exact(pipeline, third)
    assert [row[2] for row in pipeline.dest_rows("orders", schema=first)[:5]] != ["while paused"] * 5
    state = json.loads(cli(pipeline, "state", pipeline.name, "--json").stdout)
    assert state[0]["paused_tables"] == [f"{first}.*"] and state[0]["state"] == "syncing", state
    assert cli(pipeline, "resume", pipeline.name, f"{first}.*").returncode == 0
    pipeline.sync()
    assert_tenant_exact(pipeline, first)

    pipeline.mariadb.execute(f"DROP DATABASE `{second}`")
    pipeline.mariadb.execute("INSERT INTO customers VALUES (5000, 'after the drop')", database=third)
    pipeline.sync()

    assert pipeline.dest_query("SELECT to_regclass(%s), to_regclass(%s)",
                               (f'"{second}".orders', f'"{second}".customers'))[0] == (None, None)
    for database in (first, third):
        assert_tenant_exact(pipeline, database)

    verify = cli(pipeline, "verify", pipeline.name)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    per_database = {row["database"]: row for row in json.loads(
        cli(pipeline, "stats", pipeline.name, "--databases", "--json").stdout)}
    assert per_database[third]["inserts"] == 401 and per_database[third]["tables"] == 2, per_database[third]
    assert per_database[first]["updates"] >= 10 and outside not in per_database
    pipeline.dest_query(f'UPDATE "{third}".orders SET note = \'damaged\' WHERE id = 7 RETURNING 1')
    one_database = cli(pipeline, "verify", pipeline.name, f"{third}.*", "--json")
    assert one_database.returncode == 1 and {table["source_table"] for table in json.loads(one_database.stdout)[
        "tables"]} == {f"{third}.orders", f"{third}.customers"}, one_database.stdout
    requested = cli(pipeline, "snapshot", pipeline.name, f"{third}.*")
    assert requested.returncode == 0, requested.stdout + requested.stderr
    pipeline.sync()
    assert_tenant_exact(pipeline, third)
    idle = cli(pipeline, "pending", pipeline.name, "--json")
    assert idle.returncode == 1 and json.loads(idle.stdout)[pipeline.name]["work"] is False, idle.stdout
    pipeline.mariadb.execute("INSERT INTO orders VALUES (1001, 1, 'outside')", database=outside)
    assert cli(pipeline, "pending", pipeline.name).returncode == 1, "a database outside the pattern asks for no run"


RICH_TABLE = """CREATE TABLE {name} (
    id INT UNSIGNED NOT NULL AUTO_INCREMENT, big BIGINT, amount DECIMAL(12,4) DEFAULT 1.5,
    label VARCHAR(50) NOT NULL DEFAULT 'x', body TEXT, at DATETIME(3), stamp TIMESTAMP NULL, kind ENUM('a','b'),
    flags SET('x','y'), bits BIT(3), raw BLOB, doc JSON, day DATE, span TIME(2), yr YEAR, ratio DOUBLE, f FLOAT,
    code CHAR(3), PRIMARY KEY (id), UNIQUE KEY uk_code (code))"""


def test_a_table_made_from_the_source_definition_is_the_table_the_streams_ddl_makes(pipeline):
    pipeline.sync()
    pipeline.source(RICH_TABLE.format(name="streamed"))
    pipeline.source(["SET SESSION sql_log_bin = 0", RICH_TABLE.format(name="unseen"),
                     "INSERT INTO unseen (big, label, code, day) VALUES (1, 'y', 'abc', '2024-02-29')"])

    pipeline.sync()  # creates `streamed` from the stream; at its idle end finds `unseen`
    pipeline.sync()  # copies `unseen`

    def described(table: str) -> list[tuple]:
        return pipeline.dest_query(
            """SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid)
               FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
               WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum""",
            (f'"{pipeline.source_db}"."{table}"',))

    differing = [(made, streamed) for made, streamed in zip(described("unseen"), described("streamed"))
                 if made != streamed]
    # The server writes a DEFAULT as it stores it (1.5000), the statement as it was typed (1.5): the same value.
    assert differing == [(("amount", "numeric(12,4)", False, "1.5000"), ("amount", "numeric(12,4)", False, "1.5"))]
    assert pipeline.dest_primary_key("unseen") == ["id"]
    pipeline.assert_same("unseen")
