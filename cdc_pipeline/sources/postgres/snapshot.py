"""A PostgreSQL source's reads for the bulk snapshot: its tables, their columns, primary keys and secondary indexes,
chunk boundaries (by key, or by heap blocks for a table without one), the COPY a chunk is piped out by, the SQL
that renders each column as text, and the transaction snapshot a chunk was read under.

A bulk read renders every column with PostgreSQL's own text output (`::text`), which the destination's COPY reads
back exactly into the same type: the session pins the settings that output depends on (`bytea_output`,
`IntervalStyle`, `extra_float_digits`; pgjdbc sets `DateStyle` to ISO, and time zones are written with their offset).
Spark then escapes the text for COPY (`column_text`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from pyspark.sql import Column
from pyspark.sql import functions as F

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.copy_text import ESCAPES, NULL_TEXT, copy_escape
from cdc_pipeline.sources.postgres.connector import LIFT_IDLE_LIMITS, SYSTEM_SCHEMAS, connect, qualified, quote
from cdc_pipeline.sources.source_index import IndexColumn, SourceIndex
from cdc_pipeline.sources.table import SourceTable

# Every Spark reader's session: the text output the COPY reads back, no parallel plan (a table without a key is
# read as its snapshot row then its rows, in that order), and no idle limit (`LIFT_IDLE_LIMITS`).
SESSION_INIT = ("SET bytea_output = 'hex'; SET IntervalStyle = 'postgres'; SET extra_float_digits = 3; "
                f"SET max_parallel_workers_per_gather = 0; {LIFT_IDLE_LIMITS}")
# The snapshot row of a one-chunk read needs no transaction of its own: one statement reads under one snapshot.
CONSISTENT_SNAPSHOT = SESSION_INIT
# A load's chunk piped COPY to COPY reads its snapshot's position and its rows in two statements: one transaction's
# snapshot holds for both (its session is its own and ends with the chunk).
COPY_SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"


# Source types whose text output the destination type reads differently (the type map's choice).
_CAST_FIRST = {"money": "numeric"}


@dataclass(frozen=True)
class SourceColumn:
    """A source column as the catalog describes it: `data_type` is the type's name as Debezium reports it
    (`int4`, `varchar`, `_int4` for an array), `column_type` its full SQL name (`character varying(20)`)."""

    name: str
    data_type: str
    column_type: str
    nullable: bool
    length: int | None = None
    scale: int | None = None


def tables_of(cur: Any, connector: ConnectorConfig) -> list[SourceTable]:
    """The tables of every schema of the connector's database (the include list filters them)."""
    return list_tables(cur, None)


def list_tables(cur: Any, schema: str | None, table: str | None = None) -> list[SourceTable]:
    """Ordinary tables (partitions included, as Debezium captures them) of `schema` (None: every user schema), or
    the one named `table`, with the planner's estimate of their rows and average row size (the table's size with its
    TOAST table, as stored: values TOAST compressed count their compressed size)."""
    cur.execute(
        "SELECT n.nspname, c.relname, greatest(c.reltuples, 0)::bigint, "
        "CASE WHEN c.reltuples > 0 THEN (pg_table_size(c.oid) / c.reltuples)::bigint ELSE 0 END "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind = 'r' AND n.nspname <> ALL(%s) AND n.nspname NOT LIKE 'pg\\_temp\\_%%' "
        "AND (%s::text IS NULL OR n.nspname = %s) AND (%s::text IS NULL OR c.relname = %s) "
        "ORDER BY n.nspname, c.relname", (list(SYSTEM_SCHEMAS), schema, schema, table, table))
    return [SourceTable(f"{nsp}.{name}", int(rows), int(size)) for nsp, name, rows, size in cur.fetchall()]


