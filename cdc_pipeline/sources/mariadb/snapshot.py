"""A MariaDB/MySQL source's reads for the bulk snapshot: its tables, their columns, keys and secondary indexes, chunk
boundaries, the SQL that renders each column as text, and the binlog position of a consistent snapshot.

A bulk read renders every column in the source as text in a form the destination's COPY reads back exactly (numbers
and dates as MariaDB writes them, binaries and geometry as hex, TIMESTAMP as UTC microseconds), so no value passes
through a JDBC type that could round it; Spark then makes the COPY lines (`column_text`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Sequence

from pyspark.sql import Column
from pyspark.sql import functions as F

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.copy_text import (ESCAPES, FIELD_BYTEA, FIELD_DATE, FIELD_PLAIN, FIELD_TEXT, NULL_TEXT, copy_escape,
                                    ewkb_hex)
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sources.mariadb.connector import SYSTEM_SCHEMAS, qualified
from cdc_pipeline.sources.mariadb.types import GEOMETRY_TYPES
from cdc_pipeline.sources.quoting import quote_mysql
from cdc_pipeline.sources.source_index import IndexColumn, SourceIndex
from cdc_pipeline.sources.table import SourceTable

# A chunk read under its own consistent snapshot (a table without a key is one chunk): its first row carries the
# binlog position of that snapshot, which MariaDB gives exactly (`binlog_snapshot_file` / `_position`).
SESSION_INIT = None  # the readers' sessions need no setting
CONSISTENT_SNAPSHOT = "START TRANSACTION WITH CONSISTENT SNAPSHOT"


_STRING_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "json"})
_PADDED_TYPES = frozenset({"char", "enum", "set"})
_BINARY_TYPES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})


_BIT_LENGTH = re.compile(r"bit\((\d+)\)")


@dataclass(frozen=True)
class SourceColumn:
    """A source column as information_schema describes it."""

    name: str
    data_type: str
    column_type: str
    nullable: bool

    @property
    def bit_length(self) -> int:
        match = _BIT_LENGTH.match(self.column_type)
        return int(match.group(1)) if match else 1


def tables_of(cur: Any, connector: ConnectorConfig) -> list[SourceTable]:
    """The base tables of the connector's databases (the include list filters them); of `databases`, read in one
    query for all the server's databases."""
    if connector.database is not None:
        return list_tables(cur, connector.database)
    cur.execute("SELECT table_schema, table_name, COALESCE(table_rows, 0), COALESCE(avg_row_length, 0) "
                "FROM information_schema.tables WHERE table_type = 'BASE TABLE' ORDER BY table_schema, table_name")
    return [SourceTable(f"{database}.{name}", int(rows), int(size)) for database, name, rows, size in cur.fetchall()
            if str(database).lower() not in SYSTEM_SCHEMAS and connector.captures_database(str(database))]


def list_tables(cur: Any, database: str, table: str | None = None) -> list[SourceTable]:
    """The database's base tables (or the one named `table`), with InnoDB's estimate of their rows and average row
    size."""
    cur.execute("SELECT table_name, COALESCE(table_rows, 0), COALESCE(avg_row_length, 0) FROM information_schema.tables "
                "WHERE table_schema = %s AND table_type = 'BASE TABLE' AND (%s IS NULL OR table_name = %s) "
                "ORDER BY table_name", (database, table, table))
    return [SourceTable(f"{database}.{name}", int(rows), int(size)) for name, rows, size in cur.fetchall()]


