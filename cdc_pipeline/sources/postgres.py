"""What the pipeline knows of PostgreSQL sources: the Debezium connector's properties (pgoutput, the connector's
slot and publication), connecting, quoting, the slot's state, and reading tables for the bulk snapshot (their columns and primary keys, chunk boundaries, the SQL that renders each column as text, the
destination table a source table's catalog entry describes, and the transaction snapshot a chunk was read under),
and the preflight check of a source (logical decoding, the capture role, slots, senders, the publication).

A bulk read renders every column with PostgreSQL's own text output (`::text`), which the destination's COPY reads
back exactly into the same type: the session pins the settings that output depends on (`bytea_output`,
`IntervalStyle`, `extra_float_digits`; pgjdbc sets `DateStyle` to ISO, and time zones are written with their offset).
Spark then escapes the text for COPY (`column_text`).

A table without a primary key is read as one chunk under one statement's snapshot, and that snapshot itself
(`pg_current_snapshot()`, PostgreSQL 13 or later) is its position: a streamed change belongs to a transaction the
chunk already saw exactly when that transaction is visible in the snapshot (`before_snapshot`), the same rule
PostgreSQL applies to the rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence
from urllib.parse import quote as url_quote
from urllib.parse import quote_plus, urlencode

from psycopg import sql
from pyspark.sql import Column
from pyspark.sql import functions as F

from cdc_pipeline.config import KEEPALIVES, ConnectorConfig
from cdc_pipeline.copy_text import ESCAPES, NULL_TEXT, copy_escape
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sources.debezium import HEARTBEAT_TOPICS_PROPERTY
from cdc_pipeline.sources.change_check import ChangeCheck, SourceLag
from cdc_pipeline.sources.finding import Finding, source_error, source_warning
from cdc_pipeline.sources.lost_position import LostPosition
from cdc_pipeline.sources.source_index import IndexColumn, SourceIndex
from cdc_pipeline.sources.table import ColumnText, SourceTable
from cdc_pipeline.sources.type_choice import TypeChoice, column_length, column_number
from cdc_pipeline.sources.offset_shape import FLAG, INT, TEXT, OffsetShape

CONNECT_TIMEOUT_SECONDS = 10
CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
OFFSET_SHAPE = OffsetShape(
    required={"lsn": INT},
    optional={"lsn_proc": INT, "lsn_commit": INT, "txId": INT, "ts_usec": INT, "xmin": INT, "messageType": TEXT,
              "snapshot": FLAG, "last_snapshot_record": FLAG, "snapshot_completed": FLAG, "transaction_id": TEXT},
    example='{"lsn": 24023128, "txId": 555}',
)
JDBC_DRIVER = "org.postgresql.Driver"
GEOMETRY_TYPES: frozenset[str] = frozenset()
# The source's limits on a session left idle, in a transaction or outside one (PostgreSQL 14 on), and on a
# transaction's length (17 on), which a database or role may set: lifted for the load's own sessions, which wait on
# the copy (a reader between two fetches while Spark writes, the session holding the parts' exported snapshot until
# every part imported it). Through pg_settings, since a server older than a setting refuses its name; the
# connector's statement_timeout still bounds every statement.
LIFT_IDLE_LIMITS = ("SELECT pg_catalog.set_config(name, '0', false) FROM pg_catalog.pg_settings WHERE name IN "
                    "('idle_in_transaction_session_timeout', 'idle_session_timeout', 'transaction_timeout')")
# Every Spark reader's session: the text output the COPY reads back, no parallel plan (a table without a key is
# read as its snapshot row then its rows, in that order), and no idle limit (`LIFT_IDLE_LIMITS`).
SESSION_INIT = ("SET bytea_output = 'hex'; SET IntervalStyle = 'postgres'; SET extra_float_digits = 3; "
                f"SET max_parallel_workers_per_gather = 0; {LIFT_IDLE_LIMITS}")
# The snapshot row of a one-chunk read needs no transaction of its own: one statement reads under one snapshot.
CONSISTENT_SNAPSHOT = SESSION_INIT
# A load's chunk piped COPY to COPY reads its snapshot's position and its rows in two statements: one transaction's
# snapshot holds for both (its session is its own and ends with the chunk).
COPY_SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"
# PostgreSQL emits no DDL events: destination tables are made from the value schemas (and, for the bulk snapshot,
# from the source catalog as a value schema would describe it: `schema_infer.field_specs_of`).
DDL_EVENTS = False
_SYSTEM_SCHEMAS = ("pg_catalog", "information_schema", "pg_toast")
# Source types whose text output the destination type reads differently (the type map's choice).
_CAST_FIRST = {"money": "numeric"}


# PostgreSQL's columns to the destination's, by type name (convert/typemap.py reads them).
POSTGRES_TYPE_MAP: dict[str, str] = {
    "int2": "smallint",
    "smallint": "smallint",
    "smallserial": "smallint",
    "int4": "integer",
    "integer": "integer",
    "serial": "integer",
    "int8": "bigint",
    "bigint": "bigint",
    "bigserial": "bigint",
    "numeric": "numeric(p,s)",
    "decimal": "numeric(p,s)",
    "text": "text",
    "varchar": "character varying(n)",
    "bpchar": "character(n)",
    "bool": "boolean",
    "float4": "real",
    "float8": "double precision",
    "date": "date",
    "time": "time(fsp) without time zone",
    "timetz": "time(fsp) with time zone",
    "timestamp": "timestamp(fsp) without time zone",
    "timestamptz": "timestamp(fsp) with time zone",
    "bytea": "bytea",
    "json": "json",
    "jsonb": "jsonb",
    "uuid": "uuid",
    "interval": "interval",
    "xml": "xml",
    "bit": "bit(n)",
    "varbit": "bit varying(n)",
    "inet": "inet",
    "cidr": "cidr",
    "macaddr": "macaddr",
    "macaddr8": "macaddr8",
    "money": "numeric(19,2)",
    "point": "point",
    "int4range": "int4range",
    "int8range": "int8range",
    "numrange": "numrange",
    "daterange": "daterange",
    "tsrange": "tsrange",
    "tstzrange": "tstzrange",
}

POSTGRES_TYPE_ALIASES: dict[str, str] = {
    "character varying": "varchar",
    "character": "bpchar",
    "char": "bpchar",
    "boolean": "bool",
    "real": "float4",
    "double precision": "float8",
    "time without time zone": "time",
    "time with time zone": "timetz",
    "timestamp without time zone": "timestamp",
    "timestamp with time zone": "timestamptz",
}

# The rules the map above does not show, as the docs print them beside it.
TYPE_MAP_NOTES: dict[str, list[tuple[str, str]]] = {
    "postgres": [
        ("numeric without precision", "numeric"),
        ("time types without precision", "PostgreSQL's default (6 digits)"),
        ("arrays of the types above (`_int4` ...)", "the element's type, as an array (`integer[]` ...)"),
        ("arrays of other types", "text[]"),
        ("enum types", "text"),
        ("anything else", "text (logged as a warning)"),
    ],
}
TYPE_MAPS: dict[str, dict[str, str]] = {"postgres": POSTGRES_TYPE_MAP}
# PostgreSQL emits no DDL: no column is added by a statement whose implicit default the destination would need.
IMPLICIT_DEFAULTS = False


def column_type(source_type: str, column: dict[str, Any], connector_type: str) -> TypeChoice | None:
    """The destination type of a PostgreSQL column of `source_type` (Debezium's type name), or None when the map does
    not know it. `column` is the Debezium column description, read for its length and scale. An array of a type the
    map knows is an array of that type's destination type, of another type `text[]`."""
    element = array_element(source_type)
    if element is None:
        return _scalar_type(source_type, column)
    choice = _scalar_type(element, column)
    return TypeChoice("text[]") if choice is None else TypeChoice(choice.template + "[]", choice.fractional_digits)


def _scalar_type(source_type: str, column: dict[str, Any]) -> TypeChoice | None:
    base = " ".join(source_type.strip().strip('"').lower().split())
    template = POSTGRES_TYPE_MAP.get(base) or POSTGRES_TYPE_MAP.get(POSTGRES_TYPE_ALIASES.get(base, ""))
    if template is None:
        return None
    if template == "character(n)" and column_length(column.get("length")) is None:
        return TypeChoice("bpchar")
    scale = column_number(column.get("scale"))
    return TypeChoice(template, scale if scale is not None and 0 <= scale <= 6 else None)


def array_element(source_type: str) -> str | None:
    """The element type of a PostgreSQL array type as Debezium names it (`_int4` -> `int4`), or None."""
    base = " ".join(source_type.strip().strip('"').lower().split())
    if base.startswith("_"):
        return base[1:]
    if base.endswith("[]"):
        return base[:-2].rstrip()
    return None


def always_nullable(source_type: str) -> bool:
    """No PostgreSQL type holds a value that replicates as NULL: a column's nullability is its definition's."""
    return False


def debezium_properties(connector: ConnectorConfig) -> dict[str, str]:
    """The connector properties of a PostgreSQL source (the engine's own are the runner's)."""
    props = {
        "connector.class": CONNECTOR_CLASS,
        "database.dbname": connector.database,
        "database.sslmode": connector.tls_mode,
        "plugin.name": "pgoutput",
        "slot.name": connector.replication_slot,
        "publication.name": connector.replication_slot,
        "publication.autocreate.mode": "filtered",
        # PostgreSQL emits no DDL events: destination tables are derived from the value schemas, which need
        # each column's source type, length and scale to reproduce it.
        "column.propagate.source.type": ".*",
        # Intervals as ISO-8601 text keep months and days apart (the numeric form folds them into microseconds).
        "interval.handling.mode": "string",
        # Debezium's JDBC session sits idle between its queries (the heartbeat's, the schema's): no idle limit of
        # the source's ends it (one statement: Debezium splits the property at semicolons).
        "database.initial.statements": LIFT_IDLE_LIMITS,
    }
    if connector.tls_ca_file:
        props["database.sslrootcert"] = connector.tls_ca_file
    if connector.tables:
        # The heartbeat table is captured (so in the publication, which Debezium keeps to its include list), its
        # rows never applied (`replicates`).
        watched = (*connector.tables, connector.heartbeat_table)
        schemas = dict.fromkeys(connector.split_table(table)[0] for table in watched)
        props["schema.include.list"] = ",".join(re.escape(schema) for schema in schemas if schema)
        props["table.include.list"] = ",".join(re.escape(table) for table in watched)
    props["heartbeat.interval.ms"] = str(max(1, round(connector.heartbeat_interval_seconds * 1000)))
    props["heartbeat.action.query"] = heartbeat_query(connector)
    # The runner commits a batch of heartbeats itself when nothing waits before it (its own property).
    props[HEARTBEAT_TOPICS_PROPERTY] = f"{connector.name}.{connector.heartbeat_table}"
    return props


def source_partition(connector: str, database: str) -> dict[str, str]:
    """Debezium's source partition of the connector's offsets: the connector's name (its topic prefix)."""
    return {"server": connector}


def replicates(connector: ConnectorConfig, source_table: str) -> bool:
    """Whether a table (`schema.table`) is one the connector may replicate: any but its heartbeat table, which
    Debezium's heartbeat writes so that the slot is confirmed (it is no data)."""
    return source_table != connector.heartbeat_table


def heartbeat_query(connector: ConnectorConfig) -> str:
    """The statement Debezium's heartbeat runs on the source: it writes the connector's row of the heartbeat table,
    a change of the publication that the engine receives after any WAL of other tables, so that committing its
    offset confirms the slot past that WAL."""
    return sql.SQL("INSERT INTO {} (slot_name, beat_at) VALUES ({}, now()) "
                   "ON CONFLICT (slot_name) DO UPDATE SET beat_at = EXCLUDED.beat_at").format(
        sql.Identifier(*connector.split_table(connector.heartbeat_table)),
        sql.Literal(connector.replication_slot)).as_string()


def ensure_heartbeat_table(connector: ConnectorConfig) -> None:
    """Creates the heartbeat table (one row per connector's slot) on the source; does nothing if it exists. A
    capture user without CREATE on its schema needs it created by the DBA, as docs/triggers.md shows."""
    import psycopg

    schema, table = connector.split_table(connector.heartbeat_table)
    with connect(connector) as source:
        if source.execute("SELECT to_regclass(%s)", (qualified(schema, table),)).fetchone()[0] is not None:
            return
        try:
            source.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (slot_name text PRIMARY KEY, "
                                   "beat_at timestamptz NOT NULL)").format(sql.Identifier(schema, table)))
        except psycopg.Error as exc:
            raise CdcError(f"cannot create the heartbeat table {connector.heartbeat_table} on the source: "
                           f"{str(exc).strip().splitlines()[0]}; create it (docs/triggers.md) or name another in "
                           "heartbeat_table", connector=connector.name) from None


