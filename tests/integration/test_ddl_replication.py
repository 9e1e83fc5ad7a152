"""Schema changes from a real MariaDB, checked in the destination catalog and contents after each sync."""

from __future__ import annotations

import psycopg
import pytest

pytestmark = pytest.mark.integration


def columns(pipeline, table: str) -> dict[str, tuple[str, bool, str | None]]:
    """Destination column -> (type, not null, default)."""
    rows = pipeline.dest_query(
        """SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid)
           FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
           WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum""",
        (f'"{pipeline.source_db}"."{table}"',))
    return {name: (type_name, not_null, default) for name, type_name, not_null, default in rows}


def primary_key(pipeline, table: str) -> list[str]:
    rows = pipeline.dest_query(
        """SELECT a.attname FROM pg_index i JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(n, o) ON true
           JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n
           WHERE i.indrelid = %s::regclass AND i.indisprimary ORDER BY k.o""", (f'"{pipeline.source_db}"."{table}"',))
    return [row[0] for row in rows]


def unique_constraints(pipeline, table: str) -> set[tuple[str, ...]]:
    rows = pipeline.dest_query(
        """SELECT array_agg(a.attname ORDER BY k.o) FROM pg_constraint c
           JOIN LATERAL unnest(c.conkey) WITH ORDINALITY k(n, o) ON true
           JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n
           WHERE c.conrelid = %s::regclass AND c.contype = 'u' GROUP BY c.oid""", (f'"{pipeline.source_db}"."{table}"',))
    return {tuple(row[0]) for row in rows}


def test_create_table_with_types_defaults_identity_and_unique_keys(pipeline):
    pipeline.sync()
    pipeline.source(["""CREATE TABLE accounts (
        id INT NOT NULL AUTO_INCREMENT,
        email VARCHAR(120) NOT NULL,
        status ENUM('new', 'active') NOT NULL DEFAULT 'new',
        score DECIMAL(8,3) DEFAULT 1.5,
        opened DATETIME(3),
        PRIMARY KEY (id),
        UNIQUE KEY uk_email (email))""",
                     "INSERT INTO accounts (email) VALUES ('a@x'), ('b@x')"])

    pipeline.sync()

    cols = columns(pipeline, "accounts")
    assert cols["email"][:2] == ("character varying(120)", True)
    assert cols["score"][0] == "numeric(8,3)" and cols["score"][2] == "1.5"
    assert cols["opened"][0] == "timestamp(3) without time zone"
    assert primary_key(pipeline, "accounts") == ["id"]
    assert unique_constraints(pipeline, "accounts") == {("email",)}
    pipeline.assert_same("accounts")


def test_names_with_spaces_mixed_case_and_reserved_words(pipeline):
    pipeline.source(["CREATE TABLE `Order Items` (`Item ID` INT PRIMARY KEY, `select` VARCHAR(10), `Mixed Case` INT)",
                     "INSERT INTO `Order Items` VALUES (1, 'a', 10), (2, 'b', 20)"])
    pipeline.sync()
    pipeline.source(["UPDATE `Order Items` SET `select` = 'z' WHERE `Item ID` = 2",
                     "INSERT INTO `Order Items` VALUES (3, NULL, NULL)"])

    pipeline.sync()

    assert list(columns(pipeline, "order items")) == ["item id", "select", "mixed case"]
    assert pipeline.dest_rows("order items") == pipeline.source_rows("Order Items")


def test_tables_without_a_key_and_with_an_out_of_line_key(pipeline):
    pipeline.sync()
    pipeline.source(["CREATE TABLE nokey (a INT, b VARCHAR(5))",
                     "CREATE TABLE outofline (a INT NOT NULL, b INT NOT NULL, c TEXT, PRIMARY KEY (b, a))",
                     "INSERT INTO nokey VALUES (1, 'x'), (1, 'x')", "INSERT INTO outofline VALUES (1, 2, 'c')"])

    pipeline.sync()

    assert primary_key(pipeline, "nokey") == [] and primary_key(pipeline, "outofline") == ["b", "a"]
    assert sorted(pipeline.dest_rows("nokey")) == sorted(pipeline.source_rows("nokey"))
    pipeline.assert_same("outofline")