def list_columns(cur: Any, database: str, table: str) -> list[SourceColumn]:
    cur.execute("SELECT column_name, LOWER(data_type), LOWER(column_type), is_nullable = 'YES' "
                "FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                "ORDER BY ordinal_position", (database, table))
    return [SourceColumn(name, data_type, column_type, bool(nullable))
            for name, data_type, column_type, nullable in cur.fetchall()]


def chunk_key(cur: Any, database: str, table: str) -> list[str]:
    """The columns chunks are split by: the primary key, else the first unique key of NOT NULL columns; [] when the
    table has neither (it is read as one chunk)."""
    return table_definitions(cur, database, [table]).get(table, ([], []))[1]


def table_definitions(cur: Any, database: str,
                      tables: Sequence[str]) -> dict[str, tuple[list[SourceColumn], list[str]]]:
    """Each named table's columns (as `list_columns` reads them) and chunk key (as `chunk_key` chooses it), read in
    two queries for all of them; a table the source does not have is left out."""
    if not tables:
        return {}
    names = tuple(tables)
    cur.execute("SELECT table_name, column_name, LOWER(data_type), LOWER(column_type), is_nullable = 'YES' "
                "FROM information_schema.columns WHERE table_schema = %s AND table_name IN %s "
                "ORDER BY table_name, ordinal_position", (database, names))
    columns: dict[str, list[SourceColumn]] = {}
    for table, name, data_type, column_type, nullable in cur.fetchall():
        columns.setdefault(table, []).append(SourceColumn(name, data_type, column_type, bool(nullable)))
    cur.execute("SELECT table_name, index_name, column_name FROM information_schema.statistics "
                "WHERE table_schema = %s AND table_name IN %s AND non_unique = 0 "
                "ORDER BY table_name, index_name <> 'PRIMARY', index_name, seq_in_index", (database, names))
    keys: dict[str, dict[str, list[str]]] = {}
    for table, index, column in cur.fetchall():
        keys.setdefault(table, {}).setdefault(index, []).append(column)
    definitions = {}
    for table, table_columns in columns.items():
        not_null = {column.name for column in table_columns if not column.nullable}
        key = next((key for key in keys.get(table, {}).values() if not_null.issuperset(key)), [])
        definitions[table] = (table_columns, key)
    return definitions


_INDEX_METHODS = {"BTREE": "btree", "HASH": "btree"}
"""information_schema.STATISTICS.INDEX_TYPE of a secondary index PostgreSQL rebuilds, and the access method it
gets there (a HASH index of a MEMORY table serves equality, which a B-tree serves too, and ordering)."""


def secondary_indexes(cur: Any, database: str, tables: Sequence[str]) -> list[SourceIndex]:
    """The non-unique indexes of the named tables, in one query. A prefix (`SUB_PART`) indexes the whole column
    on PostgreSQL; FULLTEXT and SPATIAL indexes, and expression parts (MySQL's functional key parts), are
    `skipped`."""
    if not tables:
        return []
    cur.execute("SELECT table_name, index_name, column_name, collation = 'D', UPPER(index_type) "
                "FROM information_schema.statistics WHERE table_schema = %s AND table_name IN %s AND non_unique = 1 "
                "ORDER BY table_name, index_name, seq_in_index", (database, tuple(tables)))
    parts: dict[tuple[str, str], list[tuple[str | None, bool, str]]] = {}
    for table, index, column, descending, index_type in cur.fetchall():
        parts.setdefault((table, index), []).append((column, bool(descending), index_type))
    indexes = []
    for (table, index), columns in parts.items():
        index_type = columns[0][2]
        method = _INDEX_METHODS.get(index_type, "")
        skipped = None
        if not method:
            skipped = f"a {index_type} index"
        elif any(column is None for column, _, _ in columns):
            skipped = "an expression in its key"
        indexes.append(SourceIndex(table, index, method, tuple(
            IndexColumn(column or "", descending) for column, descending, _ in columns), skipped))
    return indexes


def key_value(value: Any) -> Any:
    """A key value as JSON keeps it (for the chunk's stored bounds): bytes as {"hex": ...}, the rest as text or a
    number."""
    if isinstance(value, (bytes, bytearray)):
        return {"hex": bytes(value).hex()}
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, (Decimal, float, datetime, date, time, timedelta)):
        return str(value)
    return value


def literal(value: Any) -> str:
    """A stored key value as a MariaDB literal (the chunk predicates are SQL text Spark sends as it is)."""
    if isinstance(value, dict):
        return "X'" + str(value["hex"]) + "'"
    if isinstance(value, int):
        return str(value)
    text = str(value).replace("\\", "\\\\").replace("'", "''").replace("\0", "\\0")
    return "'" + text + "'"


def _from(columns: Sequence[str], bound: Sequence[Any], strict: bool) -> str:
    """Rows whose key is after `bound` (or at it, unless strict), lexicographically over the key's columns."""
    terms = []
    for i, column in enumerate(columns):
        equal = [f"{quote_mysql(c)} = {literal(v)}" for c, v in zip(columns[:i], bound[:i])]
        last = i == len(columns) - 1
        operator = (">" if strict else ">=") if last else ">"
        terms.append("(" + " AND ".join([*equal, f"{quote_mysql(column)} {operator} {literal(bound[i])}"]) + ")")
    return "(" + " OR ".join(terms) + ")"


def chunk_predicate(columns: Sequence[str], lower: Sequence[Any] | None, upper: Sequence[Any] | None) -> str:
    """The WHERE text of the chunk [lower, upper) over the key columns (None: unbounded)."""
    parts = []
    if lower is not None:
        parts.append(_from(columns, lower, strict=False))
    if upper is not None:
        parts.append("NOT " + _from(columns, upper, strict=False))
    return " AND ".join(parts) or "1 = 1"