def quote(identifier: str) -> str:
    """A PostgreSQL identifier in double quotes, embedded double quotes doubled."""
    return '"' + identifier.replace('"', '""') + '"'


def qualified(schema: str, table: str) -> str:
    return quote(schema) + "." + quote(table)


def connect(connector: ConnectorConfig) -> Any:
    """A psycopg connection to the connector's source database for the planning queries (never rows), in
    autocommit so that no idle transaction holds back the source's vacuum or a schema change."""
    import psycopg

    try:
        conn = psycopg.connect(host=connector.hostname, port=connector.port, user=connector.user,
                               password=connector.password.reveal(), dbname=connector.database,
                               connect_timeout=CONNECT_TIMEOUT_SECONDS, autocommit=True,
                               application_name=f"cdc-pipeline {connector.name}", **tls_parameters(connector),
                               options=session_options(connector), **KEEPALIVES)
        try:
            # A load holds its planning session, and the one exporting its parts' snapshot, idle while it copies.
            conn.execute(LIFT_IDLE_LIMITS)
        except BaseException:
            conn.close()
            raise
        return conn
    except psycopg.Error as exc:
        # psycopg's messages name the host and the server's words, never the password.
        raise CdcError(f"cannot connect to the source {connector.hostname}:{connector.port}: "
                       f"{str(exc).strip().splitlines()[0]}", connector=connector.name) from None


