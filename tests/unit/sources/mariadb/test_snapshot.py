"""The MariaDB source's reads for the bulk snapshot that need no server: literals and chunk predicates (SQL text Spark
sends as it is), a keyless table's snapshot position, and the SQL that renders a column as its COPY text; and, on the
suite's server, its catalog read of a table's secondary indexes (their columns, direction, and why one PostgreSQL
cannot rebuild from plain columns is skipped)."""

from __future__ import annotations

import uuid

import pytest

from cdc_pipeline.copy_text import FIELD_BYTEA, FIELD_DATE, FIELD_PLAIN, FIELD_TEXT
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sources import mariadb as mariadb_source
from cdc_pipeline.sources.mariadb import (SourceColumn, chunk_predicate, copy_field_sql, copy_text_sql, key_value,
                                          literal, quote_mysql, require_snapshot_position)
from cdc_pipeline.sources.source_index import IndexColumn, SourceIndex
from tests.unit.sources.mariadb.connectors import connector_of


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
    require_snapshot_position(mariadb, connector_of("mariadb"), "shop.notes")
    assert mariadb.statements == [SNAPSHOT_STATUS]


def test_a_keyless_table_from_mysql_is_refused_with_what_to_do():
    mysql = RecordedCursor({SNAPSHOT_STATUS: []})  # MySQL 8.0 has no binlog_snapshot_* status
    with pytest.raises(CdcError) as refused:
        require_snapshot_position(mysql, connector_of("mysql"), "shop.notes")
    message = str(refused.value)
    assert "shop.notes" in message and "primary key" in message and "snapshot_engine: debezium" in message
    assert "'m'" in message, "the error names the connector"
    assert mysql.statements == [SNAPSHOT_STATUS], "nothing of MariaDB's (information_schema.session_status) is asked"


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
    ("longblob", "longblob", "bytea", "`c`", FIELD_BYTEA),  # its bytes: the writer makes the hex text
    ("bit", "bit(10)", "bit(10)", "LPAD(BIN(`c`), 10, '0')", FIELD_PLAIN),
])
def test_the_source_selects_a_plain_value_the_writer_makes_a_copy_field(data_type, column_type, pg_type, select,
                                                                        kind):
    # No per-row escaping in the source: the bulk load's tasks escape text and write a zero date as NULL.
    assert copy_field_sql(SourceColumn("c", data_type, column_type, True), pg_type) == (select, kind)


def test_what_spark_renders_the_source_selects_no_copy_field_for():
    assert copy_field_sql(SourceColumn("c", "timestamp", "timestamp", True), "timestamptz") is None
    assert copy_field_sql(SourceColumn("c", "set", "set('a')", True), "text[]") is None


def _by_name(indexes: list[SourceIndex]) -> dict[str, SourceIndex]:
    return {index.name: index for index in indexes}


def test_mariadb_reads_non_unique_indexes_and_skips_fulltext_and_spatial(mariadb):
    database = f"idx_{uuid.uuid4().hex[:8]}"
    mariadb.execute([f"CREATE DATABASE {database}"])
    mariadb.execute([
        "CREATE TABLE t (id INT PRIMARY KEY, a INT, b VARCHAR(40), body TEXT, g POINT NOT NULL, u INT UNIQUE, "
        "KEY ab (a, b(10) DESC), FULLTEXT KEY words (body), SPATIAL KEY place (g))",
        "CREATE TABLE m (id INT PRIMARY KEY, a INT, KEY a_hash (a) USING HASH) ENGINE=MEMORY"], database=database)
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        indexes = _by_name(mariadb_source.secondary_indexes(cur, database, ["t", "m"]))
    assert set(indexes) == {"ab", "words", "place", "a_hash"}
    assert indexes["ab"] == SourceIndex("t", "ab", "btree", (IndexColumn("a"), IndexColumn("b", descending=True)))
    assert indexes["a_hash"] == SourceIndex("m", "a_hash", "btree", (IndexColumn("a"),))
    assert indexes["words"].skipped == "a FULLTEXT index"
    assert indexes["place"].skipped == "a SPATIAL index"