def test_add_drop_and_retype_columns_change_nullability_and_defaults(pipeline):
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, qty SMALLINT, label VARCHAR(10), gone INT)",
                     "INSERT INTO items VALUES (1, 5, 'a', 1), (2, NULL, 'b', 2)"])
    pipeline.sync()
    pipeline.source([
        "ALTER TABLE items ADD COLUMN added INT NOT NULL DEFAULT 7",
        "ALTER TABLE items DROP COLUMN gone",
        "ALTER TABLE items MODIFY qty BIGINT",
        "ALTER TABLE items MODIFY label VARCHAR(40) NOT NULL",
        "ALTER TABLE items ALTER added SET DEFAULT 9",
        "INSERT INTO items (id, qty, label) VALUES (3, 9000000000, 'a longer label here')",
    ])

    pipeline.sync()

    cols = columns(pipeline, "items")
    assert "gone" not in cols
    assert cols["qty"][0] == "bigint"
    assert cols["label"][:2] == ("character varying(40)", True)
    assert cols["added"][1] is True and cols["added"][2] == "9"
    pipeline.assert_same("items")


def test_primary_key_added_dropped_and_changed(pipeline):
    pipeline.source(["CREATE TABLE k (a INT NOT NULL, b INT NOT NULL, v INT)", "INSERT INTO k VALUES (1, 1, 1)"])
    pipeline.sync()
    pipeline.source(["ALTER TABLE k ADD PRIMARY KEY (a)", "UPDATE k SET v = 2 WHERE a = 1"])
    pipeline.sync()
    assert primary_key(pipeline, "k") == ["a"]

    pipeline.source(["ALTER TABLE k DROP PRIMARY KEY, ADD PRIMARY KEY (a, b)", "INSERT INTO k VALUES (1, 2, 3)"])
    pipeline.sync()

    assert primary_key(pipeline, "k") == ["a", "b"]
    pipeline.assert_same("k")


def test_rename_column_and_table_keep_the_data(pipeline):
    pipeline.source(["CREATE TABLE people (id INT PRIMARY KEY, nm VARCHAR(20), age INT)",
                     "INSERT INTO people VALUES (1, 'ann', 30), (2, 'bob', 40)"])
    pipeline.sync()
    pipeline.source(["ALTER TABLE people RENAME COLUMN nm TO name",
                     "ALTER TABLE people CHANGE age years SMALLINT",
                     "INSERT INTO people VALUES (3, 'cy', 50)"])
    pipeline.sync()
    assert list(columns(pipeline, "people")) == ["id", "name", "years"]
    pipeline.assert_same("people")

    pipeline.source(["RENAME TABLE people TO persons", "UPDATE persons SET name = 'anne' WHERE id = 1"])
    pipeline.sync()

    assert not pipeline.dest_table_exists("people")
    pipeline.assert_same("persons")


def test_truncate_drop_and_create_again(pipeline):
    pipeline.source(["CREATE TABLE t (id INT PRIMARY KEY, v INT)", "INSERT INTO t VALUES (1, 1), (2, 2)"])
    pipeline.sync()
    pipeline.source(["TRUNCATE TABLE t", "INSERT INTO t VALUES (3, 3)"])
    summary = pipeline.sync()
    assert summary["truncates"] == 1
    pipeline.assert_same("t")

    pipeline.source(["DROP TABLE t", "CREATE TABLE t (id INT PRIMARY KEY, w VARCHAR(5))",
                     "INSERT INTO t VALUES (10, 'new')"])
    pipeline.sync()

    assert list(columns(pipeline, "t")) == ["id", "w"]
    pipeline.assert_same("t")


def _offsets(pipeline) -> list[tuple[str, str]]:
    return pipeline.dest_query("SELECT offset_key, offset_value FROM cdc.debezium_offsets WHERE connector = %s",
                               (pipeline.name,))