def tls_parameters(connector: ConnectorConfig) -> dict[str, str]:
    """The connector's `tls_mode` and `tls_ca_file` as libpq's and pgjdbc's parameters (both take the same)."""
    parameters = {"sslmode": connector.tls_mode}
    if connector.tls_ca_file:
        parameters["sslrootcert"] = connector.tls_ca_file
    return parameters


def session_options(connector: ConnectorConfig) -> str:
    """The source sessions' lock and statement timeouts, as the `options` parameter libpq and pgjdbc take."""
    return (f"-c lock_timeout={int(connector.source_lock_timeout_seconds * 1000)}ms "
            f"-c statement_timeout={int(connector.source_statement_timeout_seconds * 1000)}ms")


def jdbc_url(connector: ConnectorConfig) -> str:
    """The JDBC URL Spark's readers use (its PostgreSQL dialect: double-quoted names, a cursor per read), with the
    connector's TLS, its source timeouts and TCP keepalives."""
    parameters = {**tls_parameters(connector), "options": session_options(connector), "tcpKeepAlive": "true"}
    return (f"jdbc:postgresql://{connector.hostname}:{connector.port}/{quote_plus(connector.database)}?"
            + urlencode(parameters, quote_via=url_quote))


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
        "ORDER BY n.nspname, c.relname", (list(_SYSTEM_SCHEMAS), schema, schema, table, table))
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


