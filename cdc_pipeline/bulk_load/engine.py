"""The conductor of a bulk load (`BulkLoader`): on the load's first run it plans its tables (listed, their destination
tables emptied, constraints and indexes withheld, source definitions kept), then copies slices of chunks (`slices`), cut
as `chunk_plan` plans and read and written as `copy_plan` says, until every table is copied or the run's budget is
spent. A table whose definition changes during its copy stops and is copied again once the stream has applied the
change; a table's withheld primary key is made once its last chunk is copied, every one before the load ends. Why the
destination ends exact: the package's docstring."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import psycopg
from psycopg import sql
from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, SparkSession

from cdc_pipeline.mapping import objmap, rule_store
from cdc_pipeline.sink import deferred_keys, key_builds, unseen_tables
from cdc_pipeline.catalog import destination_tables
from cdc_pipeline.config import ConnectorConfig, DestinationConfig, dest_identifier
from cdc_pipeline.convert.ddl import table_scoped_name
from cdc_pipeline.errors import CdcError
from cdc_pipeline.convert.schema_infer import ensure_table_matches, field_specs_of
from cdc_pipeline.sources import module_for
from cdc_pipeline.sources.source_index import SourceIndex
from cdc_pipeline.bulk_load.bookkeeping import (existing_tables, format_progress, load_tables, read_progress,
                                                running_load, table_sql)
from cdc_pipeline.bulk_load.chunk_plan import Chunk, ChunkPlanner, TableLoad, chunks_per_slice, whole_table
from cdc_pipeline.bulk_load.copy_plan import BulkColumn, CopyPlanner, SlicePart
from cdc_pipeline.bulk_load.slices import Slices, root_message

log = logging.getLogger(__name__)

# A table read as one chunk (a small one, or one without a key) shares a Spark job with other such tables, up to this
# many times `slice_chunks` chunks a job (and the rows of a slice of full chunks, as estimated), and such jobs run
# two at a time: a job's start and end, and the driver's bookkeeping, cost more than a small chunk's copy.
SMALL_CHUNKS_PER_SLICE_ROUND = 4
SLICES_IN_FLIGHT = 2
# A table estimated below this many rows keeps its indexes other than its keys through its load: building an index
# again after the data costs a statement and a scan of the table, more than keeping it up for a few rows.
KEEP_INDEXES_BELOW_ROWS = 10_000


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
        self.chunk_plan = ChunkPlanner(conn, connector, self.schema, self.source, spark)
        self.copy_plan = CopyPlanner(conn, connector, destination, spark, self.object_map, self.source)

    @property
    def slice_chunks(self) -> int:
        """Chunks per Spark job (`chunk_plan.chunks_per_slice`)."""
        return chunks_per_slice(self.spark)

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
            slices = Slices(self, on_rows, builds)
            try:
                tables = self._tables(cur, load_id)
                # Tables a run ended (or was killed) after finishing, before their primary key was made.
                slices.build_after_rows([table for table in tables if table.finished])
                todo = [table for table in tables if not table.finished]
                self.chunk_plan.size_chunks(cur, todo)
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
                    packed = whole_table(parts[0].chunks[0])
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
                    slices: Slices) -> tuple[list[SlicePart], list[TableLoad]]:
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
            parts: list[SlicePart] = []
            rows_left = self.slice_chunks * self.connector.snapshot_chunk_rows
            direct: bool | None = None
            first_chunks = self.chunk_plan.plan_first_chunks(cur, load_id, [
                table for table in candidates if table.next_lower is None and not table.planned])
            with self.conn.cursor() as dest:
                targets = destination_tables(dest, [(table.dest_schema, table.dest_table) for table in candidates])
            for table in candidates:
                if len(parts) >= pack_chunks or rows_left <= 0:
                    break
                # One chunk says whether the table is read whole (its first one just planned, or the next one).
                first = first_chunks.pop(table.source_table, None)
                chunks = [first] if first is not None else self.chunk_plan.next_chunks(cur, load_id, table,
                                                                                       slices.copying, 1)
                if not chunks:
                    todo.remove(table)
                    slices.finish_when_copied(table)
                    continue
                whole = whole_table(chunks[0])
                if not whole:
                    if parts:
                        continue  # read in several chunks: in a slice of its own
                    chunks = self.chunk_plan.next_chunks(cur, load_id, table, slices.copying, self.slice_chunks)
                columns = self.copy_plan.columns(cur, table, definitions[table.source_table].columns,
                                                 targets.get((table.dest_schema, table.dest_table)))
                table_direct = self.copy_plan.copy_fields(columns) is not None
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
                parts.append(SlicePart(table, columns, chunks, last))
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
        listed, missing = load_tables(self.conn, self.schema, self.connector, cur)
        if missing:
            raise CdcError(f"the bulk snapshot asked for tables the source does not have: {', '.join(missing)}",
                           connector=self.connector.name)
        loads = [TableLoad(table.name, *self.object_map.table_name(table.name), [], table.estimated_rows, None,
                           False, False) for table in listed]
        definitions = self._definitions(cur, loads)
        indexes = self._source_indexes(cur, loads)
        with self.conn.transaction(), self.conn.cursor() as dest:
            existing = existing_tables(dest, [(table.dest_schema, table.dest_table) for table in loads])
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
                    table_sql(table.dest_schema, table.dest_table) for table in loads)))
                self._withhold(dest, loads, indexes)
                dest.executemany(sql.SQL(
                    """INSERT INTO {} (connector, load_id, source_table, dest_schema, dest_table, key_columns,
                                       estimated_rows, source_definition)
                       VALUES (%s, %s, %s, %s, %s, %s, %s, %s)""").format(table_sql(self.schema, "bulk_load_tables")),
                    [(self.connector.name, load_id, table.source_table, table.dest_schema, table.dest_table,
                      definitions[table.source_table].key, table.estimated_rows,
                      json.dumps(definitions[table.source_table].stored)) for table in loads])
        log.info("%s: bulk snapshot of %d tables: %s", self.connector.name, len(listed),
                 ", ".join(table.name for table in listed) or "none")
        return self._read_tables(load_id)

    def _copy_parted_again(self, tables: Sequence[TableLoad]) -> None:
        """Begins again the copy of each table without a key whose parts (`ChunkPlanner._ctid_split`) an earlier run
        left copied in part (killed, or a task failed): its parts copied were read under one snapshot, the others
        would be read under another, and a row moved from one part to another meanwhile would be copied twice or not
        at all. Its copied rows go (from the table and from the connector's counts) and its parts are planned
        again."""
        keyless = [table.source_table for table in tables if not table.key_columns and not table.finished]
        if not keyless:
            return
        chunks = table_sql(self.schema, "bulk_load_chunks")
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
                                 "AND source_table = ANY(%s)").format(table_sql(self.schema, "bulk_load_tables")),
                         (self.connector.name, list(again)))
            dest.execute(sql.SQL("TRUNCATE TABLE {}").format(sql.SQL(", ").join(
                table_sql(table.dest_schema, table.dest_table) for table in restarted)))
            dest.execute(sql.SQL("UPDATE {} SET events = events - %s, snapshot_rows = snapshot_rows - %s "
                                 "WHERE connector = %s").format(table_sql(self.schema, "stats")),
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
            table_sql(self.schema, "bulk_load_tables")), (self.connector.name, load_id)).fetchall()
        return [TableLoad(*row[:4], int(row[4]), row[5], row[6], row[7], row[8]) for row in rows]

    def _copy_again_later(self, table: TableLoad) -> None:
        """Stops copying a table whose definition changed: it is copied again, in a new load of its own, once the
        stream has applied the change (see `bookkeeping.reconcile`)."""
        with self.conn.transaction():
            self.conn.execute(sql.SQL("DELETE FROM {} WHERE connector = %s AND source_table = %s AND done_at IS NULL")
                              .format(table_sql(self.schema, "bulk_load_chunks")),
                              (self.connector.name, table.source_table))
            self.conn.execute(sql.SQL("UPDATE {} SET finished_at = now(), copy_again = true WHERE connector = %s "
                                      "AND source_table = %s").format(table_sql(self.schema, "bulk_load_tables")),
                              (self.connector.name, table.source_table))
        table.finished = True
        log.warning("%s: %s changed on the source during the bulk snapshot (its columns or key): its copy stops here "
                    "and it is copied again once the stream has applied the change", self.connector.name,
                    table.source_table)

    def copied(self, chunks: Sequence[int]) -> tuple[int, int, float | None]:
        """The rows copied chunks wrote, their zero dates written as NULL, and when the first of their copies began
        (done_at: when each chunk's transaction began; the first of a run's is its first row moved)."""
        done = self.conn.execute(sql.SQL("SELECT coalesce(sum(rows), 0), coalesce(sum(zero_dates), 0), "
                                         "extract(epoch FROM min(done_at))::float8 FROM {} "
                                         "WHERE id = ANY(%s)").format(table_sql(self.schema, "bulk_load_chunks")),
                                 (list(chunks),)).fetchone()
        return int(done[0]), int(done[1]), done[2]

    def copy_error(self, table: TableLoad, exc: Py4JJavaError) -> CdcError:
        return CdcError(f"the bulk snapshot of {table.source_table} into {table.dest_schema}.{table.dest_table} "
                        f"failed: {root_message(exc.java_exception)}", connector=self.connector.name,
                        table=table.source_table)

    def repair_lines(self, cur: Any, table: TableLoad, chunks: list[Chunk]) -> tuple[list[BulkColumn], DataFrame]:
        """The table's columns and the COPY lines of these key ranges, read as a load reads them (verify's repair)."""
        columns = self.copy_plan.columns(cur, table)
        self.chunk_plan.size_chunks(cur, [table])
        return columns, self.copy_plan.lines(table, columns, chunks)

    def finish_tables(self, tables: Sequence[TableLoad], logged: Sequence[TableLoad] = ()) -> None:
        """Marks these tables finished, and logs the progress of them and of `logged` (one query)."""
        if tables:
            self.conn.execute(sql.SQL("UPDATE {} SET finished_at = now() WHERE connector = %s "
                                      "AND source_table = ANY(%s) AND finished_at IS NULL").format(
                table_sql(self.schema, "bulk_load_tables")),
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
                table_sql(self.schema, "deferred_constraints"), table_sql(self.schema, "bulk_load_tables")),
                (name, name)).fetchone()[0]
            self.conn.execute(sql.SQL(
                "UPDATE {} SET finished_at = now(), end_position = %s, reconciled_at = CASE WHEN %s THEN NULL "
                "ELSE now() END WHERE connector = %s").format(table_sql(self.schema, "bulk_loads")),
                (json.dumps(end_position), waits, name))
            self.conn.execute(sql.SQL("UPDATE {} SET snapshot_ended_at = now() WHERE connector = %s").format(
                table_sql(self.schema, "stats")), (self.connector.name,))
        log.info("%s: bulk snapshot done", self.connector.name)


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
