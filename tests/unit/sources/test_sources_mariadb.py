"""The MariaDB source helpers of the bulk snapshot that need no server: literals and chunk predicates (SQL text
Spark sends as it is), and the binlog order that tells a change committed before a consistent snapshot."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cdc_pipeline.copy_text import FIELD_DATE, FIELD_PLAIN, FIELD_TEXT
from cdc_pipeline.config import ConnectorConfig, parse_config
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sources.mariadb import (
    SourceColumn,
    before_snapshot,
    chunk_predicate,
    copy_field_sql,
    copy_text_sql,
    debezium_properties,
    key_value,
    literal,
    stream_passed,
    quote_mysql,
    require_snapshot_position,
)


def test_literals_of_every_key_kind():
    assert literal(42) == "42"
    assert literal("it's a \\ path") == "'it''s a \\\\ path'"
    assert literal(key_value(b"\x00\xff")) == "X'00ff'"
    assert literal(key_value(__import__("decimal").Decimal("1.50"))) == "'1.50'"
    assert quote_mysql("we`ird") == "`we``ird`"


def test_chunk_predicates_cover_a_composite_key_half_open():
    assert chunk_predicate(["a"], None, None) == "1 = 1"
    assert chunk_predicate(["a"], [5], [10]) == "((`a` >= 5)) AND NOT ((`a` >= 10))"
    assert chunk_predicate(["a", "b"], [1, "x"], None) == "((`a` > 1) OR (`a` = 1 AND `b` >= 'x'))"


@pytest.mark.parametrize("offset, expected", [
    ({"file": "mariadb-bin.000002", "pos": 99}, True),  # an earlier file
    ({"file": "mariadb-bin.000003", "pos": 4511}, True),  # its transaction starts before the snapshot
    ({"file": "mariadb-bin.000003", "pos": 4512}, False),  # the first transaction after it
    ({"file": "mariadb-bin.000004", "pos": 4}, False),
    ({"file": "mariadb-bin.000003", "pos": 10, "snapshot": "true"}, False),  # snapshot records have no order
    (None, False),
])
def test_changes_committed_before_a_consistent_snapshot(offset, expected):
    assert before_snapshot(offset, {"file": "mariadb-bin.000003", "pos": "4512"}) is expected


@pytest.mark.parametrize("offset, expected", [
    ({"file": "mariadb-bin.000003", "pos": 4511}, False),
    ({"file": "mariadb-bin.000003", "pos": 4512}, True),  # the first transaction after the snapshot
    ({"file": "mariadb-bin.000004", "pos": 4}, True),
    ({"file": "mariadb-bin.000004", "pos": 4, "snapshot": "true"}, False),
    (None, False),
])
def test_a_snapshot_position_is_passed_at_the_first_transaction_after_it(offset, expected):
    assert stream_passed(offset, {"file": "mariadb-bin.000003", "pos": "4512"}) is expected


class RecordedCursor:
    """A cursor that records the statements it is given and answers each with the rows a server was seen to give
    (no MySQL server can run here: these answers are MySQL 8.0's and MariaDB 11's, recorded)."""

    def __init__(self, answers: dict[str, list[tuple]]) -> None:
        self.answers = answers
        self.statements: list[str] = []

    def execute(self, statement: str) -> None:
        self.statements.append(statement)
        self._rows = self.answers[statement]

    def fetchall(self) -> list[tuple]:
        return self._rows


SNAPSHOT_STATUS = "SHOW SESSION STATUS LIKE 'binlog\\_snapshot\\_file'"


def test_a_keyless_table_loads_from_mariadb_whose_snapshot_has_a_binlog_position():
    mariadb = RecordedCursor({SNAPSHOT_STATUS: [("Binlog_snapshot_file", "mariadb-bin.000003")]})
    require_snapshot_position(mariadb, _connector("mariadb"), "shop.notes")
    assert mariadb.statements == [SNAPSHOT_STATUS]


def test_a_keyless_table_from_mysql_is_refused_with_what_to_do():
    mysql = RecordedCursor({SNAPSHOT_STATUS: []})  # MySQL 8.0 has no binlog_snapshot_* status
    with pytest.raises(CdcError) as refused:
        require_snapshot_position(mysql, _connector("mysql"), "shop.notes")
    message = str(refused.value)
    assert "shop.notes" in message and "primary key" in message and "snapshot_engine: debezium" in message
    assert "'m'" in message, "the error names the connector"
    assert mysql.statements == [SNAPSHOT_STATUS], "nothing of MariaDB's (information_schema.session_status) is asked"


def _connector(kind: str) -> ConnectorConfig:
    config = parse_config({"destination": {"dsn": "postgresql://cdc@localhost/warehouse"},
                           "connectors": {"m": {"type": kind, "hostname": "localhost", "user": "cdc",
                                                "password": "secret", "database": "shop"}}}, Path("x.yaml"))
    return config.connector("m")


def test_the_database_include_list_matches_the_name_as_spelled():
    # Debezium reads it as a regular expression: `$` would end the name, `.` match any character.
    connector = dataclasses.replace(_connector("mariadb"), database="shop$1.a")
    assert debezium_properties(connector)["database.include.list"] == "shop\\$1\\.a"


@pytest.mark.parametrize("data_type, column_type, pg_type, rendered", [
    ("varchar", "varchar(10)", "varchar(10)", True), ("longblob", "longblob", "bytea", True),
    ("bit", "bit(10)", "bit(10)", True), ("datetime", "datetime(3)", "timestamp(3)", True),
    ("decimal", "decimal(12,2)", "numeric(12,2)", True), ("point", "point", "point", True),
    ("set", "set('a','b')", "text", True),
    # Spark renders these: a TIMESTAMP (its zero dates are counted), a SET as an array, other geometries.
    ("timestamp", "timestamp", "timestamptz", False), ("set", "set('a','b')", "text[]", False),
    ("geometry", "geometry", "geometry", False),
])
def test_the_source_renders_a_copy_text_field_where_spark_adds_nothing(data_type, column_type, pg_type, rendered):
    column = SourceColumn("c", data_type, column_type, True)
    field = copy_text_sql(column, pg_type)
    assert (field is not None) == rendered
    if rendered:
        assert field.startswith("COALESCE(") and field.endswith("_utf8mb4 X'5c4e')")  # NULL as \N


@pytest.mark.parametrize("data_type, column_type, pg_type, select, kind", [
    ("varchar", "varchar(10)", "varchar(10)", "`c`", FIELD_TEXT),
    ("enum", "enum('a','b')", "text", "CAST(`c` AS CHAR)", FIELD_TEXT),  # Spark would pad a CHAR(n)
    ("datetime", "datetime(3)", "timestamp(3)", "CAST(`c` AS CHAR)", FIELD_DATE),
    ("int", "int", "integer", "CAST(`c` AS CHAR)", FIELD_PLAIN),
    ("longblob", "longblob", "bytea", "CONCAT(_utf8mb4 X'5c5c78', LOWER(HEX(`c`)))", FIELD_PLAIN),
    ("bit", "bit(10)", "bit(10)", "LPAD(BIN(`c`), 10, '0')", FIELD_PLAIN),
])
def test_the_source_selects_a_plain_value_the_writer_makes_a_copy_field(data_type, column_type, pg_type, select,
                                                                        kind):
    # No per-row escaping in the source: the bulk load's tasks escape text and write a zero date as NULL.
    assert copy_field_sql(SourceColumn("c", data_type, column_type, True), pg_type) == (select, kind)


def test_what_spark_renders_the_source_selects_no_copy_field_for():
    assert copy_field_sql(SourceColumn("c", "timestamp", "timestamp", True), "timestamptz") is None
    assert copy_field_sql(SourceColumn("c", "set", "set('a')", True), "text[]") is None