def before_snapshot(offset: dict[str, Any] | None, position: dict[str, Any]) -> bool:
    """Whether a streamed change (its Debezium offset) belongs to a transaction visible in the snapshot
    `position` holds (`xmin:xmax:xip,...`): committed before the chunk was read, so its rows hold it."""
    if not offset or "snapshot" in offset or offset.get("txId") is None or "snapshot" not in position:
        return False
    xmin_text, xmax_text, running = str(position["snapshot"]).split(":")
    xmin, xmax = int(xmin_text), int(xmax_text)
    xid = _xid_near(int(offset["txId"]), xmax)
    if xid < xmin:
        return True
    return xid < xmax and str(xid) not in running.split(",")


def _xid_near(xid: int, reference: int) -> int:
    """pgoutput names a transaction by its 32-bit id; a snapshot's ids carry their epoch. Ids compare modulo 2^32
    within half the circle of each other (PostgreSQL's own rule), so the id is the one nearest `reference`."""
    if xid < 1 << 32 <= reference:
        ahead = (xid - reference) % (1 << 32)
        return reference + ahead if ahead < 1 << 31 else reference - ((1 << 32) - ahead)
    return xid


def stream_passed(offset: dict[str, Any] | None, position: dict[str, Any]) -> bool:
    """Whether a streamed change (its Debezium offset) belongs to a transaction begun after the snapshot `position`
    holds was taken (its id at or past the snapshot's xmax): its commit follows, in the stream, the commit of every
    transaction that snapshot sees. (A transaction merely invisible to it may have written its commit record before
    one it sees.)"""
    if not offset or "snapshot" in offset or offset.get("txId") is None or "snapshot" not in position:
        return False
    xmax = int(str(position["snapshot"]).split(":")[1])
    return _xid_near(int(offset["txId"]), xmax) >= xmax


def load_end_position(cur: Any) -> dict[str, Any]:
    """Where the source is now, as `stream_passed` compares it: a snapshot of its transactions."""
    cur.execute("SELECT pg_current_snapshot()::text")
    return {"snapshot": cur.fetchone()[0]}


# A slot that keeps more WAL than this is shown with a warning (a paused or stopped connector keeps it all).
RETAINED_WAL_WARNING_BYTES = 1 << 30


def slot_status(connector: ConnectorConfig) -> dict[str, Any] | None:
    """The connector's replication slot as the source sees it: the WAL it retains (bytes, from its restart LSN),
    whether a run holds it, and PostgreSQL's `wal_status` (`lost` once `max_slot_wal_keep_size` removed WAL it
    needed); None when the slot does not exist."""
    with connect(connector) as source:
        row = source.execute(
            "SELECT slot_name, active, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, wal_status, "
            "safe_wal_size FROM pg_replication_slots WHERE slot_name = %s", (connector.replication_slot,)).fetchone()
    if row is None:
        return None
    retained = int(row[2] or 0)
    status = {"slot": row[0], "active": bool(row[1]), "retained_wal_bytes": retained, "wal_status": row[3],
              "safe_wal_size": row[4]}
    if retained > RETAINED_WAL_WARNING_BYTES or row[3] in ("unreserved", "lost"):
        status["warning"] = (f"the slot retains {retained >> 20} MB of WAL on the source (wal_status {row[3]}): "
                             "resume or run the connector, or bound it with max_slot_wal_keep_size "
                             "(docs/triggers.md)")
    return status