def list_columns(cur: Any, schema: str, table: str) -> list[SourceColumn]:
    """The table's columns in order, with what the type map reads of them (the lengths and scales
    information_schema gives, as Debezium reads them through JDBC)."""
    cur.execute(
        "SELECT a.attname, t.typname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull, "
        "coalesce(c.character_maximum_length, c.numeric_precision, "
        "         CASE WHEN t.typname IN ('bit', 'varbit') AND a.atttypmod > 0 THEN a.atttypmod END), "
        "coalesce(c.numeric_scale, c.datetime_precision), e.typname, a.atttypmod "
        "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid LEFT JOIN pg_type e ON e.oid = t.typelem "
        "AND t.typcategory = 'A' "
        "JOIN information_schema.columns c ON c.table_schema = %s AND c.table_name = %s "
        "AND c.column_name = a.attname "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (schema, table, qualified(schema, table)))
    columns = []
    for name, data_type, column_type, nullable, length, scale, element, typmod in cur.fetchall():
        if element is not None:
            # information_schema says nothing of an array's element modifiers: they are in the type modifier.
            length, scale = _modifiers(element, int(typmod))
        columns.append(SourceColumn(name, data_type, column_type, bool(nullable), length, scale))
    return columns


def _modifiers(type_name: str, typmod: int) -> tuple[int | None, int | None]:
    """The length and scale a type modifier encodes for the type named `type_name` (-1: none)."""
    if typmod < 0:
        return None, None
    if type_name in ("varchar", "bpchar"):
        return typmod - 4, None
    if type_name == "numeric":
        return ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
    if type_name in ("bit", "varbit"):
        return typmod, None
    if type_name in ("time", "timetz", "timestamp", "timestamptz"):
        return None, typmod
    return None, None


