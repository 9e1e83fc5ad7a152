"""The bulk snapshot engine (`snapshot_engine: spark`): copies the rows a connector's tables hold when it starts,
in parallel chunks on Spark, resumable chunk by chunk across runs, and hands over to the stream exactly.

The flow of a load: Debezium takes the schema snapshot only (`no_data`: destination tables created, its binlog
position P recorded, streaming from P; a PostgreSQL source's engine creates its slot at P, and the load makes the
destination tables from the source's catalog). Before the stream's first change is applied, each table is split into
chunks of about `snapshot_chunk_rows` rows by its key (boundaries found by index range scans, so skewed keys make
no huge chunk); a Spark job reads a slice of chunks in parallel through JDBC (one partition per chunk, the source
rendering every column as text, see `sources/`), Spark turns the rows into COPY text, and each partition
is COPYed into the destination by the runner's `ChunkCopyWriter` in its own transaction, which also marks the
chunk done (`cdc.bulk_load_chunks`) and adds its rows to the stats. A run that ends (its time budget, a pause, a
failure, SIGKILL) leaves every chunk either committed with its checkpoint or not at all; the next run goes on
with the chunks not done. Once every table is loaded the stream is applied from P.

Why the destination ends exact. Every chunk is read after P, so the stream from P holds every change the chunk's
rows may have missed. For a table with a key, the stream replays changes as upserts and deletes of whole row
images (`binlog_row_image=FULL`): a key's last change sets its final state whatever the chunk had read, and a
key with no change since P was read as it is. For a table without a key (one chunk), replaying would add rows
twice: it is read under one consistent snapshot whose exact binlog position MariaDB gives
(`binlog_snapshot_file`/`_position`; PostgreSQL: the statement's own transaction snapshot), and the stream
skips that table's changes committed before it (`sources.before_snapshot`). Tables are emptied when the load plans them, in the transaction that plans them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from functools import reduce
from typing import Any, Callable, Sequence

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from py4j.protocol import Py4JJavaError
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_pipeline import copy_text, faults

from cdc_pipeline.mapping import objmap, rule_store, transform_sql
from cdc_pipeline.sink import deferred_keys, key_builds, unseen_tables
from cdc_pipeline.sink.apply import staging_table_sql
from cdc_pipeline.catalog import DestinationTable, destination_table, destination_tables
from cdc_pipeline.config import ConnectorConfig, DestinationConfig, dest_identifier
from cdc_pipeline.convert.ddl import table_scoped_name
from cdc_pipeline.convert.dml import ColumnPlan
from cdc_pipeline.errors import CdcError
from cdc_pipeline.decode.events import FieldSpec
from cdc_pipeline.capture.runner import JAVA_PACKAGE, jdbc_target
from cdc_pipeline.capture.spark import working_on
from cdc_pipeline.convert.schema_infer import ensure_table_matches, field_specs_of
from cdc_pipeline.sources import captures, mariadb, module_for, select_tables
from cdc_pipeline.sources.source_index import SourceIndex

log = logging.getLogger(__name__)

# A chunk holds at most about this many bytes of source rows (the catalog's average row size, large values stored
# apart included), however many rows `snapshot_chunk_rows` allows, and at least one row: a chunk is one Spark task and
# one destination transaction, the unit a failure copies again and the progress counts; its rows stream through, so
# its size does not bound memory (the fetch below does). Rows of up to about 1.3 KB keep `snapshot_chunk_rows`.
CHUNK_BYTES = 64 << 20
# A part of a table without a key (`BulkLoader._ctid_split`) holds at least this much of its heap: each part costs a
# task, a source session and the import of the slice's snapshot, more than copying a few hundred KB.
PART_BYTES_AT_LEAST = 1 << 20
# The source's JDBC driver holds one fetch of rows at a time: at most FETCH_SIZE rows, and about FETCH_BYTES of them
# (by the same average; one row at least, however large).
FETCH_BYTES = 16 << 20
FETCH_SIZE = 10_000
_STAGING = "_cdc_bulk_staging"
_POSITION_ALIAS = "_cdc_position"
_LINE_ALIAS = "_cdc_line"
_GEOMETRY_LOGICAL = "io.debezium.data.geometry.Geometry"
# A table read as one chunk (a small one, or one without a key) shares a Spark job with other such tables, up to this
# many times `slice_chunks` chunks a job (and the rows of a slice of full chunks, as estimated), and such jobs run
# two at a time: a job's start and end, and the driver's bookkeeping, cost more than a small chunk's copy.
SMALL_CHUNKS_PER_SLICE_ROUND = 4
SLICES_IN_FLIGHT = 2
# A table estimated below this many rows keeps its indexes other than its keys through its load: building an index
# again after the data costs a statement and a scan of the table, more than keeping it up for a few rows.
KEEP_INDEXES_BELOW_ROWS = 10_000


@dataclass
class TableLoad:
    """One table of a running load, as `cdc.bulk_load_tables` keeps it."""

    source_table: str
    dest_schema: str
    dest_table: str
    key_columns: list[str]
    estimated_rows: int
    next_lower: list[Any] | None
    planned: bool
    finished: bool
    source_definition: dict[str, Any] | None = None
    chunk_rows: int = 0  # this run's rows per chunk (`BulkLoader._size_chunks`)
    row_bytes: int = 0  # the source's average row size, 0 when unknown (`BulkLoader._size_chunks`)

    @property
    def fetch_rows(self) -> int:
        """The JDBC fetch size of the table's reads: about FETCH_BYTES of rows, FETCH_SIZE rows at most."""
        return fetch_rows(self.row_bytes)

    @property
    def database(self) -> str:
        return self.source_table.partition(".")[0]

    @property
    def table(self) -> str:
        return self.source_table.partition(".")[2]


@dataclass(frozen=True)
class Chunk:
    id: int
    lower: list[Any] | None
    upper: list[Any] | None


@dataclass(frozen=True)
class BulkColumn:
    """A source column and the destination column it fills."""

    source: Any  # the source module's SourceColumn
    dest_name: str
    pg_type: str  # the type whose text input form the column's COPY text is