def next_chunk_start(cur: Any, database: str, table: str, key: Sequence[str], lower: Sequence[Any] | None,
                     rows: int) -> list[Any] | None:
    """The key `rows` rows after `lower` in key order (an index range scan): where the next chunk starts; None when
    fewer rows remain (the chunk from `lower` is the last)."""
    where = "" if lower is None else " WHERE " + _from(key, lower, strict=False)
    order = ", ".join(map(quote_mysql, key))
    # PyMySQL has no identifier composition like psycopg.sql: names are backquoted by quote_mysql, values are
    # literals of the source's own key values (`literal`).
    query = f"SELECT {order} FROM {qualified(database, table)}{where} ORDER BY {order} LIMIT 1 OFFSET {int(rows)}"
    cur.execute(query)
    row = cur.fetchone()
    return None if row is None else [key_value(value) for value in row]


def select_text(column: SourceColumn, pg_type: str) -> str:
    """The SQL that renders the column as text for `column_text` (NULL stays NULL)."""
    name = quote_mysql(column.name)
    if column.data_type in _PADDED_TYPES:
        # Spark pads what JDBC calls CHAR(n) (ENUM and SET too) to n characters; as VARCHAR it reads the value.
        return f"CAST({name} AS CHAR)"
    if column.data_type in _STRING_TYPES:
        return name
    if column.data_type in _BINARY_TYPES:
        return f"HEX({name})"
    if column.data_type == "bit":
        return f"BIN({name})"
    if column.data_type == "timestamp":
        # UNIX_TIMESTAMP reads TIMESTAMP's stored UTC value whatever the session's time zone; 0 is a zero date.
        return f"CAST(UNIX_TIMESTAMP({name}) * 1000000 AS CHAR)"
    if column.data_type in GEOMETRY_TYPES:
        if pg_type == "point":
            return f"CONCAT('(', ST_X({name}), ',', ST_Y({name}), ')')"
        return f"CONCAT(ST_SRID({name}), ';', HEX(ST_AsWKB({name})))"
    return f"CAST({name} AS CHAR)"


def utf8_literal(*codes: int) -> str:
    """A string of these characters (below 128) in SQL that does not depend on the server's escape settings (sql_mode
    NO_BACKSLASH_ESCAPES) and has the collation the converted values have: a hex literal with the utf8mb4
    introducer, a constant (`CHAR(... USING utf8mb4)` was evaluated again for every row: a quarter of the server's
    CPU in a bulk load of rows of two text columns)."""
    assert all(0 <= code < 128 for code in codes)
    return "_utf8mb4 X'" + "".join(f"{code:02x}" for code in codes) + "'"


def copy_field_sql(column: SourceColumn, pg_type: str) -> tuple[str, int] | None:
    """The SQL that selects the column for the bulk snapshot's writer and how the writer makes it a COPY text field
    (`copy_text.FIELD_*`: escaped, a zero date as NULL, or as it is), or None where only Spark renders it (a SET as
    an array, a TIMESTAMP, a geometry other than a point). The server sends text values in the connection's
    character set, utf8mb4, whatever the column's."""
    value = select_text(column, pg_type)
    kind = column.data_type
    if kind == "set" and pg_type.endswith("[]") or kind == "timestamp" or (kind in GEOMETRY_TYPES
                                                                           and pg_type != "point"):
        return None
    if kind in _STRING_TYPES:
        return value, FIELD_TEXT
    if kind in _BINARY_TYPES:
        # The bytes, not HEX(): a hex string twice the value's size would be NULL past max_allowed_packet.
        return quote_mysql(column.name), FIELD_BYTEA
    if kind == "bit" and column.bit_length > 1:
        return f"LPAD({value}, {column.bit_length}, '0')", FIELD_PLAIN
    if kind in ("date", "datetime"):
        return value, FIELD_DATE
    return value, FIELD_PLAIN


def copy_text_sql(column: SourceColumn, pg_type: str) -> str | None:
    """The SQL that renders the column's whole COPY text field (escaped, `\\N` for NULL) in the source, as the
    bulk snapshot's writer does from `copy_field_sql`'s value and as `column_text` does from `select_text`'s, or None
    where only Spark renders it. Verify compares the destination's rows with these."""
    field = copy_field_sql(column, pg_type)
    if field is None:
        return None
    text, how = field
    if how == FIELD_TEXT:
        text = f"REPLACE(CONVERT({text} USING utf8mb4), {utf8_literal(0)}, '')"
        for char, escape in ESCAPES:  # as `copy_escape` replaces them
            text = f"REPLACE({text}, {utf8_literal(ord(char))}, {utf8_literal(*map(ord, escape))})"
    elif how == FIELD_DATE:
        text = f"IF({text} LIKE '0000-00-00%', NULL, {text})"
    elif how == FIELD_BYTEA:
        text = f"CONCAT({utf8_literal(92, 92, 120)}, LOWER(HEX({text})))"
    return f"COALESCE({text}, {utf8_literal(92, 78)})"


def copy_line_sql(fields: Sequence[str]) -> str:
    """One COPY text line from fields `copy_text_sql` rendered (tab-separated)."""
    return f"CONCAT({f', {utf8_literal(9)}, '.join(fields)})"