def chunk_key(cur: Any, schema: str, table: str) -> list[str]:
    """The primary key's columns, which chunks are split by; [] for a table without one (read as one chunk). Only
    the primary key: it is the key of the table's change events, so a chunk's rows and the stream's replayed
    changes meet as upserts."""
    cur.execute(
        "SELECT a.attname FROM pg_index i "
        "CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "WHERE i.indrelid = %s::regclass AND i.indisprimary ORDER BY k.ord", (qualified(schema, table),))
    return [row[0] for row in cur.fetchall()]


def table_definitions(cur: Any, schema: str,
                      tables: Sequence[str]) -> dict[str, tuple[list[SourceColumn], list[str]]]:
    """Each named table's columns (`list_columns`) and chunk key (`chunk_key`); a table the source does not have is
    left out."""
    cur.execute("SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = ANY(%s)", (schema, list(tables)))
    present = {row[0] for row in cur.fetchall()}
    return {table: (list_columns(cur, schema, table), chunk_key(cur, schema, table))
            for table in tables if table in present}


INDEX_METHODS = ("btree", "hash", "gin", "gist", "brin")
"""The access methods of the secondary indexes the destination gets: PostgreSQL's own, which every server has."""

# pg_index.indoption bits of a key column (src/include/catalog/pg_index.h).
_INDOPTION_DESC, _INDOPTION_NULLS_FIRST = 1, 2


def secondary_indexes(cur: Any, schema: str, tables: Sequence[str]) -> list[SourceIndex]:
    """The valid non-unique indexes of the named tables (no primary key, unique or exclusion constraint's), in one
    query. Partial indexes, indexes on expressions or with INCLUDE columns, other access methods than
    INDEX_METHODS, an operator class other than its type's default and a collation other than its column's are
    `skipped`."""
    if not tables:
        return []
    cur.execute(
        "SELECT c.relname, i.relname, am.amname, x.indpred IS NOT NULL, x.indexprs IS NOT NULL, "
        "       x.indnatts > x.indnkeyatts, k.names, k.options, k.default_classes, k.own_collations "
        "FROM pg_index x JOIN pg_class c ON c.oid = x.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_am am ON am.oid = i.relam "
        "CROSS JOIN LATERAL ("
        "  SELECT array_agg(a.attname ORDER BY u.ord) AS names, array_agg(u.option ORDER BY u.ord) AS options, "
        "         coalesce(bool_and(opc.opcdefault), true) AS default_classes, "
        "         coalesce(bool_and(u.coll = 0 OR u.coll = a.attcollation), true) AS own_collations "
        "  FROM unnest(x.indkey::int2[], x.indclass::oid[], x.indoption::int2[], x.indcollation::oid[]) "
        "       WITH ORDINALITY AS u(attnum, opclass, option, coll, ord) "
        "  LEFT JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = u.attnum AND u.attnum > 0 "
        "  LEFT JOIN pg_opclass opc ON opc.oid = u.opclass "
        "  WHERE u.ord <= x.indnkeyatts) k "
        "WHERE n.nspname = %s AND c.relname = ANY(%s) AND x.indisvalid AND NOT x.indisunique "
        "AND NOT x.indisprimary AND NOT x.indisexclusion ORDER BY c.relname, i.relname", (schema, list(tables)))
    indexes = []
    for (table, name, method, partial, expressions, included, names, options, default_classes,
         own_collations) in cur.fetchall():
        columns = tuple(_index_column(column or "", option) for column, option in zip(names, options))
        reasons = [reason for reason, holds in (
            ("a partial index (WHERE)", partial), ("an expression in its key", expressions),
            ("INCLUDE columns", included), (f"the access method {method}", method not in INDEX_METHODS),
            ("an operator class other than its type's default", not default_classes),
            ("a collation other than its column's", not own_collations)) if holds]
        indexes.append(SourceIndex(table, name, method, columns, "; ".join(reasons) or None))
    return indexes


def _index_column(name: str, option: int) -> IndexColumn:
    descending = bool(option & _INDOPTION_DESC)
    nulls_first = bool(option & _INDOPTION_NULLS_FIRST)
    return IndexColumn(name, descending, None if nulls_first == descending else nulls_first)


def literal(value: Any) -> str:
    """A stored key value (its text) as a PostgreSQL string constant of unknown type: compared with a key column,
    it is read as that column's type. An escape string constant (`E'...'`), read the same whatever the source's
    `standard_conforming_strings` (with it off, a backslash in a plain constant escapes)."""
    return "E'" + str(value).replace("\\", "\\\\").replace("'", "''") + "'"


def _row(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else "ROW(" + ", ".join(items) + ")"


def chunk_predicate(columns: Sequence[str], lower: Sequence[Any] | None, upper: Sequence[Any] | None) -> str:
    """The WHERE text of the chunk [lower, upper) over the key columns (None: unbounded), as one row comparison
    (an index range scan)."""
    return _half_open(_row([quote(column) for column in columns]),
                      None if lower is None else _row([literal(value) for value in lower]),
                      None if upper is None else _row([literal(value) for value in upper]))


def _half_open(expression: str, lower: str | None, upper: str | None) -> str:
    """`expression` in [lower, upper) (None: unbounded), as SQL."""
    bounds = ([] if lower is None else [f"{expression} >= {lower}"]) + \
        ([] if upper is None else [f"{expression} < {upper}"])
    return " AND ".join(bounds) or "true"


def next_chunk_start(cur: Any, schema: str, table: str, key: Sequence[str], lower: Sequence[Any] | None,
                     rows: int) -> list[Any] | None:
    """The key `rows` rows after `lower` in key order, as text: where the next chunk starts; None when fewer rows
    remain (the chunk from `lower` is the last)."""
    from psycopg import sql

    names = [sql.Identifier(column) for column in key]
    # Aliased: an output column named as a key column would make ORDER BY sort by its text.
    texts = sql.SQL(", ").join(sql.SQL("{}::text AS {}").format(name, sql.Identifier(f"_cdc_key{i}"))
                               for i, name in enumerate(names))
    order = sql.SQL(", ").join(names)
    where = sql.SQL("")
    params: list[Any] = []
    if lower is not None:
        row = sql.SQL(", ").join(sql.Placeholder() * len(key))
        where = sql.SQL(" WHERE ROW({}) >= ROW({})").format(order, row)
        params = [str(value) for value in lower]
    cur.execute(sql.SQL("SELECT {} FROM {}.{}{} ORDER BY {} LIMIT 1 OFFSET {}").format(
        texts, sql.Identifier(schema), sql.Identifier(table), where, order, sql.Literal(int(rows))), params)
    row = cur.fetchone()
    return None if row is None else list(row)


def copy_out_column(column: SourceColumn, pg_type: str) -> str:
    """The column as a bulk load's `COPY (SELECT ...) TO STDOUT` selects it: its own text output is what the
    destination's `pg_type` reads, or it is cast first (`_CAST_FIRST`)."""
    name = quote(column.name)
    cast = _CAST_FIRST.get(column.data_type)
    if cast and not pg_type.startswith(column.data_type):
        return f"{name}::{cast}"
    return name


def ctid_split(cur: Any, schema: str, table: str, chunk_bytes: int, most: int) -> list[int]:
    """Where a table without a key is cut into parts of about `chunk_bytes` of its heap (at most `most` parts), as
    block numbers: each part is the rows stored in its blocks (`ctid_predicate`), the last open-ended. Empty when one
    part holds it. Read from the heap's size now, not the catalog's estimate."""
    cur.execute("SELECT pg_relation_size(c.oid), current_setting('block_size')::int FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                (schema, table))
    row = cur.fetchone()
    if row is None:
        return []
    size, block = row
    parts = min(most, -(-size // max(1, chunk_bytes)))
    blocks = size // block
    return [blocks * i // parts for i in range(1, parts)] if parts > 1 else []


def ctid_predicate(lower: Sequence[Any] | None, upper: Sequence[Any] | None) -> str:
    """The rows of a part `ctid_split` cut: those stored from block `lower` (its first item) up to, not including,
    block `upper` (a TID range scan, PostgreSQL 14 on)."""
    return _half_open("ctid", None if lower is None else f"'({int(lower[0])},0)'::tid",
                      None if upper is None else f"'({int(upper[0])},0)'::tid")


def export_snapshot(connector: ConnectorConfig) -> tuple[Any, str]:
    """A source session holding a snapshot open for others to share (`import_snapshot`), and the snapshot's name:
    the parts of a table without a key, read by several tasks, see the table at one moment. The snapshot lives until
    the session ends (the caller closes it once the tasks are done)."""
    conn = connect(connector)  # with no idle limit: idle in its transaction until the last part imported it
    try:
        conn.execute(COPY_SNAPSHOT)
        return conn, conn.execute("SELECT pg_export_snapshot()").fetchone()[0]
    except BaseException:
        conn.close()
        raise


def import_snapshot(name: str) -> str:
    """What a reader's session runs first to read under the snapshot `export_snapshot` named."""
    return f"{COPY_SNAPSHOT}; SET TRANSACTION SNAPSHOT {literal(name)}"


def copy_out_query(select: str) -> str:
    """A chunk's SELECT as the COPY whose text the load pipes into the destination's COPY (`SourceChunkCopier`)."""
    return f"COPY ({select}) TO STDOUT"


def select_text(column: SourceColumn, pg_type: str) -> str:
    """The SQL that renders the column as text for `column_text` (NULL stays NULL)."""
    return f"{copy_out_column(column, pg_type)}::text"


def column_text(value: Column, column: SourceColumn, pg_type: str) -> Column:
    """The COPY text of a value `select_text` rendered (`\\N` for NULL)."""
    return F.coalesce(copy_escape(value), F.lit(NULL_TEXT))


def _chars(*codes: int) -> str:
    return " || ".join(f"chr({code})" for code in codes)


def copy_text_sql(column: SourceColumn, pg_type: str) -> str | None:
    """The SQL that renders the column's whole COPY text field (escaped, `\\N` for NULL) in the source, as
    `column_text` would from `select_text`'s value."""
    text = select_text(column, pg_type)
    for char, escape in ESCAPES:  # as `copy_escape` replaces them (PostgreSQL's text holds no NUL)
        text = f"replace({text}, {_chars(ord(char))}, {_chars(*map(ord, escape))})"
    return f"coalesce({text}, {_chars(92, 78)})"


def copy_line_sql(fields: Sequence[str]) -> str:
    """One COPY text line from fields `copy_text_sql` rendered (tab-separated)."""
    return " || chr(9) || ".join(f"({field})" for field in fields)


def zero_dates(values: dict[str, Column], columns: Sequence[SourceColumn]) -> Column:
    """PostgreSQL has no zero dates."""
    return F.lit(0)


def snapshot_position_select(position_alias: str, aliases: Sequence[str]) -> str:
    """The first row of a one-chunk read: the statement's snapshot as JSON, then one NULL per data column."""
    nulls = "".join(f", NULL AS {alias}" for alias in aliases)
    return f"SELECT json_build_object('snapshot', pg_current_snapshot()::text)::text AS {position_alias}{nulls}"


def require_snapshot_position(cur: Any, connector: ConnectorConfig, source_table: str) -> None:
    """Every supported PostgreSQL gives a statement's snapshot (`pg_current_snapshot()`, version 13 on)."""