def lost_position(connector: ConnectorConfig, offset: dict[str, Any], captured: Callable[[str], bool]
                  ) -> LostPosition | None:
    """What the source no longer holds of the engine's stored `offset` (its `lsn`; empty before the engine stored
    one), or None: the connector's slot
    was invalidated (`wal_status` lost: the server removed WAL it held, past `max_slot_wal_keep_size`) or is gone
    (Debezium would make a new one at the WAL's end, skipping every change in between without a word)."""
    slot, lsn = connector.replication_slot, offset.get("lsn")
    with connect(connector) as source:
        row = source.execute("SELECT wal_status, current_setting('max_slot_wal_keep_size') FROM pg_replication_slots "
                             "WHERE slot_name = %s", (slot,)).fetchone()
    # Before the engine stored an offset (a bulk load begun), the slot holds the position.
    position = f"LSN {_lsn_text(int(lsn))}" if lsn is not None else f"(its replication slot {slot}'s)"
    if row is None:
        return None if lsn is None else LostPosition(position, f"its replication slot {slot} does not exist (it was "
                                                               "dropped)")
    if row[0] == "lost":
        return LostPosition(position, f"its replication slot {slot} was invalidated (wal_status lost): the server "
                                      f"removed WAL the slot held, past max_slot_wal_keep_size ({row[1]})")
    return None


def drop_lost_slot(connector: ConnectorConfig) -> bool:
    """Drops the connector's replication slot when the server invalidated it (`wal_status` lost), so that a new
    snapshot's engine makes a new one; returns whether it did. Does nothing to a slot that holds its WAL."""
    with connect(connector) as source:
        dropped = source.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                                 "WHERE slot_name = %s AND wal_status = 'lost' AND NOT active",
                                 (connector.replication_slot,)).fetchall()
    return bool(dropped)


def replication_lag(connector: ConnectorConfig, checked: Any, applied: dict[str, Any]) -> SourceLag | None:
    """How far the WAL goes past the connector's replication slot: `pg_wal_lsn_diff` of the current WAL position
    and the slot's confirmed position (what the connector has not confirmed as applied); None when the slot does
    not exist."""
    with connect(connector) as source:
        row = source.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, confirmed_flush_lsn::text, "
            "pg_current_wal_lsn()::text FROM pg_replication_slots WHERE slot_name = %s",
            (connector.replication_slot,)).fetchone()
    if row is None:
        return None
    return SourceLag(bytes=max(0, int(row[0] or 0)), position=f"slot {connector.replication_slot} at {row[1]}",
                     source_position=str(row[2]))


def row_counts(connector: ConnectorConfig, captured: Callable[[str], bool]) -> dict[str, int]:
    """The rows of each table of the source database that `captured` accepts (`schema.table`: rows)."""
    with connect(connector) as conn:
        rows = conn.execute("SELECT table_schema, table_name FROM information_schema.tables "
                            "WHERE table_type = 'BASE TABLE' AND NOT table_schema = ANY(%s)",
                            (list(_SYSTEM_SCHEMAS),)).fetchall()
        return {f"{schema}.{table}": conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                    sql.Identifier(schema, table))).fetchone()[0]
                for schema, table in rows if captured(f"{schema}.{table}")}


# pgoutput's change messages (insert, update, delete, truncate); a peek may also return BEGIN, COMMIT and
# RELATION messages, which alone are no change.
_PGOUTPUT_CHANGES = (ord("I"), ord("U"), ord("D"), ord("T"))
SLOT_PEEK_MESSAGES = 512


@dataclass(frozen=True)
class SlotPeek:
    """What the connector's slot holds after the last change applied, seen without consuming it."""

    active: bool  # a run holds the slot: it cannot be peeked
    messages: int  # messages peeked, at most SLOT_PEEK_MESSAGES
    changes: int  # of which changes of the publication after the applied LSN
    unconfirmed_wal_bytes: int = 0  # WAL after the slot's confirmed position (what a run can let the source remove)
    # The WAL written before the peek was all flushed, so the peek decoded it (a commit under synchronous_commit=off
    # may wait up to wal_writer_delay): else a change committed just before may not have been seen.
    flushed: bool = True


def peek_slot(connector: ConnectorConfig, applied_lsn: int) -> SlotPeek | None:
    """Peeks the connector's slot (`pg_logical_slot_peek_binary_changes`, nothing consumed) for changes of its
    publication after `applied_lsn`; None when the slot does not exist. The slot is confirmed up to the last change
    Debezium processed, not past its transaction's commit, so the transaction applied last is decoded again."""
    slot = connector.replication_slot
    with connect(connector) as source:
        row = source.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
        if row is None:
            return None
        if row[0]:
            return SlotPeek(active=True, messages=0, changes=0)
        flushed = source.execute("SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()").fetchone()[0]
        # A change message names its table's oid in bytes 2-5; the heartbeat table's changes are no work.
        peeked = source.execute(
            "SELECT count(*), count(*) FILTER (WHERE get_byte(data, 0) = ANY(%s) AND lsn > %s::pg_lsn "
            "AND substring(data FROM 2 FOR 4) IS DISTINCT FROM int4send(to_regclass(%s)::oid::int4)) "
            "FROM pg_logical_slot_peek_binary_changes(%s, NULL, %s, 'proto_version', '1', 'publication_names', %s)",
            (list(_PGOUTPUT_CHANGES), _lsn_text(applied_lsn), qualified(*connector.split_table(connector.heartbeat_table)),
             slot, SLOT_PEEK_MESSAGES, slot)).fetchone()
        unconfirmed = source.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint FROM pg_replication_slots "
            "WHERE slot_name = %s", (slot,)).fetchone()
    return SlotPeek(active=False, messages=int(peeked[0]), changes=int(peeked[1]),
                    unconfirmed_wal_bytes=int(unconfirmed[0] or 0) if unconfirmed else 0, flushed=bool(flushed))


