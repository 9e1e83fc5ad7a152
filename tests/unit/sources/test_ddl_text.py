"""MySQL/MariaDB DDL text read for what a schema change's table definitions cannot tell: renames and unique keys."""

from __future__ import annotations

import pytest

from cdc_pipeline.sources.ddl_text import DdlRenames, UniqueKeyChanges, parse_renames, parse_unique_keys


@pytest.mark.parametrize(
    ("ddl", "columns"),
    [
        ("ALTER TABLE a RENAME COLUMN x TO y", [("x", "y")]),
        ("alter table a rename column x to y", [("x", "y")]),
        ("ALTER TABLE `a` RENAME COLUMN `first name` TO `given name`", [("first name", "given name")]),
        ("ALTER TABLE a RENAME COLUMN `odd``one` TO `plain`", [("odd`one", "plain")]),
        (
            "ALTER TABLE a\n  RENAME COLUMN p TO q,\n  RENAME COLUMN IF EXISTS `r s` TO t,\n  ADD COLUMN u INT",
            [("p", "q"), ("r s", "t")],
        ),
        ("ALTER TABLE a CHANGE y z BIGINT NOT NULL DEFAULT 5", [("y", "z")]),
        ("ALTER TABLE a CHANGE COLUMN `old name` `New Name` VARCHAR(10)", [("old name", "New Name")]),
        ("ALTER TABLE a CHANGE z z INT NULL", []),
        ("ALTER TABLE a MODIFY z INT NULL, CHANGE COLUMN m n TEXT, RENAME COLUMN o TO p", [("m", "n"), ("o", "p")]),
        ("ALTER TABLE a COMMENT 'RENAME COLUMN x TO y', ALTER b SET DEFAULT 'CHANGE c d'", []),
        ("/* RENAME COLUMN x TO y */ ALTER TABLE a ADD COLUMN v INT -- CHANGE c d INT\n", []),
        ("ALTER TABLE a ADD COLUMN v INT # RENAME COLUMN x TO y", []),
    ],
)
def test_parse_renames_finds_column_renames(ddl: str, columns: list[tuple[str, str]]) -> None:
    assert parse_renames(ddl) == DdlRenames(columns=columns, tables=[])


@pytest.mark.parametrize(
    ("ddl", "tables"),
    [
        ("RENAME TABLE a TO b", [(None, "a", None, "b")]),
        ("rename table a to b, `c d` TO `e`, inv.f TO `other db`.`g`", [
            (None, "a", None, "b"), (None, "c d", None, "e"), ("inv", "f", "other db", "g")
        ]),
        ("RENAME TABLE `inv`.`a` WAIT 5 TO `inv`.`b`", [("inv", "a", "inv", "b")]),
        ("ALTER TABLE b RENAME TO c", [(None, "b", None, "c")]),
        ("ALTER TABLE `inv`.`b` RENAME AS `inv`.`c`", [("inv", "b", "inv", "c")]),
        ("ALTER TABLE b RENAME c", [(None, "b", None, "c")]),
        ("ALTER TABLE b RENAME INDEX i TO j", []),
        ("ALTER TABLE b COMMENT 'RENAME TO c'", []),
    ],
)
def test_parse_renames_finds_table_renames(ddl: str, tables: list[tuple[str | None, str, str | None, str]]) -> None:
    assert parse_renames(ddl).tables == tables


def test_parse_renames_of_a_statement_renaming_columns_and_the_table() -> None:
    renames = parse_renames("ALTER TABLE a RENAME COLUMN x TO y, RENAME TO b")
    assert renames == DdlRenames(columns=[("x", "y")], tables=[(None, "a", None, "b")])


def test_parse_unique_keys_of_create_table() -> None:
    ddl = """CREATE TABLE u (
        id INT,
        email VARCHAR(20) UNIQUE,
        login VARCHAR(20) UNIQUE KEY COMMENT 'not UNIQUE (id)',
        a INT, b INT, c INT CHECK (c <> 'UNIQUE'),
        PRIMARY KEY (id),
        UNIQUE KEY uk (a),
        UNIQUE INDEX `b idx` USING BTREE (`b`(10), a DESC),
        unique (c),
        CONSTRAINT sym UNIQUE (a, c),
        CONSTRAINT sym2 UNIQUE KEY idx2 (b),
        CONSTRAINT UNIQUE (email, a),
        KEY k (c),
        CONSTRAINT fk FOREIGN KEY (a) REFERENCES t (id)
    ) ENGINE=InnoDB"""
    assert parse_unique_keys(ddl) == UniqueKeyChanges(
        added=[
            (None, ("email",)),
            (None, ("login",)),
            ("uk", ("a",)),
            ("b idx", ("b", "a")),
            (None, ("c",)),
            ("sym", ("a", "c")),
            ("idx2", ("b",)),
            (None, ("email", "a")),
        ],
        dropped=[],
    )


def test_parse_unique_keys_of_a_snapshot_create() -> None:
    ddl = (
        "CREATE TABLE `t` (\n  `id` int(11) NOT NULL,\n  `email` varchar(120) NOT NULL,\n  PRIMARY KEY (`id`),\n"
        "  UNIQUE KEY `email` (`email`)\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci"
    )
    assert parse_unique_keys(ddl) == UniqueKeyChanges(added=[("email", ("email",))], dropped=[])


@pytest.mark.parametrize(
    ("ddl", "added", "dropped"),
    [
        ("ALTER TABLE c ADD UNIQUE (z)", [(None, ("z",))], []),
        ("ALTER TABLE c ADD UNIQUE KEY IF NOT EXISTS uz (z, `y y`(5))", [("uz", ("z", "y y"))], []),
        ("ALTER TABLE c ADD CONSTRAINT cz UNIQUE (z)", [("cz", ("z",))], []),
        ("ALTER TABLE c ADD CONSTRAINT cz UNIQUE INDEX iz (z)", [("iz", ("z",))], []),
        ("ALTER TABLE c ADD COLUMN w INT UNIQUE, ADD v INT", [(None, ("w",))], []),
        ("ALTER TABLE c ADD COLUMN (w INT, v INT UNIQUE)", [(None, ("v",))], []),
        ("ALTER TABLE c MODIFY z INT UNIQUE", [(None, ("z",))], []),
        ("ALTER TABLE c CHANGE z w INT UNIQUE", [(None, ("w",))], []),
        ("ALTER TABLE c ADD INDEX i (z), ADD PRIMARY KEY (id)", [], []),
        ("ALTER TABLE c DROP INDEX uz", [], ["uz"]),
        ("ALTER TABLE c DROP KEY IF EXISTS `u z`, DROP CONSTRAINT cz, DROP PRIMARY KEY", [], ["u z", "cz"]),
        ("ALTER TABLE c DROP INDEX `PRIMARY`, DROP FOREIGN KEY fk, DROP COLUMN q", [], []),
        ("ALTER TABLE c DROP INDEX uz, ADD UNIQUE uz (z, y)", [("uz", ("z", "y"))], ["uz"]),
        ("CREATE UNIQUE INDEX uz ON c (z)", [("uz", ("z",))], []),
        ("DROP INDEX uz ON c", [], ["uz"]),
        ("ALTER TABLE c COMMENT 'ADD UNIQUE (z)'", [], []),
    ],
)
def test_parse_unique_keys_of_alter_table(ddl: str, added: list, dropped: list[str]) -> None:
    assert parse_unique_keys(ddl) == UniqueKeyChanges(added=added, dropped=dropped)
