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
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from py4j.protocol import Py4JJavaError
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_pipeline import faults

from cdc_pipeline.mapping import objmap, rule_store, transform_sql
from cdc_pipeline.sink import deferred_keys
from cdc_pipeline.sink.apply import staging_table_sql
from cdc_pipeline.catalog import DestinationTable, destination_table
from cdc_pipeline.config import ConnectorConfig, DestinationConfig
from cdc_pipeline.convert.dml import ColumnPlan
from cdc_pipeline.errors import CdcError
from cdc_pipeline.decode.events import FieldSpec
from cdc_pipeline.capture.runner import JAVA_PACKAGE, java_class, jdbc_target
from cdc_pipeline.convert.schema_infer import ensure_table_matches, field_specs_of
from cdc_pipeline.sources import captures, mariadb, module_for

log = logging.getLogger(__name__)

# A chunk holds at most about this many bytes of source rows (InnoDB's average row size), however many rows
# `snapshot_chunk_rows` allows: a chunk's rows pass through one Spark task and one transaction.
CHUNK_BYTES = 256 << 20
MIN_CHUNK_ROWS = 1_000
FETCH_SIZE = 10_000
_STAGING = "_cdc_bulk_staging"
_POSITION_ALIAS = "_cdc_position"
_LINE_ALIAS = "_cdc_line"
_GEOMETRY_LOGICAL = "io.debezium.data.geometry.Geometry"


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
        for name in ("bulk_load_tables", "bulk_load_chunks"):
            cur.execute(sql.SQL("DELETE FROM {} WHERE connector = %s AND (%s::text[] IS NULL OR "
                                "source_table = ANY(%s))").format(_table(schema, name)), (connector, tables, tables))
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


def reconcile(conn: psycopg.Connection, schema: str, connector: str, position: Any = None) -> list[str]:
    """The stream has applied past the finished load's end (`position`, where it is): every row now shows the
    source at one moment. Makes the withheld constraints and indexes again, and begins a load of the tables whose
    definition changed during this one (the stream has applied that change to them); returns those tables."""
    deferred_keys.restore(conn, schema, connector, position)
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
    listed = [table for table in module_for(connector.type).tables_of(cur, connector)
              if captures(connector, table.name) and (wanted is None or table.name in wanted)]
    return listed, sorted(set(wanted or ()) - {table.name for table in listed})


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
    with conn.cursor() as dest:
        return [table.name for table in listed if destination_table(dest, *object_map.table_name(table.name)) is None]


def snapshot_positions(conn: psycopg.Connection, schema: str, connector: str) -> dict[str, dict[str, Any]]:
    """Per table read under one consistent snapshot (no key): that snapshot's binlog position. The stream skips
    the table's changes committed before it."""
    rows = conn.execute(sql.SQL(
        "SELECT source_table, snapshot_position FROM {} WHERE connector = %s AND done_at IS NOT NULL "
        "AND snapshot_position IS NOT NULL").format(_table(schema, "bulk_load_chunks")), (connector,)).fetchall()
    return {table: position for table, position in rows}