def mark_wal_end(connector: ConnectorConfig) -> int | None:
    """Where the source's WAL ends now (its insert position, as a number: past every commit made so far), then the
    connector's heartbeat row written (`heartbeat_query`): a change of its publication past that end, which the
    walsender sends after every transaction committed before it, so that the engine hands over a record at or past
    the end only once Debezium has decoded and handed over them all (`received_past`). None when the position cannot
    be read or the row written."""
    try:
        with connect(connector) as source:
            end = int(source.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0])
            source.execute(heartbeat_query(connector))
    except Exception as exc:  # noqa: BLE001 - the run then ends on time alone
        log.warning("%s: cannot mark the end of the source's WAL: %s", connector.name, exc)
        return None
    return end


def may_share_lsn_ahead(entry: dict[str, Any] | None, connector: ConnectorConfig) -> bool:
    """Whether changes not handed over yet may share the LSN of this streamed change (an index entry of a batch):
    PostgreSQL writes many rows of a COPY (or of any multi-row insert, `heap_multi_insert`) under one WAL record,
    whose LSN each of their changes carries, so an insert of a data table may be followed by more at its LSN. Once
    one of them is applied, the applied position and Debezium's offset say every change at that LSN is (Debezium
    resumes after it), so a group or run must not end between them."""
    if not entry or entry.get("op") != "c" or entry.get("table") == connector.heartbeat_table:
        return False
    offset = entry.get("offset") or {}
    return "lsn" in offset and "txId" in offset and not offset.get("snapshot")


def received_past(offset: dict[str, Any] | None, lsn: int) -> bool:
    """Whether the record Debezium handed over last (its offset) is at or past the WAL position `lsn`: a change
    written after `lsn`, or a heartbeat sent once Debezium had decoded the WAL past it, follows in the stream every
    transaction committed before `lsn`."""
    return bool(offset) and int(offset.get("lsn") or 0) >= lsn


def _lsn_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def check_changes(connector: ConnectorConfig, checked: Any, applied: dict[str, Any],
                  captured: Callable[[str], bool]) -> ChangeCheck:
    """The change check: whether the connector's slot holds a change of its publication after the last one
    `applied` (peeked, nothing consumed), or more WAL after its confirmed position than `retained_wal_run_mb` (a run
    confirms the slot past it). Decoding reads the WAL flushed: with `synchronous_commit=off` a change shows within
    `wal_writer_delay`."""
    slot = connector.replication_slot
    peeked = peek_slot(connector, int(applied.get("lsn") or 0))
    if peeked is None:
        return ChangeCheck(True, f"replication slot {slot} does not exist yet")
    if peeked.active:
        return ChangeCheck(False, f"replication slot {slot} is in use", known=False)
    if peeked.changes or peeked.messages >= SLOT_PEEK_MESSAGES:
        return ChangeCheck(True, f"replication slot {slot} holds changes of publication {slot}")
    unconfirmed_mb = peeked.unconfirmed_wal_bytes >> 20
    if unconfirmed_mb >= connector.retained_wal_run_mb:
        # Only other tables were written: a run confirms the slot past their WAL (the heartbeat), and the source
        # may remove it.
        return ChangeCheck(True, f"replication slot {slot} holds {unconfirmed_mb} MB of unconfirmed WAL "
                                 f"(retained_wal_run_mb {connector.retained_wal_run_mb})")
    if not peeked.flushed:
        return ChangeCheck(False, f"replication slot {slot} holds no change of the WAL flushed; WAL written since is "
                                  "not flushed yet (synchronous_commit=off)", known=False)
    return ChangeCheck(False, f"replication slot {slot} holds no change ({unconfirmed_mb} MB of unconfirmed WAL)",
                       reached_end=True)


