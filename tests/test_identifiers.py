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