def read_progress(conn: psycopg.Connection, schema: str, connector: str | None = None) -> list[dict[str, Any]]:
    """Per table of each connector's latest load: rows done, the estimate of all, chunks, rows/s and ETA."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql.SQL(
            """SELECT t.connector, t.source_table, t.estimated_rows, t.started_at, t.finished_at,
                      coalesce(sum(c.rows) FILTER (WHERE c.done_at IS NOT NULL), 0)::bigint AS rows_done,
                      count(c.id) FILTER (WHERE c.done_at IS NOT NULL) AS chunks_done, count(c.id) AS chunks_planned,
                      t.planned, extract(epoch FROM coalesce(t.finished_at, max(c.done_at)) - t.started_at)
                        AS seconds
               FROM {tables} t LEFT JOIN {chunks} c ON c.connector = t.connector AND c.source_table = t.source_table
               WHERE %(connector)s::text IS NULL OR t.connector = %(connector)s
               GROUP BY t.connector, t.source_table ORDER BY t.connector, t.source_table""").format(
            tables=_table(schema, "bulk_load_tables"), chunks=_table(schema, "bulk_load_chunks")),
            {"connector": connector})
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
            on_rows: Callable[[int, int, float | None], None]) -> bool:
        """Copies chunks until the load is done (True), or until `deadline` (monotonic) passes or `halted()` says
        so between two slices (False: the next run goes on from the chunks done). `on_rows(rows, zero_dates,
        first_copy_epoch)`
        hears of every slice copied."""
        name = self.connector.name
        load_id = running_load(self.conn, self.schema, name)
        if load_id is None:
            return True
        copied = False  # a run copies one slice at least, whatever its budget
        running: _SliceCopy | None = None
        with self.source.connect(self.connector) as source, source.cursor() as cur:
            try:
                for table in self._tables(cur, load_id):
                    if table.finished:
                        continue
                    columns = self._columns(cur, table)
                    while True:
                        # The next slice is looked at and planned while the last one is copied (its chunks are not
                        # done yet, so they are left out); nothing is changed until that copy ended.
                        changed = self._definition_changed(cur, table)
                        chunks = [] if changed else self._next_chunks(cur, load_id, table,
                                                                      running.ids if running else ())
                        if running is not None:
                            on_rows(*running.result())
                            running = None
                            copied = True
                            self._log_progress(table)
                            faults.pause_point(faults.BULK_SLICE)
                        if changed:
                            self._copy_again_later(table)
                            break
                        if not chunks:
                            self._finish_table(table)
                            break
                        if copied and (time.monotonic() >= deadline or halted()):
                            log.info("%s: the bulk snapshot goes on in the next run (run budget spent or paused)", name)
                            return False
                        running = _SliceCopy(self, table, columns, chunks)
                self._finish_load(self.source.load_end_position(cur))
            finally:
                if running is not None:
                    running.wait()
        return True

    def _tables(self, cur: Any, load_id: int) -> list[TableLoad]:
        """The load's tables; planned on its first run: listed, their keys read, emptied (one transaction)."""
        tables = self._read_tables(load_id)
        if tables:
            return tables
        listed, missing = _load_tables(self.conn, self.schema, self.connector, cur)
        if missing:
            raise CdcError(f"the bulk snapshot asked for tables the source does not have: {', '.join(missing)}",
                           connector=self.connector.name)
        with self.conn.transaction(), self.conn.cursor() as dest:
            for table in listed:
                database, _, name = table.name.partition(".")
                dest_schema, dest_name = self.object_map.table_name(table.name)
                if not self.source.DDL_EVENTS:
                    # A source without DDL events: its catalog makes the destination table match, as the value
                    # schema of the table's first change would.
                    specs = field_specs_of(self.source.list_columns(cur, database, name),
                                           self.source.chunk_key(cur, database, name))
                    ensure_table_matches(
                        dest, self.connector, dest_schema, dest_name, specs,
                        source_table=table.name, object_map=self.object_map,
                        on_change=lambda wanted: rule_store.record_columns(dest, self.schema, self.connector.name,
                                                                       wanted))
                elif destination_table(dest, dest_schema, dest_name) is None:
                    raise CdcError(f"the destination table {dest_schema}.{dest_name} does not exist (a table the "
                                   "connector's schema snapshot did not see: take a new snapshot of every table, "
                                   f"cdc-pipeline restart {self.connector.name} always)",
                                   connector=self.connector.name, table=table.name)
                definition = self._source_definition(cur, database, name)
                if not definition["key"]:
                    self.source.require_snapshot_position(cur, self.connector, table.name)
                # Emptied for its copy: only by the connector that writes it.
                rule_store.claim_table(dest, self.schema, self.connector.name, dest_schema, dest_name, table.name)
                dest.execute(sql.SQL("TRUNCATE TABLE {}").format(_table(dest_schema, dest_name)))
                deferred_keys.withhold(dest, self.schema, self.connector.name, dest_schema, dest_name)
                dest.execute(sql.SQL(
                    """INSERT INTO {} (connector, load_id, source_table, dest_schema, dest_table, key_columns,
                                       estimated_rows, source_definition)
                       VALUES (%s, %s, %s, %s, %s, %s, %s, %s)""").format(
                    _table(self.schema, "bulk_load_tables")),
                    (self.connector.name, load_id, table.name, dest_schema, dest_name, definition["key"],
                     table.estimated_rows, json.dumps(definition)))
        log.info("%s: bulk snapshot of %d tables: %s", self.connector.name, len(listed),
                 ", ".join(table.name for table in listed) or "none")
        return self._read_tables(load_id)

    def _read_tables(self, load_id: int) -> list[TableLoad]:
        rows = self.conn.execute(sql.SQL(
            """SELECT source_table, dest_schema, dest_table, key_columns, estimated_rows, next_lower, planned,
                      finished_at IS NOT NULL, source_definition FROM {} WHERE connector = %s AND load_id = %s
               ORDER BY source_table""").format(
            _table(self.schema, "bulk_load_tables")), (self.connector.name, load_id)).fetchall()
        return [TableLoad(*row[:4], int(row[4]), row[5], row[6], row[7], row[8]) for row in rows]

    def _source_definition(self, cur: Any, database: str, name: str) -> dict[str, Any]:
        """The source table's columns (name, type, nullability) and the key its chunks are cut by."""
        return {"columns": [[column.name, column.column_type, column.nullable]
                            for column in self.source.list_columns(cur, database, name)],
                "key": self.source.chunk_key(cur, database, name)}

    def _definition_changed(self, cur: Any, table: TableLoad) -> bool:
        """Whether the source table's columns or key changed since the load planned it. The chunks not copied yet
        would then be read in a shape the destination table does not have until the stream applies the change
        (a widened column's values do not fit, a keyless table's new column is not read and its changes before the
        chunk are skipped, a table that lost its key has its changes replayed onto rows the chunks copied)."""
        if table.source_definition is None:
            return False
        return self._source_definition(cur, table.database, table.table) != table.source_definition

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

    def _columns(self, cur: Any, table: TableLoad) -> list[BulkColumn]:
        """The source columns that the destination table has (by the mapping rules), with the type each is
        written as. A column the source added or dropped during the load is left to the stream's DDL."""
        with self.conn.cursor() as dest:
            existing = destination_table(dest, table.dest_schema, table.dest_table)
        if existing is None:
            raise CdcError(f"the destination table {table.dest_schema}.{table.dest_table} no longer exists",
                           connector=self.connector.name, table=table.source_table)
        columns = []
        for column in self.source.list_columns(cur, table.database, table.table):
            dest_name = self.object_map.column_name(table.source_table, column.name)
            if dest_name in existing.columns:
                columns.append(BulkColumn(column, dest_name, input_type(existing, dest_name)))
        return columns

    def _chunk_rows(self, cur: Any, table: TableLoad) -> int:
        """`snapshot_chunk_rows`, fewer for wide rows (at most about CHUNK_BYTES a chunk)."""
        average = next((t.average_row_bytes for t in self.source.list_tables(cur, table.database, table.table)), 0)
        rows = self.connector.snapshot_chunk_rows
        return min(rows, max(MIN_CHUNK_ROWS, CHUNK_BYTES // average)) if average else rows

    def _next_chunks(self, cur: Any, load_id: int, table: TableLoad, copying: Sequence[int] = ()) -> list[Chunk]:
        """The next slice of chunks not done (nor being copied: `copying`), planning more (and keeping them) when
        too few are planned."""
        chunks = self._pending_chunks(table, copying)
        if len(chunks) >= self.slice_chunks or table.planned:
            return chunks
        chunk_rows = self._chunk_rows(cur, table)
        with self.conn.transaction(), self.conn.cursor() as dest:
            while len(chunks) < self.slice_chunks and not table.planned:
                lower = table.next_lower
                upper = self.source.next_chunk_start(cur, table.database, table.table, table.key_columns, lower,
                                                 chunk_rows) if table.key_columns else None
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

    def _pending_chunks(self, table: TableLoad, copying: Sequence[int] = ()) -> list[Chunk]:
        rows = self.conn.execute(sql.SQL(
            "SELECT id, lower_bound, upper_bound FROM {} WHERE connector = %s AND source_table = %s "
            "AND done_at IS NULL AND id <> ALL(%s) ORDER BY id LIMIT %s").format(
                _table(self.schema, "bulk_load_chunks")),
            (self.connector.name, table.source_table, list(copying), self.slice_chunks)).fetchall()
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

    def _source_copier(self, table: TableLoad, columns: list[BulkColumn], chunks: list[Chunk]) -> Any | None:
        """The Spark job's input and writer of a slice whose tasks read the source themselves (the runner's
        SourceChunkCopier): where the source selects every column as a value the writer makes a COPY text field
        (`copy_field_sql`), a task runs its chunk's SELECT over the source's JDBC driver and writes the rows, no
        per-row expression in the source nor Spark row between. None where a column needs Spark (`_lines`)."""
        field_sql = getattr(self.source, "copy_field_sql", None)
        fields = [field_sql(column.source, column.pg_type) for column in columns] if field_sql else []
        if not columns or not fields or any(field is None for field in fields):
            return None
        select = f"SELECT {', '.join(render for render, _ in fields)} FROM " \
                 f"{self.source.qualified(table.database, table.table)}"
        session = [self.source.SESSION_INIT] if self.source.SESSION_INIT else []
        position = None
        if table.key_columns:
            queries = [f"{select} WHERE {self.source.chunk_predicate(table.key_columns, chunk.lower, chunk.upper)}"
                       for chunk in chunks]
        else:
            queries = [select] * len(chunks)  # one chunk, under its own consistent snapshot
            session.append(self.source.CONSISTENT_SNAPSHOT)
            position = self.source.snapshot_position_select(_POSITION_ALIAS, [])
        jvm: Any = self.spark._jvm
        gateway: Any = self.spark.sparkContext._gateway
        kinds = gateway.new_array(jvm.int, len(fields))
        for i, (_, kind) in enumerate(fields):
            kinds[i] = kind
        copier = getattr(jvm, f"{JAVA_PACKAGE}.SourceChunkCopier")(
            self._writer(table, columns, chunks), self.source.JDBC_DRIVER,
            self.source.jdbc_url(self.connector), self.connector.user, self.connector.password.reveal(),
            self._array(session), position, self._array(queries), kinds, FETCH_SIZE)
        return getattr(jvm, f"{JAVA_PACKAGE}.SourceChunkCopier").chunks(self.spark.sparkContext._jsc,
                                                                          len(chunks)), copier

    def _read(self, table: TableLoad, renders: list[str], selected: list[str],
              chunks: list[Chunk]) -> tuple[DataFrame, Column]:
        """The source's rows of these chunks as `renders` select them (named `selected`), one partition per chunk,
        and the column of a chunk's position: a table without a key is one chunk read under a consistent snapshot,
        whose first row carries the snapshot's binlog position and NULL data columns; the others have none."""
        source = self.source.qualified(table.database, table.table)
        properties = {"user": self.connector.user, "password": self.connector.password.reveal(),
                      "driver": self.source.JDBC_DRIVER, "fetchsize": str(FETCH_SIZE)}
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

    def _writer(self, table: TableLoad, columns: list[BulkColumn], chunks: list[Chunk]) -> Any:
        """The runner's ChunkCopyWriter of these chunks: it writes a partition's COPY lines (`_lines`) in its
        chunk's transaction, which `SourceChunkCopier` runs too."""
        jvm: Any = self.spark._jvm
        gateway: Any = self.spark.sparkContext._gateway
        url, user, password = jdbc_target(self.destination)
        chunks_table = _table(self.schema, "bulk_load_chunks")
        before, copy, after = copy_statements(self.object_map, table, columns)
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
        chunk_ids = gateway.new_array(jvm.long, len(chunks))
        for i, chunk in enumerate(chunks):
            chunk_ids[i] = chunk.id
        return getattr(jvm, f"{JAVA_PACKAGE}.ChunkCopyWriter")(
            url, user, password, chunk_ids, self._text(claim), self._strings(before), self._text(copy),
            self._strings(after), self._text(finish))

    def _text(self, statement: sql.Composable) -> str:
        return statement.as_string(self.conn)

    def _strings(self, statements: list[sql.Composable]) -> Any:
        return self._array([self._text(statement) for statement in statements])

    def _array(self, texts: list[str]) -> Any:
        gateway: Any = self.spark.sparkContext._gateway
        array = gateway.new_array(java_class(self.spark._jvm, "java.lang.String"), len(texts))
        for i, text in enumerate(texts):
            array[i] = text
        return array

    def repair_lines(self, cur: Any, table: TableLoad, chunks: list[Chunk]) -> tuple[list[BulkColumn], DataFrame]:
        """The table's columns and the COPY lines of these key ranges, read as a load reads them (verify's repair)."""
        columns = self._columns(cur, table)
        return columns, self._lines(table, columns, chunks)

    def _finish_table(self, table: TableLoad) -> None:
        self.conn.execute(sql.SQL("UPDATE {} SET finished_at = now() WHERE connector = %s AND source_table = %s "
                                  "AND finished_at IS NULL").format(_table(self.schema, "bulk_load_tables")),
                          (self.connector.name, table.source_table))
        table.finished = True
        self._log_progress(table)

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

    def _log_progress(self, table: TableLoad) -> None:
        for row in read_progress(self.conn, self.schema, self.connector.name):
            if row["source_table"] == table.source_table:
                log.info("%s: bulk snapshot %s", self.connector.name, format_progress(row))


class _SliceCopy:
    """One Spark job copying a slice of chunks (read in parallel, each COPYed in its own transaction), run from a
    thread of its own so that the driver plans the next slice meanwhile; the driver's connection is used by the
    calling thread only."""

    def __init__(self, loader: BulkLoader, table: TableLoad, columns: list[BulkColumn], chunks: list[Chunk]) -> None:
        self.loader, self.table = loader, table
        self.ids = [chunk.id for chunk in chunks]
        direct = loader._source_copier(table, columns, chunks)
        if direct is not None:
            self._rdd, writer = direct
        else:
            lines = loader._lines(table, columns, chunks)
            writer = loader._writer(table, columns, chunks)
            # Spark's internal rows, not Row objects: the writer copies each line's UTF-8 bytes as they are.
            self._rdd = lines._jdf.queryExecution().toRdd().toJavaRDD()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._copy, args=(writer,), name="bulk-slice", daemon=True)
        self._thread.start()

    def _copy(self, writer: Any) -> None:
        try:
            self._rdd.foreachPartition(writer)
        except BaseException as exc:  # noqa: BLE001 - raised by result(), in the driver's thread
            self._error = exc

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> tuple[int, int, float | None]:
        """Waits for the copy; returns what `BulkLoader._copied` says of its chunks, or raises its failure."""
        self._thread.join()
        if isinstance(self._error, Py4JJavaError):
            raise self.loader._copy_error(self.table, self._error) from None
        if self._error is not None:
            raise self._error
        return self.loader._copied(self.ids)


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