def preflight(connector: ConnectorConfig) -> list[Finding]:
    """What the source lacks for the connector to run: `wal_level = logical`, a capture role with REPLICATION (or a
    superuser), a free replication slot unless the connector's own exists, a free WAL sender, the publication (or
    the right to create it as Debezium's `publication.autocreate.mode` does: `_publication_findings`), the
    heartbeat table (or CREATE on its schema) and SELECT on the captured tables; a warning
    when `max_slot_wal_keep_size` leaves the slot's WAL unbounded. Each finding carries the statement that fixes it.
    Raises CdcError when the source cannot be reached."""
    with connect(connector) as source, source.cursor() as cur:
        cur.execute("SELECT current_user, rolsuper, rolreplication, current_setting('wal_level'), "
                    "current_setting('max_replication_slots')::int, current_setting('max_wal_senders')::int, "
                    "current_setting('max_slot_wal_keep_size', true), "
                    "has_database_privilege(current_database(), 'CREATE') "
                    "FROM pg_roles WHERE rolname = current_user")
        user, superuser, replication, wal_level, max_slots, max_senders, keep_size, create_db = cur.fetchone()
        role = sql.Identifier(user).as_string()
        findings = []
        if wal_level != "logical":
            findings.append(source_error(
                "wal_level", f"wal_level is {wal_level}, and logical decoding needs logical",
                "ALTER SYSTEM SET wal_level = logical; then restart the server"))
        if not (superuser or replication):
            findings.append(source_error(
                "replication", f"the capture role {user} has neither REPLICATION nor superuser",
                f"ALTER ROLE {role} WITH REPLICATION; (and a `replication` line for it in pg_hba.conf if the server "
                "restricts replication connections)"))
        findings += _slot_findings(cur, connector, max_slots, max_senders)
        if keep_size in ("-1", None):
            findings.append(source_warning(
                "max_slot_wal_keep_size", "max_slot_wal_keep_size is -1: a paused or stopped connector's slot "
                                          "keeps WAL without bound, until the source's disk is full",
                "ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; SELECT pg_reload_conf(); (a size the source's "
                "disk holds; a slot that falls further behind is lost and the connector needs a new snapshot)"))
        tables = _captured_tables(cur, connector)
        findings += _publication_findings(cur, connector, role, superuser, create_db, tables)
        findings += _heartbeat_findings(cur, connector, role)
        unreadable = [table for table, readable, _ in tables if not readable]
        if unreadable:
            findings.append(source_error(
                "privileges", f"the capture role {user} cannot SELECT {_listed(unreadable)}, which the snapshot reads",
                f"GRANT SELECT ON {', '.join(_quoted(table, connector) for table in unreadable)} TO {role};"))
    return findings


