"""Source names with quotes, semicolons, spaces and non-ASCII letters replicate as names, never as SQL."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

TABLE = 'odd"na;me DROP TABLE x;--'
KEYLESS = "notes_\u00e9t\u00e9_\u8868"
COLUMNS = ['i"d', "qu'ote", "semi;colon", "sp ace", "caf\u00e9_\u4e2d"]


def test_odd_identifiers_are_names_not_sql(pipeline):
    columns = ", ".join(f"`{name}` {kind}" for name, kind in zip(COLUMNS, ("INT", "VARCHAR(20)", "INT", "TEXT",
                                                                            "VARCHAR(10)")))
    pipeline.source([
        f"CREATE TABLE `{TABLE}` ({columns}, PRIMARY KEY (`i\"d`))",
        f"CREATE TABLE `{KEYLESS}` (`n` INT, `caf\u00e9_\u4e2d` VARCHAR(10))",
        f"INSERT INTO `{TABLE}` VALUES (1, 'it''s', 1, 'a;b', '\u4e2d\u6587'), (2, '\"; DROP TABLE x; --', 2, NULL, NULL)",
        f"INSERT INTO `{KEYLESS}` VALUES (1, '\u00e9'), (1, '\u00e9')",
    ])
    pipeline.sync()
    pipeline.source([
        f"INSERT INTO `{TABLE}` VALUES (3, 'three', 3, 'c', 'd')",
        f"UPDATE `{TABLE}` SET `semi;colon` = 20, `sp ace` = 'x y' WHERE `i\"d` = 2",
        f"DELETE FROM `{TABLE}` WHERE `i\"d` = 1",
        f"ALTER TABLE `{TABLE}` ADD COLUMN `new\"col;` INT DEFAULT 7",
        f"DELETE FROM `{KEYLESS}` LIMIT 1",
    ])
    pipeline.sync()

    assert pipeline.dest_rows(TABLE.lower()) == pipeline.source_rows(TABLE)  # names are lowercased by default
    assert sorted(pipeline.dest_rows(KEYLESS)) == sorted(pipeline.source_rows(KEYLESS))
    columns = pipeline.dest_query(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 ORDER BY attnum",
        (f'"{pipeline.source_db}"."{TABLE.lower().replace(chr(34), chr(34) * 2)}"',))
    assert [name for (name,) in columns] == [name.lower() for name in COLUMNS] + ['new"col;']


DOTTED = "a.b"
PERCENT = "pct%s_100%"


def test_a_dot_or_a_percent_in_a_table_name_replicates_and_counts(pipeline):
    # A dot in a table's name is part of the name (`db.a.b` is table `a.b`), not a schema separator.
    pipeline.source([
        f"CREATE TABLE `{DOTTED}` (id INT PRIMARY KEY, v VARCHAR(10))",
        f"CREATE TABLE `{PERCENT}` (`n%` INT, v VARCHAR(10))",
        f"INSERT INTO `{DOTTED}` VALUES (1, 'one'), (2, 'two')",
        f"INSERT INTO `{PERCENT}` VALUES (1, 'x'), (1, 'x')",
    ])
    pipeline.sync()
    pipeline.source([f"INSERT INTO `{DOTTED}` VALUES (3, 'three')", f"UPDATE `{DOTTED}` SET v = 'TWO' WHERE id = 2",
                     f"DELETE FROM `{DOTTED}` WHERE id = 1", f"DELETE FROM `{PERCENT}` LIMIT 1",
                     f"INSERT INTO `{PERCENT}` VALUES (2, 'y')"])
    pipeline.sync()

    assert pipeline.dest_rows(DOTTED) == pipeline.source_rows(DOTTED)
    assert sorted(pipeline.dest_rows(PERCENT)) == sorted(pipeline.source_rows(PERCENT))
    from cdc_pipeline.config import load_config
    from cdc_pipeline.ops.row_counts import compare_row_counts

    config = load_config(pipeline.config_path)
    counts = {count.source_table: count for count in compare_row_counts(config.connector(pipeline.name),
                                                                        config.destination)}
    assert set(counts) == {f"{pipeline.source_db}.{DOTTED}", f"{pipeline.source_db}.{PERCENT}"}
    assert all(count.matches for count in counts.values()), counts


def test_statements_with_parameters_take_names_with_a_percent(destination_pg):
    import psycopg
    from psycopg import sql

    from cdc_pipeline.sink.table_writes import param_identifier

    destination_pg.create_database("percent_names")
    with psycopg.connect(destination_pg.dsn("percent_names"), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} ({} int, v text)").format(sql.Identifier(PERCENT), sql.Identifier("n%")))
        conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a')").format(sql.Identifier(PERCENT)))
        updated = conn.execute(sql.SQL("UPDATE {} SET v = %s WHERE {} = %s").format(
            param_identifier(PERCENT), param_identifier("n%")), ("b", 1)).rowcount

    assert updated == 1


def test_a_database_named_with_regex_characters_is_captured_by_its_name(pipeline):
    # Debezium reads its include lists as regular expressions, where `$` ends the name before the `1`.
    database = f"{pipeline.source_db}$1"
    pipeline.mariadb.execute(f"CREATE DATABASE `{database}`")
    pipeline.source_db = database
    pipeline.write_config()
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v VARCHAR(20))", "INSERT INTO items VALUES (1, 'a')"])
    pipeline.sync()
    pipeline.source(["INSERT INTO items VALUES (2, 'b')", "UPDATE items SET v = 'A' WHERE id = 1"])

    pipeline.sync()

    pipeline.assert_same("items")