def _rewind(pipeline, saved: list[tuple[str, str]], *, forget_applied_position: bool) -> None:
    """As if the run had been killed before Debezium's last offset flush and before it recorded where it ended idle
    (from where the next run's engine would start, `mariadb.resume_offset`): the next run gets the same events
    again."""
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        for key, value in saved:
            conn.execute("UPDATE cdc.debezium_offsets SET offset_value = %s WHERE connector = %s AND offset_key = %s",
                         (value, pipeline.name, key))
        conn.execute("UPDATE cdc.connector_state SET source_checked = NULL WHERE connector = %s", (pipeline.name,))
        if forget_applied_position:
            conn.execute("DELETE FROM cdc.applied_positions WHERE connector = %s", (pipeline.name,))


def test_the_last_ddl_delivered_again_changes_nothing(pipeline):
    pipeline.source(["CREATE TABLE d (id INT PRIMARY KEY, v INT)", "INSERT INTO d VALUES (1, 1)"])
    pipeline.sync()
    pipeline.source(["ALTER TABLE d RENAME COLUMN v TO v2", "INSERT INTO d VALUES (2, 2)"])
    pipeline.sync()
    before_last_ddl = _offsets(pipeline)
    pipeline.source(["ALTER TABLE d ADD COLUMN w INT DEFAULT 0", "INSERT INTO d VALUES (3, 3, 3)",
                     "UPDATE d SET w = 5 WHERE id = 1"])
    pipeline.sync()

    # Even without our applied-position record, re-applying the last DDL and its rows is harmless.
    _rewind(pipeline, before_last_ddl, forget_applied_position=True)
    again = pipeline.sync()

    assert (again["ddls"], again["inserts"], again["updates"]) == (1, 1, 1)
    assert list(columns(pipeline, "d")) == ["id", "v2", "w"]
    pipeline.assert_same("d")


def test_events_delivered_again_after_a_lost_offset_flush_are_skipped(pipeline):
    pipeline.source(["CREATE TABLE e (id INT PRIMARY KEY, v INT)", "INSERT INTO e VALUES (1, 1)"])
    pipeline.sync()
    saved = _offsets(pipeline)
    pipeline.source(["ALTER TABLE e ADD COLUMN w INT", "ALTER TABLE e RENAME COLUMN v TO v2",
                     "INSERT INTO e VALUES (2, 2, 2)", "UPDATE e SET w = 5 WHERE id = 1", "DELETE FROM e WHERE id = 2",
                     "INSERT INTO e VALUES (3, 3, 3)"])
    first = pipeline.sync()

    _rewind(pipeline, saved, forget_applied_position=False)
    again = pipeline.sync()

    assert again["events"] == 0 and again["redelivered"] == first["events"]
    assert list(columns(pipeline, "e")) == ["id", "v2", "w"]
    pipeline.assert_same("e")


def test_a_type_change_postgresql_cannot_cast_fails_with_a_clear_error(pipeline):
    from cdc_pipeline.ops.cli import main

    pipeline.source(["CREATE TABLE c (id INT PRIMARY KEY, at DATETIME)", "INSERT INTO c VALUES (1, '2024-01-02 03:04:05')"])
    pipeline.sync()
    pipeline.source("ALTER TABLE c MODIFY at TIME")

    assert main(["sync", pipeline.name]) == 1

    error = pipeline.dest_query("SELECT last_error FROM cdc.connector_state WHERE connector = %s", (pipeline.name,))[0][0]
    assert "ALTER TABLE c MODIFY at TIME" in error and f"connector '{pipeline.name}'" in error
    assert f"table '{pipeline.source_db}.c'" in error and "'file': 'mariadb-bin." in error
    assert columns(pipeline, "c")["at"][0] == "timestamp(0) without time zone", "the failed batch was rolled back"
    assert main(["sync", pipeline.name]) == 1, "the next run retries the same batch"
