"""How a load cuts its tables into chunks, and which chunks it copies next: a chunk's rows by the source's average
row size (about CHUNK_BYTES, `snapshot_chunk_rows` at most) and the JDBC fetch of its reads; a table with a key cut
by its key (the source finds each boundary by an index range scan), one without a key read whole or cut where its
rows are stored (`ctid_split`); the chunks planned kept in the control schema (`cdc.bulk_load_chunks`, and where a
table goes on from in `cdc.bulk_load_tables`), so that the next run goes on with those not done. `TableLoad` and
`Chunk` are a load's tables and chunks as the control schema keeps them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import psycopg
from psycopg import sql

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.bulk_load.bookkeeping import table_sql

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# A chunk holds at most about this many bytes of source rows (the catalog's average row size, large values stored
# apart included), however many rows `snapshot_chunk_rows` allows, and at least one row: a chunk is one Spark task and
# one destination transaction, the unit a failure copies again and the progress counts; its rows stream through, so
# its size does not bound memory (the fetch below does). Rows of up to about 1.3 KB keep `snapshot_chunk_rows`.
CHUNK_BYTES = 64 << 20
# A part of a table without a key (`ChunkPlanner._ctid_split`) holds at least this much of its heap: each part costs a
# task, a source session and the import of the slice's snapshot, more than copying a few hundred KB.
PART_BYTES_AT_LEAST = 1 << 20
# The source's JDBC driver holds one fetch of rows at a time: at most FETCH_SIZE rows, and about FETCH_BYTES of them
# (by the same average; one row at least, however large).
FETCH_BYTES = 16 << 20
FETCH_SIZE = 10_000


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
    chunk_rows: int = 0  # this run's rows per chunk (`ChunkPlanner.size_chunks`)
    row_bytes: int = 0  # the source's average row size, 0 when unknown (`ChunkPlanner.size_chunks`)

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


def chunk_rows(row_bytes: int, limit: int) -> int:
    """Rows per chunk of a table whose rows average `row_bytes` (0: unknown): `limit` (`snapshot_chunk_rows`), fewer
    for wide rows (about CHUNK_BYTES a chunk), one at least."""
    return min(limit, max(1, CHUNK_BYTES // row_bytes)) if row_bytes > 0 else limit


def fetch_rows(row_bytes: int) -> int:
    """The JDBC fetch size for rows averaging `row_bytes` (0: unknown): about FETCH_BYTES of them, between one row
    and FETCH_SIZE rows."""
    return min(FETCH_SIZE, max(1, FETCH_BYTES // row_bytes)) if row_bytes > 0 else FETCH_SIZE


def whole_table(chunk: Chunk) -> bool:
    """Whether the chunk is its table's only one (a small table, or one without a key)."""
    return chunk.lower is None and chunk.upper is None


def chunks_per_slice(spark: SparkSession) -> int:
    """Chunks per Spark job: four rounds of the cluster's parallelism, so every core has work and the gaps between
    jobs (the driver's bookkeeping, the next job's start) come seldom: 4% less load time than two rounds on 2 cores
    (docs/decisions.md)."""
    return 4 * max(2, spark.sparkContext.defaultParallelism)


class ChunkPlanner:
    """Plans the chunks of a connector's load, kept in the control schema `schema`, and hands out the next ones not
    done; `source` is the connector type's source module."""

    def __init__(self, conn: psycopg.Connection, connector: ConnectorConfig, schema: str, source: Any,
                 spark: SparkSession) -> None:
        self.conn = conn
        self.connector = connector
        self.schema = schema
        self.source = source
        self.spark = spark

    def size_chunks(self, cur: Any, tables: Sequence[TableLoad]) -> None:
        """Sets each table's average row size and rows per chunk (`chunk_rows`: about CHUNK_BYTES a chunk, at most
        `snapshot_chunk_rows`); the source's row sizes read once per database."""
        sizes: dict[str, int] = {}
        for database in {table.database for table in tables}:
            sizes.update((listed.name, listed.average_row_bytes) for listed in self.source.list_tables(cur, database))
        for table in tables:
            table.row_bytes = sizes.get(table.source_table, 0)
            table.chunk_rows = chunk_rows(table.row_bytes, self.connector.snapshot_chunk_rows)

    def next_chunks(self, cur: Any, load_id: int, table: TableLoad, copying: Sequence[int] = (),
                    limit: int | None = None) -> list[Chunk]:
        """The table's next chunks not done (nor being copied: `copying`), at most `limit` (`chunks_per_slice`),
        planning more (and keeping them) when too few are planned."""
        limit = chunks_per_slice(self.spark) if limit is None else limit
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
                       VALUES (%s, %s, %s, %s, %s) RETURNING id""").format(table_sql(self.schema, "bulk_load_chunks")),
                    (self.connector.name, load_id, table.source_table, _json(lower), _json(upper)))
                chunks.append(Chunk(int(dest.fetchone()[0]), lower, upper))
                table.next_lower, table.planned = upper, upper is None
            dest.execute(sql.SQL("UPDATE {} SET next_lower = %s, planned = %s WHERE connector = %s "
                                 "AND source_table = %s").format(table_sql(self.schema, "bulk_load_tables")),
                         (_json(table.next_lower), table.planned, self.connector.name, table.source_table))
        return chunks

    def plan_first_chunks(self, cur: Any, load_id: int, tables: Sequence[TableLoad]) -> dict[str, Chunk]:
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
                   ORDER BY t.n RETURNING id, source_table""").format(table_sql(self.schema, "bulk_load_chunks")),
                (self.connector.name, load_id, names, lowers, uppers))
            ids: dict[str, int] = {}
            for chunk_id, source_table in dest.fetchall():
                ids[source_table] = min(int(chunk_id), ids.get(source_table, int(chunk_id)))
            dest.execute(sql.SQL(
                """UPDATE {} AS b SET next_lower = t.next_lower, planned = t.next_lower IS NULL
                   FROM unnest(%s::text[], %s::jsonb[]) AS t(source_table, next_lower)
                   WHERE b.connector = %s AND b.source_table = t.source_table""").format(
                table_sql(self.schema, "bulk_load_tables")), ([table.source_table for table in tables], next_lowers,
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
        split = self.source.ctid_split
        if split is None:
            return []
        part_bytes = min(CHUNK_BYTES, table.chunk_rows * table.row_bytes) if table.row_bytes else CHUNK_BYTES
        part_bytes = max(PART_BYTES_AT_LEAST, part_bytes)
        return split(cur, table.database, table.table, part_bytes, chunks_per_slice(self.spark))

    def _pending_chunks(self, table: TableLoad, copying: Sequence[int] = (), limit: int | None = None) -> list[Chunk]:
        rows = self.conn.execute(sql.SQL(
            "SELECT id, lower_bound, upper_bound FROM {} WHERE connector = %s AND source_table = %s "
            "AND done_at IS NULL AND id <> ALL(%s) ORDER BY id LIMIT %s").format(
                table_sql(self.schema, "bulk_load_chunks")),
            (self.connector.name, table.source_table, list(copying),
             chunks_per_slice(self.spark) if limit is None else limit)).fetchall()
        return [Chunk(int(row[0]), row[1], row[2]) for row in rows]


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)