def _slot_findings(cur: Any, connector: ConnectorConfig, max_slots: int, max_senders: int) -> list[Finding]:
    """A slot for the connector (its own, in this database, or a free one) and a WAL sender to stream from it."""
    slot = connector.replication_slot
    cur.execute("SELECT database, plugin FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    own = cur.fetchone()
    findings = []
    if own is not None and (own[0] != connector.database or own[1] != "pgoutput"):
        findings.append(source_error(
            "replication slot", f"a slot named {slot} exists for database {own[0]} with plugin {own[1]}, and the "
                                f"connector needs one of database {connector.database} with pgoutput",
            f"SELECT pg_drop_replication_slot({sql.Literal(slot).as_string()}); (if nothing else uses it)"))
    if own is None:
        cur.execute("SELECT count(*) FROM pg_replication_slots")
        used = int(cur.fetchone()[0])
        if used >= max_slots:
            findings.append(source_error(
                "max_replication_slots", f"max_replication_slots is {max_slots} and {used} slots exist: the "
                                         f"connector cannot create its slot {slot}",
                f"ALTER SYSTEM SET max_replication_slots = {used + 1}; then restart the server (or drop a slot "
                "nothing uses: SELECT pg_drop_replication_slot('name');)"))
    cur.execute("SELECT count(*) FROM pg_stat_replication")
    senders = int(cur.fetchone()[0])
    if senders >= max_senders:
        findings.append(source_error(
            "max_wal_senders", f"max_wal_senders is {max_senders} and {senders} are in use: the connector's "
                               "stream gets none",
            f"ALTER SYSTEM SET max_wal_senders = {senders + 1}; then restart the server"))
    return findings


def _captured_tables(cur: Any, connector: ConnectorConfig) -> list[tuple[str, bool, bool]]:
    """The connector's tables that exist on the source (`schema.table`), each with whether the capture role may
    SELECT it and whether it owns it."""
    wanted = set(connector.tables)
    cur.execute("SELECT n.nspname || '.' || c.relname, has_table_privilege(c.oid, 'SELECT'), "
                "pg_has_role(c.relowner, 'USAGE') "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relkind IN ('r', 'p') AND n.nspname <> ALL(%s) AND n.nspname NOT LIKE 'pg\\_temp\\_%%' "
                "ORDER BY 1", (list(_SYSTEM_SCHEMAS),))
    return [(name, readable, owned) for name, readable, owned in cur.fetchall()
            if (not wanted or name in wanted) and name != connector.heartbeat_table]


def _publication_findings(cur: Any, connector: ConnectorConfig, role: str, superuser: bool, create_db: bool,
                          tables: list[tuple[str, bool, bool]]) -> list[Finding]:
    """The connector's publication (named as its slot), by Debezium's `publication.autocreate.mode`: `filtered` (the
    pipeline's) creates it FOR TABLE when the connector starts, which needs CREATE on the database and owning the
    tables, and sets its table list again on later starts, which needs owning it; `all_tables` creates it FOR ALL
    TABLES, which needs a superuser; `disabled` needs it to exist."""
    name = connector.replication_slot
    mode = connector.debezium.get("publication.autocreate.mode", "filtered")
    cur.execute("SELECT pg_has_role(pubowner, 'USAGE') FROM pg_publication WHERE pubname = %s", (name,))
    row = cur.fetchone()
    publication = sql.Identifier(name).as_string()
    listed = [table for table, _, _ in tables] + [connector.heartbeat_table]
    create = (f"CREATE PUBLICATION {publication} FOR TABLE "
              f"{', '.join(_quoted(table, connector) for table in listed)};")
    if row is None and mode == "disabled":
        return [source_error("publication", f"the publication {name} does not exist, and Debezium does not create it "
                                            "(publication.autocreate.mode is disabled)",
                             f"as the tables' owner or a superuser: {create}")]
    if superuser or mode not in ("filtered", "all_tables"):
        return []
    if row is not None:
        if row[0] or mode != "filtered":
            return []
        return [source_warning(
            "publication", f"the publication {name} exists and the capture role does not own it: Debezium sets its "
                           "table list when the connector starts, which only its owner may",
            f"ALTER PUBLICATION {publication} OWNER TO {role};")]
    if mode == "all_tables":
        return [source_error("publication", f"the publication {name} does not exist, and only a superuser may create "
                                            "it FOR ALL TABLES (publication.autocreate.mode is all_tables)",
                             f"as a superuser: CREATE PUBLICATION {publication} FOR ALL TABLES;")]
    findings = []
    if not create_db:
        findings.append(source_error(
            "publication", f"the publication {name} does not exist and the capture role may not create it "
                           f"(no CREATE on database {connector.database})",
            f"GRANT CREATE ON DATABASE {sql.Identifier(connector.database).as_string()} TO {role};"))
    foreign = [table for table, _, owned in tables if not owned]
    if foreign:
        findings.append(source_error(
            "publication", f"the publication {name} does not exist and the capture role may not add "
                           f"{_listed(foreign)} to it (a publication's tables must be the role's own)",
            f"as their owner or a superuser: {create} ALTER PUBLICATION {publication} OWNER TO {role};"))
    return findings


def _heartbeat_findings(cur: Any, connector: ConnectorConfig, role: str) -> list[Finding]:
    """The heartbeat table (`ensure_heartbeat_table` creates it), which the capture role writes."""
    schema, table = connector.split_table(connector.heartbeat_table)
    cur.execute("SELECT to_regclass(%s) IS NOT NULL, has_schema_privilege(%s, 'CREATE') "
                "FROM pg_namespace WHERE nspname = %s", (qualified(schema, table), schema, schema))
    row = cur.fetchone()
    target = sql.Identifier(schema, table).as_string()
    if row is not None and row[0]:
        cur.execute("SELECT has_table_privilege(%s, 'INSERT, UPDATE')", (qualified(schema, table),))
        if cur.fetchone()[0]:
            return []
        return [source_error("heartbeat table", f"the capture role may not write the heartbeat table "
                                                f"{connector.heartbeat_table}",
                             f"GRANT SELECT, INSERT, UPDATE ON {target} TO {role};")]
    if row is not None and row[1]:
        return []
    return [source_error(
        "heartbeat table", f"the heartbeat table {connector.heartbeat_table} does not exist and the capture role may "
                           f"not create it in schema {schema}",
        f"CREATE TABLE {target} (slot_name text PRIMARY KEY, beat_at timestamptz NOT NULL); "
        f"GRANT SELECT, INSERT, UPDATE ON {target} TO {role};")]


def _listed(tables: list[str], shown: int = 5) -> str:
    more = f" and {len(tables) - shown} more" if len(tables) > shown else ""
    return ", ".join(tables[:shown]) + more


def _quoted(table: str, connector: ConnectorConfig) -> str:
    return sql.Identifier(*connector.split_table(table)).as_string()


def verify_text(column: SourceColumn, pg_type: str, value: Any) -> ColumnText:
    """How verify compares the column (`value`: the destination column, as psycopg SQL): the source renders the COPY
    text field the bulk snapshot writes (`copy_text_sql`), the destination its own text output of the value, under
    the same session settings (`verify_session`)."""
    return ColumnText(copy_text_sql(column, pg_type), sql.SQL("{}::text").format(value))


def row_hash_sql(line: str) -> str:
    """A row's hash for verify: the first 60 bits of the MD5 of its line (UTF-8), as an integer."""
    return f"('x' || substr(md5({line}), 1, 15))::bit(60)::bigint"


# The text output verify's renderings depend on, the same in the source's session and the destination's.
VERIFY_SESSION = ("SET bytea_output = 'hex'", "SET IntervalStyle = 'postgres'", "SET extra_float_digits = 3",
                  "SET TimeZone = 'UTC'", "SET DateStyle = 'ISO, YMD'")


def verify_session(cur: Any) -> None:
    """Pins the session's text output for verify's renderings (also run in the destination's session)."""
    for statement in VERIFY_SESSION:
        cur.execute(statement)