def column_text(value: Column, column: SourceColumn, pg_type: str) -> Column:
    """The COPY text of a value `select_text` rendered, for a destination column of type `pg_type` (`\\N` for
    NULL): Spark's part of the conversion, the same rules as the stream's (dml.py) for what Debezium sends."""
    kind = column.data_type
    if kind == "set" and pg_type.endswith("[]"):
        # A SET's members (no member holds a comma) as an array literal, for an array column (of an enum, say).
        members = F.transform(F.split(value, ","), lambda member: F.concat(
            F.lit('"'), F.regexp_replace(member, r'(["\\])', r"\\$1"), F.lit('"')))
        text = copy_escape(F.when(value == "", F.lit("{}")).otherwise(
            F.concat(F.lit("{"), F.array_join(members, ","), F.lit("}"))))
    elif kind in _STRING_TYPES:
        text = copy_escape(value)
    elif kind in _BINARY_TYPES:
        text = F.concat(F.lit("\\\\x"), F.lower(value))
    elif kind == "bit":
        text = F.lpad(value, column.bit_length, "0") if column.bit_length > 1 else value
    elif kind in ("date", "datetime"):
        text = F.when(~value.startswith("0000-00-00"), value)
    elif kind == "timestamp":
        micros = value.cast("decimal(30,6)").cast("long")
        instant = F.concat(F.date_format(F.timestamp_micros(micros), "yyyy-MM-dd HH:mm:ss.SSSSSS"), F.lit("+00"))
        text = F.when(micros != 0, instant)  # 0: a zero date, written as NULL (see `zero_dates`)
    elif kind in GEOMETRY_TYPES and pg_type != "point":
        srid, wkb = F.split_part(value, F.lit(";"), F.lit(1)), F.split_part(value, F.lit(";"), F.lit(2))
        if pg_type == "bytea":
            text = F.concat(F.lit("\\\\x"), ewkb_hex(F.lower(wkb), srid.cast("long")))
        else:
            text = F.concat(F.when(srid != "0", F.concat(F.lit("SRID="), srid, F.lit(";"))).otherwise(F.lit("")), wkb)
        text = F.when(value.isNotNull(), text)
    else:
        text = value
    return F.coalesce(text, F.lit(NULL_TEXT))


def zero_dates(values: dict[str, Column], columns: Sequence[SourceColumn]) -> Column:
    """How many zero dates of a row are written as NULL and counted as such: those of NOT NULL TIMESTAMP columns,
    as on the stream's path (Debezium reads a nullable one as NULL already, a NOT NULL one as the epoch)."""
    zeros = [F.when(values[column.name].cast("decimal(30,6)") == 0, 1).otherwise(0) for column in columns
             if column.data_type == "timestamp" and not column.nullable]
    total = F.lit(0)
    for zero in zeros:
        total = total + zero
    return total.cast("int")


def snapshot_position_select(position_alias: str, aliases: Sequence[str]) -> str:
    """The first row of a chunk read under a consistent snapshot: the snapshot's binlog position as JSON, then one
    NULL per data column (named as the data columns are)."""
    nulls = "".join(f", NULL AS {alias}" for alias in aliases)
    return ("SELECT JSON_OBJECT('file', MAX(IF(variable_name = 'BINLOG_SNAPSHOT_FILE', variable_value, NULL)), "
            "'pos', MAX(IF(variable_name = 'BINLOG_SNAPSHOT_POSITION', variable_value, NULL))) AS " + position_alias
            + nulls + " FROM information_schema.session_status WHERE variable_name LIKE 'BINLOG\\_SNAPSHOT\\_%'")


def require_snapshot_position(cur: Any, connector: ConnectorConfig, source_table: str) -> None:
    """Refuses to load a keyless table from a server that cannot tell the binlog position of a consistent
    snapshot: MariaDB gives it as the session's `binlog_snapshot_file` / `binlog_snapshot_position`
    (`snapshot_position_select`); MySQL has no such status (nor `information_schema.session_status`), and its own
    ways (a global read lock held while the snapshot starts and `performance_schema.log_status` is read) are not
    built. The stream's position check needs it to replay neither too much nor too little into a keyless table."""
    cur.execute("SHOW SESSION STATUS LIKE 'binlog\\_snapshot\\_file'")
    if cur.fetchall():
        return
    raise CdcError(
        f"the bulk snapshot reads a table without a primary or unique NOT NULL key ({source_table}) under one "
        "consistent snapshot and needs that snapshot's binlog position, which this server does not give "
        "(MariaDB's binlog_snapshot_file; MySQL has none): give the table a primary key, or copy the rows with "
        "Debezium's snapshot (snapshot_engine: debezium)", connector=connector.name, table=source_table)