def chunk_rows(row_bytes: int, limit: int) -> int:
    """Rows per chunk of a table whose rows average `row_bytes` (0: unknown): `limit` (`snapshot_chunk_rows`), fewer
    for wide rows (about CHUNK_BYTES a chunk), one at least."""
    return min(limit, max(1, CHUNK_BYTES // row_bytes)) if row_bytes > 0 else limit


def fetch_rows(row_bytes: int) -> int:
    """The JDBC fetch size for rows averaging `row_bytes` (0: unknown): about FETCH_BYTES of them, between one row
    and FETCH_SIZE rows."""
    return min(FETCH_SIZE, max(1, FETCH_BYTES // row_bytes)) if row_bytes > 0 else FETCH_SIZE


def _table(schema: str, name: str) -> sql.Identifier:
    return sql.Identifier(schema, name)


def begin_load(conn: psycopg.Connection, schema: str, connector: str, tables: list[str] | None = None) -> int:
    """Starts a new load of the connector's tables, or of `tables` only (a snapshot request: the others keep their
    rows and stream on), forgetting what an earlier load recorded of them; returns its id."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(sql.SQL(
            """INSERT INTO {} AS l (connector, load_id, tables) VALUES (%s, 1, %s)
               ON CONFLICT (connector) DO UPDATE SET load_id = l.load_id + 1, tables = EXCLUDED.tables,
                 started_at = now(), finished_at = NULL, end_position = NULL, reconciled_at = NULL
               RETURNING load_id""").format(_table(schema, "bulk_loads")), (connector, tables))
        load_id = int(cur.fetchone()[0])
        # `db.*` names every table of a database.
        prefixes = None if tables is None else [name[:-1] for name in tables if name.endswith(".*")]
        for name in ("bulk_load_tables", "bulk_load_chunks"):
            cur.execute(sql.SQL("DELETE FROM {} WHERE connector = %s AND (%s::text[] IS NULL OR "
                                "source_table = ANY(%s) OR EXISTS (SELECT 1 FROM unnest(%s::text[]) AS p "
                                "WHERE starts_with(source_table, p)))").format(_table(schema, name)),
                        (connector, tables, tables, prefixes))
        cur.execute(sql.SQL(
            """INSERT INTO {} AS s (connector, snapshot_began_at) VALUES (%s, now())
               ON CONFLICT (connector) DO UPDATE SET snapshot_began_at = now(), snapshot_ended_at = NULL""").format(
            _table(schema, "stats")), (connector,))
    log.info("%s: bulk snapshot %d begins", connector, load_id)
    return load_id


def forget_engine_position(conn: psycopg.Connection, schema: str, connector: str) -> None:
    """Drops the connector's Debezium offset and schema history, so its engine starts over with a schema snapshot
    (a new load's chunks must be read after the position its stream starts from)."""
    with conn.transaction():
        for name in ("debezium_offsets", "debezium_schema_history"):
            conn.execute(sql.SQL("DELETE FROM {} WHERE connector = %s").format(_table(schema, name)), (connector,))


def has_load(conn: psycopg.Connection, schema: str, connector: str) -> bool:
    """Whether a load of the connector's tables was begun (running or finished)."""
    return conn.execute(sql.SQL("SELECT 1 FROM {} WHERE connector = %s").format(
        _table(schema, "bulk_loads")), (connector,)).fetchone() is not None


def running_load(conn: psycopg.Connection, schema: str, connector: str) -> int | None:
    """The id of the connector's load that is not finished yet, or None."""
    row = conn.execute(sql.SQL("SELECT load_id FROM {} WHERE connector = %s AND finished_at IS NULL").format(
        _table(schema, "bulk_loads")), (connector,)).fetchone()
    return None if row is None else int(row[0])


def unreconciled_end(conn: psycopg.Connection, schema: str, connector: str) -> dict[str, Any] | None:
    """The end position of the connector's finished load that the stream has not passed yet (its tables may hold
    rows of different moments until then), or None."""
    row = conn.execute(sql.SQL("SELECT end_position FROM {} WHERE connector = %s AND finished_at IS NOT NULL "
                               "AND reconciled_at IS NULL AND end_position IS NOT NULL").format(
        _table(schema, "bulk_loads")), (connector,)).fetchone()
    return None if row is None else row[0]


def reconcile(conn: psycopg.Connection, destination: DestinationConfig, connector: str, position: Any = None,
              on_index_seconds: Callable[[float], None] | None = None) -> list[str]:
    """The stream has applied past the finished load's end (`position`, where it is): every row now shows the
    source at one moment. Makes the withheld constraints and indexes again (several at once; `on_index_seconds`
    hears how long that took), and begins a load of the tables whose definition changed during this one (the stream
    has applied that change to them); returns those tables."""
    schema = destination.control_schema
    deferred_keys.restore(conn, destination, connector, position, on_index_seconds)
    with conn.transaction():
        again = [row[0] for row in conn.execute(sql.SQL(
            "SELECT source_table FROM {} WHERE connector = %s AND copy_again ORDER BY source_table").format(
            _table(schema, "bulk_load_tables")), (connector,)).fetchall()]
        conn.execute(sql.SQL("UPDATE {} SET reconciled_at = now() WHERE connector = %s").format(
            _table(schema, "bulk_loads")), (connector,))
        if again:
            begin_load(conn, schema, connector, again)
            log.info("%s: %s changed during the bulk snapshot: copied again now", connector, ", ".join(again))
    return again


def reconciled_load(conn: psycopg.Connection, schema: str, connector: str) -> int | None:
    """The id of the connector's latest bulk load once the stream has reconciled it (its tables then show the source
    at one moment), or None."""
    row = conn.execute(sql.SQL("SELECT load_id FROM {} WHERE connector = %s AND reconciled_at IS NOT NULL").format(
        _table(schema, "bulk_loads")), (connector,)).fetchone()
    return None if row is None else int(row[0])


def _load_tables(conn: psycopg.Connection, schema: str, connector: ConnectorConfig,
                 cur: Any) -> tuple[list[Any], list[str]]:
    """The source tables the connector's load copies (those it captures, or the ones a snapshot request named), and
    the named ones the source does not have."""
    wanted = conn.execute(sql.SQL("SELECT tables FROM {} WHERE connector = %s").format(
        _table(schema, "bulk_loads")), (connector.name,)).fetchone()[0]
    listed = [table for table in module_for(connector.type).tables_of(cur, connector) if captures(connector, table.name)]
    chosen, missing = select_tables(connector, wanted, [table.name for table in listed])
    return [table for table in listed if table.name in set(chosen)], missing


def tables_awaiting_creation(conn: psycopg.Connection, schema: str, connector: ConnectorConfig,
                             object_map: objmap.ObjectMap) -> list[str]:
    """The tables the connector's running load is to copy whose destination table does not exist yet, when its
    source creates them by its schema snapshot's events (MariaDB/MySQL: the engine's CREATE TABLE events, which the
    load waits for); [] when none, or for a load already planned."""
    source = module_for(connector.type)
    load_id = running_load(conn, schema, connector.name)
    if not source.DDL_EVENTS or load_id is None:
        return []
    if conn.execute(sql.SQL("SELECT 1 FROM {} WHERE connector = %s AND load_id = %s LIMIT 1").format(
            _table(schema, "bulk_load_tables")), (connector.name, load_id)).fetchone() is not None:
        return []
    with source.connect(connector) as source_conn, source_conn.cursor() as cur:
        listed, _ = _load_tables(conn, schema, connector, cur)
    targets = {table.name: object_map.table_name(table.name) for table in listed}
    existing = _existing_tables(conn, list(targets.values()))
    return [name for name, target in targets.items() if target not in existing]


def _existing_tables(conn: psycopg.Connection | psycopg.Cursor,
                     tables: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which of these destination tables (schema, name) exist, in one query."""
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM unnest(%s::text[], %s::text[]) AS t(nsp, rel) "
        "JOIN pg_namespace n ON n.nspname = t.nsp JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.rel "
        "AND c.relkind IN ('r', 'p')", ([schema for schema, _ in tables], [name for _, name in tables])).fetchall()
    return {(nsp, rel) for nsp, rel in rows}


def snapshot_positions(conn: psycopg.Connection, schema: str, connector: str) -> dict[str, dict[str, Any]]:
    """Per table read under one consistent snapshot (no key): that snapshot's binlog position. The stream skips
    the table's changes committed before it."""
    rows = conn.execute(sql.SQL(
        "SELECT source_table, snapshot_position FROM {} WHERE connector = %s AND done_at IS NOT NULL "
        "AND snapshot_position IS NOT NULL").format(_table(schema, "bulk_load_chunks")), (connector,)).fetchall()
    return {table: position for table, position in rows}


def read_progress(conn: psycopg.Connection, schema: str, connector: str | None = None,
                  tables: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Per table of each connector's latest load (or of its `tables` only): rows done, the estimate of all, chunks,
    rows/s and ETA."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql.SQL(
            """SELECT t.connector, t.source_table, t.estimated_rows, t.started_at, t.finished_at,
                      coalesce(sum(c.rows) FILTER (WHERE c.done_at IS NOT NULL), 0)::bigint AS rows_done,
                      count(c.id) FILTER (WHERE c.done_at IS NOT NULL) AS chunks_done, count(c.id) AS chunks_planned,
                      t.planned, extract(epoch FROM coalesce(t.finished_at, max(c.done_at)) - t.started_at)
                        AS seconds
               FROM {tables} t LEFT JOIN {chunks} c ON c.connector = t.connector AND c.source_table = t.source_table
               WHERE (%(connector)s::text IS NULL OR t.connector = %(connector)s)
                 AND (%(tables)s::text[] IS NULL OR t.source_table = ANY(%(tables)s))
               GROUP BY t.connector, t.source_table ORDER BY t.connector, t.source_table""").format(
            tables=_table(schema, "bulk_load_tables"), chunks=_table(schema, "bulk_load_chunks")),
            {"connector": connector, "tables": None if tables is None else list(tables)})
        rows = cur.fetchall()
    for row in rows:
        done, seconds = int(row["rows_done"]), float(row["seconds"] or 0)
        total = done if row["finished_at"] else max(int(row["estimated_rows"]), done)
        rate = done / seconds if seconds > 0 else 0.0
        row.update(rows_total=total, rows_per_second=round(rate, 1),
                   eta_seconds=None if row["finished_at"] or rate <= 0 else round((total - done) / rate, 1))
    return rows


def format_progress(row: dict[str, Any]) -> str:
    """`db.t: 150,000 / ~1,000,000 rows (15%), 180,000 rows/s, ETA 5 s` (or `done`)."""
    total, done = row["rows_total"], row["rows_done"]
    share = f" ({100 * done // total}%)" if total else ""
    tail = "done" if row["finished_at"] else (f"ETA {row['eta_seconds']:.0f} s" if row["eta_seconds"] is not None
                                              else "starting")
    return (f"{row['source_table']}: {done:,} / {'' if row['finished_at'] else '~'}{total:,} rows{share}, "
            f"{row['rows_per_second']:,.0f} rows/s, {tail}")


class BulkLoader:
    """Runs the connector's load: plans its tables and chunks and copies slices of chunks with Spark."""

    def __init__(self, conn: psycopg.Connection, connector: ConnectorConfig, destination: DestinationConfig,
                 spark: SparkSession, object_map: objmap.ObjectMap | None = None) -> None:
        self.conn = conn
        self.connector = connector
        self.destination = destination
        self.spark = spark
        self.object_map = object_map or objmap.ObjectMap(connector)
        self.schema = destination.control_schema
        self.source = module_for(connector.type)

    @property
    def slice_chunks(self) -> int:
        """Chunks per Spark job: four rounds of the cluster's parallelism, so every core has work and the gaps
        between jobs (the driver's bookkeeping, the next job's start) come seldom: 4% less load time than two rounds
        on 2 cores (docs/decisions.md)."""
        return 4 * max(2, self.spark.sparkContext.defaultParallelism)

    def run(self, deadline: float, halted: Callable[[], bool],
            on_rows: Callable[[int, int, float | None], None],
            on_index_seconds: Callable[[float], None] | None = None) -> bool:
        """Copies chunks until the load is done (True), or until `deadline` (monotonic) passes or `halted()` says
        so between two slices (False: the next run goes on from the chunks done). `on_rows(rows, zero_dates,
        first_copy_epoch)` hears of every slice copied, `on_index_seconds` how long primary keys were being made.

        A slice is the chunks of one table read in several, or the chunks of tables read as one together; the next
        slice is planned while the last is copied, and two slices of the latter are copied at once. A table's
        withheld primary key is made as soon as its last chunk is copied, beside the copy of the others; every one
        is made before the load is marked finished, so that no change of the stream meets a table without it."""
        name = self.connector.name
        load_id = running_load(self.conn, self.schema, name)
        if load_id is None:
            return True
        builds = key_builds.Builds(self.destination, name)
        with self.source.connect(self.connector) as source, source.cursor() as cur:
            slices = _Slices(self, on_rows, builds)
            try:
                tables = self._tables(cur, load_id)
                # Tables a run ended (or was killed) after finishing, before their primary key was made.
                slices.build_after_rows([table for table in tables if table.finished])
                todo = [table for table in tables if not table.finished]
                self._size_chunks(cur, todo)
                while True:
                    parts, changed = self._next_slice(cur, load_id, todo, slices)
                    if changed:
                        # The table's chunks being copied end first; its copy stops (see `_copy_again_later`).
                        slices.wait_all()
                        for table in changed:
                            self._copy_again_later(table)
                            if table in todo:
                                todo.remove(table)
                        continue
                    if not parts:
                        break
                    packed = _whole_table(parts[0].chunks[0])
                    slices.wait_until_fewer(SLICES_IN_FLIGHT if packed else 1)
                    if slices.started and (time.monotonic() >= deadline or halted()):
                        slices.wait_all()
                        log.info("%s: the bulk snapshot goes on in the next run (run budget spent or paused)", name)
                        return False
                    slices.start(parts)
                slices.wait_all()
                # Every table's, those that stopped copying (`_copy_again_later`) included.
                builds.submit(deferred_keys.waiting(self.conn, self.schema, name, deferred_keys.PRIMARY_KEY))
                builds.wait()
                self._finish_load(self.source.load_end_position(cur))
            finally:
                slices.abandon()
                builds.close()
                if builds.made:
                    log.info("%s: made the keys and indexes of %s in %.1f s (index phase)", name,
                             ", ".join(builds.made), builds.seconds)
                if on_index_seconds is not None and builds.seconds:
                    on_index_seconds(builds.seconds)
        return True

    def _next_slice(self, cur: Any, load_id: int, todo: list[TableLoad],
                    slices: "_Slices") -> tuple[list["_SlicePart"], list[TableLoad]]:
        """The next slice's chunks by table: the first table of `todo` read in several chunks gets a slice of its
        own (`slice_chunks` of them); tables read as one chunk share one (their chunks gathered in `todo`'s order,
        those of the same reading path, up to SMALL_CHUNKS_PER_SLICE_ROUND times `slice_chunks` chunks and the rows
        of `slice_chunks` full chunks, as estimated). Tables whose chunks are all copied or being copied leave
        `todo` (finished once their last slice ends). Or the tables whose definition changed since the load planned
        them (nothing else then)."""
        pack_chunks = self.slice_chunks * SMALL_CHUNKS_PER_SLICE_ROUND
        while todo:
            # A table whose columns or key changed since the load planned it would have its chunks read in a shape
            # the destination table does not have until the stream applies the change (a widened column's values do
            # not fit, a keyless table's new column is not read and its changes before the chunk are skipped, a table
            # that lost its key has its changes replayed onto rows the chunks copied). Those whose last chunks are
            # being copied are looked at too.
            candidates = todo[:pack_chunks]
            checked = candidates + [table for table in slices.awaiting_finish if table not in candidates]
            definitions = self._definitions(cur, checked)
            changed = [table for table in checked if table.source_definition is not None
                       and definitions[table.source_table].stored != table.source_definition]
            if changed:
                return [], changed
            parts: list[_SlicePart] = []
            rows_left = self.slice_chunks * self.connector.snapshot_chunk_rows
            direct: bool | None = None
            first_chunks = self._plan_first_chunks(cur, load_id, [table for table in candidates
                                                                  if table.next_lower is None and not table.planned])
            with self.conn.cursor() as dest:
                targets = destination_tables(dest, [(table.dest_schema, table.dest_table) for table in candidates])
            for table in candidates:
                if len(parts) >= pack_chunks or rows_left <= 0:
                    break
                # One chunk says whether the table is read whole (its first one just planned, or the next one).
                first = first_chunks.pop(table.source_table, None)
                chunks = [first] if first is not None else self._next_chunks(cur, load_id, table, slices.copying, 1)
                if not chunks:
                    todo.remove(table)
                    slices.finish_when_copied(table)
                    continue
                whole = _whole_table(chunks[0])
                if not whole:
                    if parts:
                        continue  # read in several chunks: in a slice of its own
                    chunks = self._next_chunks(cur, load_id, table, slices.copying, self.slice_chunks)
                columns = self._columns(cur, table, definitions[table.source_table].columns,
                                        targets.get((table.dest_schema, table.dest_table)))
                table_direct = self._copy_fields(columns) is not None
                if direct is not None and table_direct != direct:
                    continue  # read the other way: in a slice of its own
                if whole:
                    # Its share of a full chunk, in `snapshot_chunk_rows` rows (a table of wide rows weighs more).
                    weight = max(1, min(table.estimated_rows, table.chunk_rows)) * \
                        self.connector.snapshot_chunk_rows / max(1, table.chunk_rows)
                    if parts and weight > rows_left:
                        break
                    rows_left -= weight
                # Its last chunks (planned, and fewer than asked for): it leaves `todo`, finished once copied.
                last = whole or (table.planned and len(chunks) < self.slice_chunks)
                if last:
                    todo.remove(table)
                direct = table_direct
                parts.append(_SlicePart(table, columns, chunks, last))
                if not whole:
                    break
            if parts:
                return parts, []
        return [], []

    def _definitions(self, cur: Any, tables: Sequence[TableLoad]) -> dict[str, "_SourceDefinition"]:
        """The source's columns and key of each of these tables, read together per database (a table the source no
        longer has: no columns and no key)."""
        by_database: dict[str, list[str]] = {}
        for table in tables:
            by_database.setdefault(table.database, []).append(table.table)
        read = {f"{database}.{name}": _SourceDefinition(columns, key)
                for database, names in by_database.items()
                for name, (columns, key) in self.source.table_definitions(cur, database, names).items()}
        return {table.source_table: read.get(table.source_table, _SourceDefinition([], [])) for table in tables}

    def _tables(self, cur: Any, load_id: int) -> list[TableLoad]:
        """The load's tables; planned on its first run: listed, their keys and secondary indexes read, emptied
        (one transaction; the source's and the destination's catalogs read once for all of them)."""
        tables = self._read_tables(load_id)
        if tables:
            self._copy_parted_again(tables)
            return tables
        listed, missing = _load_tables(self.conn, self.schema, self.connector, cur)
        if missing:
            raise CdcError(f"the bulk snapshot asked for tables the source does not have: {', '.join(missing)}",
                           connector=self.connector.name)
        loads = [TableLoad(table.name, *self.object_map.table_name(table.name), [], table.estimated_rows, None,
                           False, False) for table in listed]
        definitions = self._definitions(cur, loads)
        indexes = self._source_indexes(cur, loads)
        with self.conn.transaction(), self.conn.cursor() as dest:
            existing = _existing_tables(dest, [(table.dest_schema, table.dest_table) for table in loads])
            for table in loads:
                definition = definitions[table.source_table]
                if not self.source.DDL_EVENTS:
                    # A source without DDL events: its catalog makes the destination table match, as the value
                    # schema of the table's first change would.
                    ensure_table_matches(
                        dest, self.connector, table.dest_schema, table.dest_table,
                        field_specs_of(definition.columns, definition.key), source_table=table.source_table,
                        object_map=self.object_map,
                        on_change=lambda wanted: rule_store.record_columns(dest, self.schema, self.connector.name,
                                                                           wanted))
                elif (table.dest_schema, table.dest_table) not in existing and not unseen_tables.creates_tables(
                        self.connector):
                    raise CdcError(f"the destination table {table.dest_schema}.{table.dest_table} does not exist (a "
                                   "table the connector's schema snapshot did not see: take a new snapshot of every "
                                   f"table, cdc-pipeline restart {self.connector.name} always)",
                                   connector=self.connector.name, table=table.source_table)
                if not definition.key:
                    self.source.require_snapshot_position(cur, self.connector, table.source_table)
            unmade = [table.source_table for table in loads if (table.dest_schema, table.dest_table) not in existing]
            if self.source.DDL_EVENTS and unmade:
                # Tables the stream never created (their database came to match, or they were added to `tables`).
                unseen_tables.create_tables(dest, self.schema, self.connector, self.object_map, self.spark._jvm, cur,
                                            unmade)
            if loads:
                # Emptied for their copy: only by the connector that writes them.
                rule_store.claim_tables(dest, self.schema, self.connector.name,
                                        [(table.dest_schema, table.dest_table, table.source_table) for table in loads])
                dest.execute(sql.SQL("TRUNCATE TABLE {}").format(sql.SQL(", ").join(
                    _table(table.dest_schema, table.dest_table) for table in loads)))
                self._withhold(dest, loads, indexes)
                dest.executemany(sql.SQL(
                    """INSERT INTO {} (connector, load_id, source_table, dest_schema, dest_table, key_columns,
                                       estimated_rows, source_definition)
                       VALUES (%s, %s, %s, %s, %s, %s, %s, %s)""").format(_table(self.schema, "bulk_load_tables")),
                    [(self.connector.name, load_id, table.source_table, table.dest_schema, table.dest_table,
                      definitions[table.source_table].key, table.estimated_rows,
                      json.dumps(definitions[table.source_table].stored)) for table in loads])
        log.info("%s: bulk snapshot of %d tables: %s", self.connector.name, len(listed),
                 ", ".join(table.name for table in listed) or "none")
        return self._read_tables(load_id)

    def _copy_parted_again(self, tables: Sequence[TableLoad]) -> None:
        """Begins again the copy of each table without a key whose parts (`_ctid_split`) an earlier run left copied
        in part (killed, or a task failed): its parts copied were read under one snapshot, the others would be read
        under another, and a row moved from one part to another meanwhile would be copied twice or not at all. Its
        copied rows go (from the table and from the connector's counts) and its parts are planned again."""
        keyless = [table.source_table for table in tables if not table.key_columns and not table.finished]
        if not keyless:
            return
        chunks = _table(self.schema, "bulk_load_chunks")
        with self.conn.transaction(), self.conn.cursor() as dest:
            parted = dest.execute(sql.SQL(
                """SELECT source_table, coalesce(sum(rows), 0) FROM {} WHERE connector = %s AND source_table = ANY(%s)
                   GROUP BY source_table
                   HAVING count(*) > 1 AND count(done_at) BETWEEN 1 AND count(*) - 1""").format(chunks),
                (self.connector.name, keyless)).fetchall()
            if not parted:
                return
            again = {source_table: int(rows) for source_table, rows in parted}
            restarted = [table for table in tables if table.source_table in again]
            dest.execute(sql.SQL("DELETE FROM {} WHERE connector = %s AND source_table = ANY(%s)").format(chunks),
                         (self.connector.name, list(again)))
            dest.execute(sql.SQL("UPDATE {} SET next_lower = NULL, planned = false WHERE connector = %s "
                                 "AND source_table = ANY(%s)").format(_table(self.schema, "bulk_load_tables")),
                         (self.connector.name, list(again)))
            dest.execute(sql.SQL("TRUNCATE TABLE {}").format(sql.SQL(", ").join(
                _table(table.dest_schema, table.dest_table) for table in restarted)))
            dest.execute(sql.SQL("UPDATE {} SET events = events - %s, snapshot_rows = snapshot_rows - %s "
                                 "WHERE connector = %s").format(_table(self.schema, "stats")),
                         (sum(again.values()), sum(again.values()), self.connector.name))
        for table in restarted:
            table.next_lower, table.planned = None, False
            log.warning("%s: %s (no key) was copied in part under one snapshot by an earlier run: it is copied again "
                        "from its first part", self.connector.name, table.source_table)

    def _withhold(self, dest: psycopg.Cursor, tables: Sequence[TableLoad],
                  source_indexes: dict[str, list[tuple[str, SourceIndex]]]) -> None:
        """Withholds the tables' constraints across rows and their indexes (`deferred_keys.withhold`) where they
        have any: every unique key, exclusion constraint and foreign key, while a small table (fewer than
        KEEP_INDEXES_BELOW_ROWS rows estimated) with no such constraint keeps its other indexes. Then the primary
        keys of the tables not small (`deferred_keys.withhold_primary_key`; a small table's is cheaper kept up than
        made again), once no foreign key of a loaded table references them. The source's `source_indexes` (by
        source table) are recorded to be made with the primary key, a small table's made now
        (`deferred_keys.plan_source_indexes`). One query tells which tables have what."""
        rows = dest.execute(
            """SELECT t.nsp, t.rel,
                      EXISTS (SELECT 1 FROM pg_constraint con WHERE con.conrelid = c.oid AND con.contype = ANY(%s))
                      OR EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = c.oid AND NOT x.indisprimary
                                 AND x.indisunique),
                      EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = c.oid AND NOT x.indisprimary),
                      EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = c.oid AND x.indisprimary)
               FROM unnest(%s::text[], %s::text[]) AS t(nsp, rel) JOIN pg_namespace n ON n.nspname = t.nsp
               JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.rel""",
            (list(deferred_keys._ACROSS_ROWS), [table.dest_schema for table in tables],
             [table.dest_table for table in tables])).fetchall()
        held = {(nsp, rel): (across_rows, indexes, primary) for nsp, rel, across_rows, indexes, primary in rows}
        keyed = []
        for table in tables:
            across_rows, indexes, primary = held.get((table.dest_schema, table.dest_table), (False, False, False))
            large = table.estimated_rows >= KEEP_INDEXES_BELOW_ROWS
            if across_rows or (indexes and large):
                deferred_keys.withhold(dest, self.schema, self.connector.name, table.dest_schema, table.dest_table)
            if primary and large:
                keyed.append(table)
        for table in keyed:
            deferred_keys.withhold_primary_key(dest, self.schema, self.connector.name, table.dest_schema,
                                               table.dest_table)
        for table in tables:
            deferred_keys.plan_source_indexes(dest, self.schema, self.connector.name, table.dest_schema,
                                              table.dest_table, source_indexes.get(table.source_table, []),
                                              build_now=table.estimated_rows < KEEP_INDEXES_BELOW_ROWS)

    def _source_indexes(self, cur: Any, tables: Sequence[TableLoad]) -> dict[str, list[tuple[str, SourceIndex]]]:
        """The source's secondary indexes of each table (by source table) the destination can have, each with
        its destination name (`<table>_<index>_idx`) and its columns' destination names; the others are logged."""
        by_database: dict[str, list[TableLoad]] = {}
        for table in tables:
            by_database.setdefault(table.database, []).append(table)
        indexes: dict[str, list[tuple[str, SourceIndex]]] = {}
        for database, loads in by_database.items():
            dest_tables = {table.table: table for table in loads}
            for index in self.source.secondary_indexes(cur, database, list(dest_tables)):
                table = dest_tables[index.table]
                if index.skipped is not None:
                    log.warning("%s: the source's index %s of %s is not built on the destination: %s",
                                self.connector.name, index.name, table.source_table, index.skipped)
                    continue
                columns = tuple(replace(column, name=self.object_map.column_name(table.source_table, column.name))
                                for column in index.columns)
                name = table_scoped_name(table.dest_table, dest_identifier(index.name, self.connector.letter_casing),
                                         "idx")
                indexes.setdefault(table.source_table, []).append((name, replace(index, columns=columns)))
        return indexes

    def _read_tables(self, load_id: int) -> list[TableLoad]:
        rows = self.conn.execute(sql.SQL(
            """SELECT source_table, dest_schema, dest_table, key_columns, estimated_rows, next_lower, planned,
                      finished_at IS NOT NULL, source_definition FROM {} WHERE connector = %s AND load_id = %s
               ORDER BY source_table""").format(
            _table(self.schema, "bulk_load_tables")), (self.connector.name, load_id)).fetchall()
        return [TableLoad(*row[:4], int(row[4]), row[5], row[6], row[7], row[8]) for row in rows]

    def _copy_again_later(self, table: TableLoad) -> None:
        """Stops copying a table whose definition changed: it is copied again, in a new load of its own, once the
        stream has applied the change (see `reconcile`)."""
        with self.conn.transaction():
            self.conn.execute(sql.SQL("DELETE FROM {} WHERE connector = %s AND source_table = %s AND done_at IS NULL")
                              .format(_table(self.schema, "bulk_load_chunks")),
                              (self.connector.name, table.source_table))
            self.conn.execute(sql.SQL("UPDATE {} SET finished_at = now(), copy_again = true WHERE connector = %s "
                                      "AND source_table = %s").format(_table(self.schema, "bulk_load_tables")),
                              (self.connector.name, table.source_table))
        table.finished = True
        log.warning("%s: %s changed on the source during the bulk snapshot (its columns or key): its copy stops here "
                    "and it is copied again once the stream has applied the change", self.connector.name,
                    table.source_table)

    def _columns(self, cur: Any, table: TableLoad, source_columns: Sequence[Any] | None = None,
                 existing: DestinationTable | None = None) -> list[BulkColumn]:
        """The source columns (`source_columns`, else read now) that the destination table (`existing`, else read
        now) has (by the mapping rules), with the type each is written as. A column the source added or dropped
        during the load is left to the stream's DDL."""
        if existing is None:
            with self.conn.cursor() as dest:
                existing = destination_table(dest, table.dest_schema, table.dest_table)
        if existing is None:
            raise CdcError(f"the destination table {table.dest_schema}.{table.dest_table} no longer exists",
                           connector=self.connector.name, table=table.source_table)
        if source_columns is None:
            source_columns = self.source.list_columns(cur, table.database, table.table)
        columns = []
        for column in source_columns:
            dest_name = self.object_map.column_name(table.source_table, column.name)
            if dest_name in existing.columns:
                columns.append(BulkColumn(column, dest_name, input_type(existing, dest_name)))
        return columns

    def _size_chunks(self, cur: Any, tables: Sequence[TableLoad]) -> None:
        """Sets each table's average row size and rows per chunk (`chunk_rows`: about CHUNK_BYTES a chunk, at most
        `snapshot_chunk_rows`); the source's row sizes read once per database."""
        sizes: dict[str, int] = {}
        for database in {table.database for table in tables}:
            sizes.update((listed.name, listed.average_row_bytes) for listed in self.source.list_tables(cur, database))
        for table in tables:
            table.row_bytes = sizes.get(table.source_table, 0)
            table.chunk_rows = chunk_rows(table.row_bytes, self.connector.snapshot_chunk_rows)

    def _next_chunks(self, cur: Any, load_id: int, table: TableLoad, copying: Sequence[int] = (),
                     limit: int | None = None) -> list[Chunk]:
        """The table's next chunks not done (nor being copied: `copying`), at most `limit` (`slice_chunks`), planning
        more (and keeping them) when too few are planned."""
        limit = self.slice_chunks if limit is None else limit
        # A table with no chunk planned yet has none pending.
        chunks = [] if table.next_lower is None and not table.planned else self._pending_chunks(table, copying, limit)
        if len(chunks) >= limit or table.planned:
            return chunks
        with self.conn.transaction(), self.conn.cursor() as dest:
            while len(chunks) < limit and not table.planned:
                lower = table.next_lower
                upper = self.source.next_chunk_start(cur, table.database, table.table, table.key_columns, lower,
                                                     table.chunk_rows) if table.key_columns else None
                dest.execute(sql.SQL(
                    """INSERT INTO {} (connector, load_id, source_table, lower_bound, upper_bound)
                       VALUES (%s, %s, %s, %s, %s) RETURNING id""").format(_table(self.schema, "bulk_load_chunks")),
                    (self.connector.name, load_id, table.source_table, _json(lower), _json(upper)))
                chunks.append(Chunk(int(dest.fetchone()[0]), lower, upper))
                table.next_lower, table.planned = upper, upper is None
            dest.execute(sql.SQL("UPDATE {} SET next_lower = %s, planned = %s WHERE connector = %s "
                                 "AND source_table = %s").format(_table(self.schema, "bulk_load_tables")),
                         (_json(table.next_lower), table.planned, self.connector.name, table.source_table))
        return chunks

    def _plan_first_chunks(self, cur: Any, load_id: int, tables: Sequence[TableLoad]) -> dict[str, Chunk]:
        """Plans the first chunk of each of these tables (none planned yet), kept in one destination transaction;
        returns them by table. A table without a key that a source can cut by where its rows are stored
        (`ctid_split`) has all its parts planned at once: at most a slice of them, copied together under one
        snapshot."""
        if not tables:
            return {}
        bounds: list[list[tuple[list[Any] | None, list[Any] | None]]] = []
        for table in tables:
            if table.key_columns:
                bounds.append([(None, self.source.next_chunk_start(cur, table.database, table.table,
                                                                   table.key_columns, None, table.chunk_rows))])
                continue
            cuts = self._ctid_split(cur, table)
            edges: list[list[Any] | None] = [None, *([cut] for cut in cuts), None]
            bounds.append(list(zip(edges, edges[1:])))
        names = [table.source_table for table, parts in zip(tables, bounds) for _ in parts]
        lowers = [_json(lower) for parts in bounds for lower, _ in parts]
        uppers = [_json(upper) for parts in bounds for _, upper in parts]
        # A table is planned once its last chunk is (its upper bound NULL), and goes on from that upper bound.
        next_lowers = [_json(None if len(parts) > 1 else parts[-1][1]) for parts in bounds]
        with self.conn.transaction(), self.conn.cursor() as dest:
            dest.execute(sql.SQL(
                """INSERT INTO {} (connector, load_id, source_table, lower_bound, upper_bound)
                   SELECT %s, %s, t.source_table, t.lower_bound, t.upper_bound
                   FROM unnest(%s::text[], %s::jsonb[], %s::jsonb[]) WITH ORDINALITY AS t(source_table, lower_bound,
                                                                                         upper_bound, n)
                   ORDER BY t.n RETURNING id, source_table""").format(_table(self.schema, "bulk_load_chunks")),
                (self.connector.name, load_id, names, lowers, uppers))
            ids: dict[str, int] = {}
            for chunk_id, source_table in dest.fetchall():
                ids[source_table] = min(int(chunk_id), ids.get(source_table, int(chunk_id)))
            dest.execute(sql.SQL(
                """UPDATE {} AS b SET next_lower = t.next_lower, planned = t.next_lower IS NULL
                   FROM unnest(%s::text[], %s::jsonb[]) AS t(source_table, next_lower)
                   WHERE b.connector = %s AND b.source_table = t.source_table""").format(
                _table(self.schema, "bulk_load_tables")), ([table.source_table for table in tables], next_lowers,
                                                            self.connector.name))
        first = {}
        for table, parts in zip(tables, bounds):
            table.next_lower = None if len(parts) > 1 else parts[-1][1]
            table.planned = table.next_lower is None
            first[table.source_table] = Chunk(ids[table.source_table], *parts[0])
        return first

    def _ctid_split(self, cur: Any, table: TableLoad) -> list[Any]:
        """Where a table without a key is cut (`ctid_split`: at most a slice of parts, each of about a chunk's rows
        by the table's average row size, PART_BYTES_AT_LEAST at least), or nothing: one chunk, read under its own
        snapshot."""
        split = getattr(self.source, "ctid_split", None)
        if split is None:
            return []
        part_bytes = min(CHUNK_BYTES, table.chunk_rows * table.row_bytes) if table.row_bytes else CHUNK_BYTES
        part_bytes = max(PART_BYTES_AT_LEAST, part_bytes)
        return split(cur, table.database, table.table, part_bytes, self.slice_chunks)

    def _pending_chunks(self, table: TableLoad, copying: Sequence[int] = (), limit: int | None = None) -> list[Chunk]:
        rows = self.conn.execute(sql.SQL(
            "SELECT id, lower_bound, upper_bound FROM {} WHERE connector = %s AND source_table = %s "
            "AND done_at IS NULL AND id <> ALL(%s) ORDER BY id LIMIT %s").format(
                _table(self.schema, "bulk_load_chunks")),
            (self.connector.name, table.source_table, list(copying),
             self.slice_chunks if limit is None else limit)).fetchall()
        return [Chunk(int(row[0]), row[1], row[2]) for row in rows]

    def _copied(self, chunks: Sequence[int]) -> tuple[int, int, float | None]:
        """The rows copied chunks wrote, their zero dates written as NULL, and when the first of their copies began
        (done_at: when each chunk's transaction began; the first of a run's is its first row moved)."""
        done = self.conn.execute(sql.SQL("SELECT coalesce(sum(rows), 0), coalesce(sum(zero_dates), 0), "
                                         "extract(epoch FROM min(done_at))::float8 FROM {} "
                                         "WHERE id = ANY(%s)").format(_table(self.schema, "bulk_load_chunks")),
                                 (list(chunks),)).fetchone()
        return int(done[0]), int(done[1]), done[2]

    def _copy_error(self, table: TableLoad, exc: Py4JJavaError) -> CdcError:
        return CdcError(f"the bulk snapshot of {table.source_table} into {table.dest_schema}.{table.dest_table} "
                        f"failed: {_root_message(exc.java_exception)}", connector=self.connector.name,
                        table=table.source_table)

    def _copy_fields(self, columns: list[BulkColumn]) -> list[tuple[str, int]] | None:
        """How the source selects each column as a value the runner's SourceChunkCopier writes as a COPY text field
        (`copy_field_sql`), or as its own COPY writes it (`copy_out_column`: the kind is then unused); None where a
        column needs Spark (`_lines`)."""
        copy_out = getattr(self.source, "copy_out_column", None)
        if copy_out is not None:
            return [(copy_out(column.source, column.pg_type), copy_text.FIELD_PLAIN) for column in columns] or None
        field_sql = getattr(self.source, "copy_field_sql", None)
        fields = [field_sql(column.source, column.pg_type) for column in columns] if field_sql else []
        if not columns or not fields or any(field is None for field in fields):
            return None
        return fields

    def _source_copier(self, parts: Sequence["_SlicePart"], snapshot: str | None = None) -> tuple[Any, Any] | None:
        """The Spark job's input and writer of a slice whose tasks read the source themselves (the runner's
        SourceChunkCopier): where the source selects every column as a value the writer makes a COPY text field, a
        task runs its chunks' SELECTs over the source's JDBC driver and writes the rows, no per-row expression in
        the source nor Spark row between; a PostgreSQL source's chunks are its own COPY text, piped into the
        destination's COPY (`copy_out_query`), the parts of a table without a key under the exported `snapshot`
        (`_SliceCopy`). None where a column needs Spark (`_lines`)."""
        copy_out = getattr(self.source, "copy_out_query", None)
        queries, positions, kinds, fetch_sizes = [], [], [], []
        for part in parts:
            fields = self._copy_fields(part.columns)
            if fields is None:
                return None
            table = part.table
            select = f"SELECT {', '.join(render for render, _ in fields)} FROM " \
                     f"{self.source.qualified(table.database, table.table)}"
            for chunk in part.chunks:
                if table.key_columns:
                    predicate = self.source.chunk_predicate(table.key_columns, chunk.lower, chunk.upper)
                    query = f"{select} WHERE {predicate}"
                    positions.append(None)
                else:
                    # One chunk under its own consistent snapshot, or a part of the table under the slice's.
                    query = select if _whole_table(chunk) else \
                        f"{select} WHERE {self.source.ctid_predicate(chunk.lower, chunk.upper)}"
                    positions.append(self.source.snapshot_position_select(_POSITION_ALIAS, []))
                queries.append(copy_out(query) if copy_out else query)
                kinds.append([kind for _, kind in fields])
                fetch_sizes.append(table.fetch_rows)
        session = [self.source.SESSION_INIT] if self.source.SESSION_INIT else []
        plan = {"sessionStatements": session, "positionSql": positions, "chunkQueries": queries, "kinds": kinds,
                "fetchSizes": fetch_sizes, "copyOut": copy_out is not None,
                "snapshotStatement": self.source.import_snapshot(snapshot) if snapshot
                else self.source.COPY_SNAPSHOT if copy_out else self.source.CONSISTENT_SNAPSHOT}
        copier_class = getattr(self.spark._jvm, f"{JAVA_PACKAGE}.SourceChunkCopier")
        copier = copier_class.fromJson(self._writer(parts), self.source.JDBC_DRIVER,
                                       self.source.jdbc_url(self.connector), self.connector.user,
                                       self.connector.password.reveal(), json.dumps(plan))
        # A slice of tables read whole: a task per core copies its share in turn (a connection to each side per
        # task, not per chunk); else a task per chunk.
        partitions = self.slice_chunks // 4 if _whole_table(parts[0].chunks[0]) else len(queries)
        return copier_class.chunks(self.spark.sparkContext._jsc, len(queries), partitions), copier

    def _read(self, table: TableLoad, renders: list[str], selected: list[str],
              chunks: list[Chunk]) -> tuple[DataFrame, Column]:
        """The source's rows of these chunks as `renders` select them (named `selected`), one partition per chunk,
        and the column of a chunk's position: a table without a key is one chunk read under a consistent snapshot,
        whose first row carries the snapshot's binlog position and NULL data columns; the others have none."""
        source = self.source.qualified(table.database, table.table)
        properties = {"user": self.connector.user, "password": self.connector.password.reveal(),
                      "driver": self.source.JDBC_DRIVER, "fetchsize": str(table.fetch_rows)}
        if self.source.SESSION_INIT:
            properties["sessionInitStatement"] = self.source.SESSION_INIT
        url = self.source.jdbc_url(self.connector)
        if table.key_columns:
            keys = ", ".join(map(self.source.quote, table.key_columns))
            query = f"(SELECT {keys}, {', '.join(renders)} FROM {source}) AS src"
            predicates = [self.source.chunk_predicate(table.key_columns, chunk.lower, chunk.upper) for chunk in chunks]
            return (self.spark.read.jdbc(url, query, predicates=predicates, properties=properties),
                    F.lit(None).cast("string"))
        query = (f"({self.source.snapshot_position_select(_POSITION_ALIAS, selected)} UNION ALL "
                 f"SELECT NULL, {', '.join(renders)} FROM {source}) AS src")
        frame = self.spark.read.jdbc(url, query, properties={**properties,
                                                             "sessionInitStatement": self.source.CONSISTENT_SNAPSHOT})
        return frame, F.col(_POSITION_ALIAS)

    def _lines(self, table: TableLoad, columns: list[BulkColumn], chunks: list[Chunk]) -> DataFrame:
        """The chunks as a DataFrame of COPY lines (with the position and the zero dates written as NULL, see
        `_read`), one partition per chunk in order.

        Where the source can render a column's whole COPY text field (`copy_text_sql`), it does, and Spark takes
        the field as it is; when it can render every column, it renders the whole line. Other columns are rendered
        as text by the source (`select_text`) and turned into COPY text by Spark (`column_text`)."""
        aliases = [f"_cdc_{i}" for i in range(len(columns))]
        fields = [self.source.copy_text_sql(column.source, column.pg_type) for column in columns]
        whole_lines = bool(columns) and all(field is not None for field in fields)
        if whole_lines:
            renders = [f"{self.source.copy_line_sql(fields)} AS {_LINE_ALIAS}"]
        else:
            renders = [f"{field or self.source.select_text(column.source, column.pg_type)} AS {alias}"
                       for column, alias, field in zip(columns, aliases, fields)]
        frame, position = self._read(table, renders, [_LINE_ALIAS] if whole_lines else aliases, chunks)
        if whole_lines:
            line = F.col(_LINE_ALIAS)
            zero_dates = F.lit(0)  # only a TIMESTAMP column has zero dates counted, and Spark renders those
        else:
            line = F.concat_ws("\t", *[
                F.col(alias) if field is not None else self.source.column_text(F.col(alias), column.source,
                                                                               column.pg_type)
                for alias, column, field in zip(aliases, columns, fields)])
            zero_dates = self.source.zero_dates({column.source.name: F.col(alias)
                                                 for alias, column in zip(aliases, columns)},
                                                [column.source for column in columns])
        if not table.key_columns:
            line = F.when(F.col(_POSITION_ALIAS).isNull(), line)
        return frame.select(line.alias("line"), position.alias("position"), zero_dates.alias("zero_dates"))

    def _writer(self, parts: Sequence["_SlicePart"]) -> Any:
        """The runner's ChunkCopyWriter of these tables' chunks: it writes a partition's COPY lines (`_lines`) in
        its chunk's transaction, which `SourceChunkCopier` runs too."""
        url, user, password = jdbc_target(self.destination)
        chunks_table = _table(self.schema, "bulk_load_chunks")
        claim = sql.SQL("UPDATE {} SET done_at = now() WHERE id = ? AND done_at IS NULL").format(chunks_table)
        finish = sql.SQL(
            """WITH chunk AS (UPDATE {chunks} SET rows = ?, zero_dates = ?, snapshot_position = CAST(? AS jsonb)
                              WHERE id = ? RETURNING rows, zero_dates)
               INSERT INTO {stats} AS s (connector, events, snapshot_rows, zero_dates, first_applied_at,
                                         last_applied_at)
               SELECT {connector}, rows, rows, zero_dates, now(), now() FROM chunk
               ON CONFLICT (connector) DO UPDATE SET events = s.events + EXCLUDED.events,
                 snapshot_rows = s.snapshot_rows + EXCLUDED.snapshot_rows,
                 zero_dates = s.zero_dates + EXCLUDED.zero_dates,
                 first_applied_at = coalesce(s.first_applied_at, now()), last_applied_at = now()""").format(
            chunks=chunks_table, stats=_table(self.schema, "stats"), connector=sql.Literal(self.connector.name))
        plan: dict[str, Any] = {"chunkIds": [], "tableOfChunk": [], "claimSql": self._text(claim),
                                "beforeCopy": [], "copySql": [], "afterCopy": [], "finishSql": self._text(finish)}
        for i, part in enumerate(parts):
            before, copy, after = copy_statements(self.object_map, part.table, part.columns)
            plan["beforeCopy"].append([self._text(statement) for statement in before])
            plan["copySql"].append(self._text(copy))
            plan["afterCopy"].append([self._text(statement) for statement in after])
            plan["chunkIds"].extend(chunk.id for chunk in part.chunks)
            plan["tableOfChunk"].extend([i] * len(part.chunks))
        # One JSON text, not a py4j call per array element.
        return getattr(self.spark._jvm, f"{JAVA_PACKAGE}.ChunkCopyWriter").fromJson(url, user, password,
                                                                                   json.dumps(plan))

    def _text(self, statement: sql.Composable) -> str:
        return statement.as_string(self.conn)

    def repair_lines(self, cur: Any, table: TableLoad, chunks: list[Chunk]) -> tuple[list[BulkColumn], DataFrame]:
        """The table's columns and the COPY lines of these key ranges, read as a load reads them (verify's repair)."""
        columns = self._columns(cur, table)
        self._size_chunks(cur, [table])
        return columns, self._lines(table, columns, chunks)

    def _finish_tables(self, tables: Sequence[TableLoad], logged: Sequence[TableLoad] = ()) -> None:
        """Marks these tables finished, and logs the progress of them and of `logged` (one query)."""
        if tables:
            self.conn.execute(sql.SQL("UPDATE {} SET finished_at = now() WHERE connector = %s "
                                      "AND source_table = ANY(%s) AND finished_at IS NULL").format(
                _table(self.schema, "bulk_load_tables")),
                (self.connector.name, [table.source_table for table in tables]))
        for table in tables:
            table.finished = True
        names = sorted({table.source_table for table in (*tables, *logged)})
        if names:
            for row in read_progress(self.conn, self.schema, self.connector.name, names):
                log.info("%s: bulk snapshot %s", self.connector.name, format_progress(row))

    def _finish_load(self, end_position: dict[str, Any]) -> None:
        """Marks the load finished at `end_position`, the source's position after its last chunk was read. Until
        the stream has passed it the tables may hold rows of different moments: a load that withheld no
        constraint and has no table to copy again is reconciled at once."""
        name = self.connector.name
        with self.conn.transaction():
            waits = self.conn.execute(sql.SQL(
                "SELECT EXISTS (SELECT 1 FROM {} WHERE connector = %s) OR EXISTS (SELECT 1 FROM {} "
                "WHERE connector = %s AND copy_again)").format(
                _table(self.schema, "deferred_constraints"), _table(self.schema, "bulk_load_tables")),
                (name, name)).fetchone()[0]
            self.conn.execute(sql.SQL(
                "UPDATE {} SET finished_at = now(), end_position = %s, reconciled_at = CASE WHEN %s THEN NULL "
                "ELSE now() END WHERE connector = %s").format(_table(self.schema, "bulk_loads")),
                (json.dumps(end_position), waits, name))
            self.conn.execute(sql.SQL("UPDATE {} SET snapshot_ended_at = now() WHERE connector = %s").format(
                _table(self.schema, "stats")), (self.connector.name,))
        log.info("%s: bulk snapshot done", self.connector.name)


@dataclass
class _SlicePart:
    """A table's chunks in a slice, and the columns they copy."""

    table: TableLoad
    columns: list[BulkColumn]
    chunks: list[Chunk]
    last: bool = False  # the table has no chunk left to copy after these


@dataclass
class _SourceDefinition:
    """A source table's columns and the key its chunks are cut by, as the load read them."""

    columns: list[Any]  # the source module's SourceColumn
    key: list[str]

    @property
    def stored(self) -> dict[str, Any]:
        """What `cdc.bulk_load_tables.source_definition` keeps of it: the columns' names, types and nullability,
        and the key."""
        return {"columns": [[column.name, column.column_type, column.nullable] for column in self.columns],
                "key": self.key}


def _id_ranges(ids: Sequence[int]) -> str:
    """Ids as ranges: `3-7, 9`."""
    ranges: list[list[int]] = []
    for number in sorted(ids):
        if ranges and number == ranges[-1][1] + 1:
            ranges[-1][1] = number
        else:
            ranges.append([number, number])
    return ", ".join(str(low) if low == high else f"{low}-{high}" for low, high in ranges)


class _SliceCopy:
    """One Spark job copying a slice of chunks (read in parallel, each COPYed in its own transaction), run from a
    thread of its own so that the driver plans the next slice meanwhile; the driver's connection is used by the
    calling thread only."""

    def __init__(self, loader: BulkLoader, parts: list[_SlicePart]) -> None:
        self.loader, self.parts = loader, parts
        self.ids = [chunk.id for part in parts for chunk in part.chunks]
        # The parts of a table without a key are read under one snapshot, exported by a session held until they
        # are copied.
        split = any(not part.table.key_columns and not _whole_table(chunk) for part in parts for chunk in part.chunks)
        self._exporter, snapshot = loader.source.export_snapshot(loader.connector) if split else (None, None)
        try:
            direct = loader._source_copier(parts, snapshot)
            if direct is None and split:
                raise CdcError(f"the bulk snapshot cannot read {parts[0].table.source_table} in parts: it has no "
                               "column the destination table has", connector=loader.connector.name,
                               table=parts[0].table.source_table)
            if direct is not None:
                self._rdd, writer = direct
            else:
                lines = reduce(DataFrame.union, [loader._lines(part.table, part.columns, part.chunks)
                                                 for part in parts])
                writer = loader._writer(parts)
                # Spark's internal rows, not Row objects: the writer copies each line's UTF-8 bytes as they are. A
                # union keeps its inputs' partitions in order: one a chunk, as the writer numbers them.
                self._rdd = lines._jdf.queryExecution().toRdd().toJavaRDD()
            self._error: BaseException | None = None
            self._thread = threading.Thread(target=self._copy, args=(writer,), name="bulk-slice", daemon=True)
            self._thread.start()
        except BaseException:
            # The copy never started: the session holding its snapshot ends here (else `_copy` ends it).
            self._end_snapshot()
            raise

    def _copy(self, writer: Any) -> None:
        try:
            # Named in Spark (its UI, its status tracker) by connector, in this thread's jobs only.
            tables = len(self.parts)
            self.loader.spark.sparkContext.setJobGroup(
                slice_job_group(self.loader.connector.name),
                f"bulk snapshot: {len(self.ids)} chunks of {tables} table{'s' if tables > 1 else ''}")
            names = ", ".join(part.table.source_table for part in self.parts[:5]) + (", ..." if tables > 5 else "")
            with working_on(f"the bulk load copied chunks {_id_ranges(self.ids)} (control table bulk_load_chunks) "
                            f"of {names}"):
                self._rdd.foreachPartition(writer)
        except BaseException as exc:  # noqa: BLE001 - raised by result(), in the driver's thread
            self._error = exc
        finally:
            self._end_snapshot()

    def _end_snapshot(self) -> None:
        if self._exporter is not None:
            self._exporter.close()
            self._exporter = None

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> tuple[int, int, float | None]:
        """Waits for the copy; returns what `BulkLoader._copied` says of its chunks, or raises its failure."""
        self._thread.join()
        if isinstance(self._error, Py4JJavaError):
            raise self.loader._copy_error(self._failed_table(self._error), self._error) from None
        if self._error is not None:
            raise self._error
        return self.loader._copied(self.ids)

    def _failed_table(self, error: Py4JJavaError) -> TableLoad:
        """The table of the chunk the writer's error names (the slice's first when it names none)."""
        chunk = _root_message(error.java_exception).partition(":")[0]
        for part in self.parts:
            if any(chunk == f"chunk {c.id}" for c in part.chunks):
                return part.table
        return self.parts[0].table


class _Slices:
    """The slices being copied, oldest first: each one's rows reported (`on_rows`) once it ends, and the tables
    whose last chunks it held finished then, their withheld primary keys made (`builds`) beside the next slices."""

    def __init__(self, loader: BulkLoader, on_rows: Callable[[int, int, float | None], None],
                 builds: key_builds.Builds) -> None:
        self.loader, self.on_rows, self.builds = loader, on_rows, builds
        self.running: deque[_SliceCopy] = deque()
        self.started = False
        self._copied_last: dict[str, TableLoad] = {}  # tables with every chunk dispatched, by name

    @property
    def awaiting_finish(self) -> list[TableLoad]:
        """The tables whose last chunks are being copied."""
        return list(self._copied_last.values())

    @property
    def copying(self) -> list[int]:
        return [chunk_id for copy in self.running for chunk_id in copy.ids]

    def start(self, parts: list[_SlicePart]) -> None:
        self.running.append(_SliceCopy(self.loader, parts))
        self.started = True
        for part in parts:
            if part.last:
                self.finish_when_copied(part.table)

    def finish_when_copied(self, table: TableLoad) -> None:
        """The table has no chunk left to copy: it is finished once no slice being copied holds its chunks."""
        if self._holding(table):
            self._copied_last[table.source_table] = table
        else:
            self.loader._finish_tables([table])
            self.build_after_rows([table])

    def build_after_rows(self, tables: Sequence[TableLoad]) -> None:
        """Begins making the withheld primary keys and the source's secondary indexes of these tables, whose every
        chunk is copied."""
        if tables:
            loader = self.loader
            self.builds.submit(deferred_keys.waiting(
                loader.conn, loader.schema, loader.connector.name, deferred_keys.AFTER_ROWS,
                [(table.dest_schema, table.dest_table) for table in tables]))

    def wait_until_fewer(self, count: int) -> None:
        while len(self.running) >= count:
            self._wait_oldest()

    def wait_all(self) -> None:
        self.wait_until_fewer(1)

    def abandon(self) -> None:
        """Waits for the slices still copied, reporting nothing (the run is failing)."""
        while self.running:
            self.running.popleft().wait()

    def _wait_oldest(self) -> None:
        copy = self.running[0]
        self.on_rows(*copy.result())
        self.running.popleft()
        tables = [part.table for part in copy.parts]
        done = [self._copied_last.pop(table.source_table) for table in tables
                if table.source_table in self._copied_last and not self._holding(table)]
        self.loader._finish_tables(done, logged=tables)
        faults.pause_point(faults.BULK_SLICE)
        self.build_after_rows(done)

    def _holding(self, table: TableLoad) -> bool:
        return any(part.table.source_table == table.source_table for copy in self.running for part in copy.parts)


def _whole_table(chunk: Chunk) -> bool:
    """Whether the chunk is its table's only one (a small table, or one without a key)."""
    return chunk.lower is None and chunk.upper is None


def slice_job_group(connector: str) -> str:
    """The Spark job group of the connector's bulk snapshot jobs (one a slice)."""
    return f"cdc-bulk-snapshot:{connector}"


def copy_statements(object_map: objmap.ObjectMap, table: TableLoad, columns: list[BulkColumn]) -> tuple[
        list[sql.Composable], sql.Composable, list[sql.Composable]]:
    """What writes a chunk's COPY lines into the table: the statements before the COPY, the COPY, and those after it
    (a column with a transform: the lines go to a staging table, and an INSERT applies the transforms)."""
    target = _table(table.dest_schema, table.dest_table)
    names = [column.dest_name for column in columns]
    plans, transforms = object_map.transforms(table.source_table, [_column_plan(column) for column in columns])
    before: list[sql.Composable] = []
    after: list[sql.Composable] = []
    into = target
    if transforms:
        into = sql.Identifier(_STAGING)
        before.append(staging_table_sql(into, target, names, transforms))
        values = transform_sql.staged_values(plans, transforms, "s")
        after.append(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} AS s").format(
            target, sql.SQL(", ").join(map(sql.Identifier, names)),
            sql.SQL(", ").join(values[name] for name in names), into))
    return before, sql.SQL("COPY {} ({}) FROM STDIN").format(into, sql.SQL(", ").join(map(sql.Identifier, names))), after


def input_type(existing: DestinationTable, column: str) -> str:
    """The type whose text form a column receives: a domain over a built-in type takes its base type's."""
    column_type = existing.types.get(column)
    if column_type is not None and column_type.user_defined and column_type.builtin:
        return column_type.base
    return existing.columns[column]


def _column_plan(column: BulkColumn) -> ColumnPlan:
    """The column as the mapping rules' transforms see it (geometry is told by its logical type)."""
    geometry = column.source.data_type in mariadb.GEOMETRY_TYPES
    spec = FieldSpec(name=column.source.name, type="struct" if geometry else "string",
                     logical=_GEOMETRY_LOGICAL if geometry else None, parameters={}, optional=True)
    return ColumnPlan(source_name=column.source.name, dest_name=column.dest_name, pg_type=column.pg_type, spec=spec,
                      convert=lambda value, spec, pg_type: value)


def _root_message(error: Any) -> str:
    """The innermost message of a Java exception chain (the source's or the destination's own words), with the
    chunk the writer names when it names one."""
    chunk = ""
    messages = []
    while error is not None:
        message = str(error.getMessage() or error.toString())
        if message.startswith("chunk ") and not chunk:
            chunk = message.split(":", 1)[0] + ": "
        messages.append(message)
        error = error.getCause()
    return chunk + messages[-1].strip().splitlines()[0]


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)

