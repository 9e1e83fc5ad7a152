"""The tables a connector replicates, one by one: their destination names as the control schema records them
(`table_owners`, kept by the DDL, the bulk snapshot and the mapping rules), what a fetch cycle applied to each, and
each one's rows and the connector's applied position after it; what the engine recorded of its runs whoever ran
them (`read_run_record`), and its source tables' row estimates from the source's catalog. The Dagster layer shows
each table as an asset, its source tables as assets upstream of it."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Iterator

import psycopg
from psycopg import sql

from cdc_pipeline import sources
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.sink.plan import TABLE_COUNTERS, BatchPlan, table_counts

log = logging.getLogger(__name__)

# Above this estimate (pg_class.reltuples) a table's rows are not counted after a run: the estimate is shown.
EXACT_ROW_COUNT_LIMIT = 1_000_000


@dataclass(frozen=True)
class ReplicatedTable:
    """A source table of a connector and the destination table it is written to; `merged_from`: the connector's
    other source tables a table rule writes to the same destination table."""

    source_table: str
    dest_schema: str
    dest_table: str
    merged_from: tuple[str, ...] = ()

    @property
    def source_tables(self) -> tuple[str, ...]:
        return (self.source_table, *self.merged_from)


@dataclass
class TableChanges:
    """What a fetch cycle applied, per source table: row changes by kind (snapshot_rows, inserts, updates, deletes),
    truncates and schema changes."""

    by_table: dict[str, Counter] = field(default_factory=dict)

    def add(self, plan: BatchPlan) -> None:
        for table, counts in table_counts(plan).items():
            self.by_table.setdefault(table, Counter()).update(counts)

    def tables(self) -> list[str]:
        return sorted(self.by_table)

    def counts(self, source_table: str) -> dict[str, int]:
        counter = self.by_table.get(source_table, Counter())
        return {name: int(counter[name]) for name in TABLE_COUNTERS}


def count_applied(plans: Iterable[BatchPlan], changes: TableChanges) -> Iterator[BatchPlan]:
    """Passes the plans on to the applier, adding each one to `changes` once it is applied (the applier asks for
    the next plan only then): a batch whose apply failed is not counted."""
    for plan in plans:
        yield plan
        changes.add(plan)


def _control_table_exists(conn: psycopg.Connection, schema: str, table: str) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                        (sql.Identifier(schema, table).as_string(conn),)).fetchone()[0]


def read_replicated_tables(conn: psycopg.Connection, schema: str,
                           connector: str | None = None) -> dict[str, list[ReplicatedTable]]:
    """Each connector's tables (of one connector when named), by destination name, as the control schema records
    them; an empty dict when the control schema has no record yet. Reads only: nothing is created.

    A destination table has one row in `table_owners` (its writer and the source table that claimed it first); the
    other source tables merged into it by table rules are those `objmap_columns` records with its name."""
    if not _control_table_exists(conn, schema, "table_owners"):
        return {}
    rows = conn.execute(sql.SQL(
        """SELECT o.connector, o.source_table, o.dest_schema, o.dest_table,
                  coalesce(array_agg(DISTINCT c.source_table) FILTER (WHERE c.source_table <> o.source_table), '{{}}')
           FROM {owners} o LEFT JOIN {columns} c ON c.connector = o.connector AND c.dest_schema = o.dest_schema
             AND c.dest_table = o.dest_table
           WHERE %(c)s::text IS NULL OR o.connector = %(c)s
           GROUP BY o.connector, o.source_table, o.dest_schema, o.dest_table
           ORDER BY o.connector, o.dest_schema, o.dest_table""").format(
        owners=sql.Identifier(schema, "table_owners"), columns=sql.Identifier(schema, "objmap_columns")),
        {"c": connector}).fetchall()
    tables: dict[str, list[ReplicatedTable]] = {}
    for name, source_table, dest_schema, dest_table, merged_from in rows:
        tables.setdefault(name, []).append(ReplicatedTable(source_table, dest_schema, dest_table, tuple(merged_from)))
    return tables


@dataclass(frozen=True)
class TableStatus:
    """A destination table after a run: its rows (exact, or PostgreSQL's estimate for a large table; None when the
    table is missing) and the connector's applied position then."""

    rows: int | None
    rows_estimated: bool
    applied_position: dict[str, Any] | None
    applied_at: Any


def read_table_status(conn: psycopg.Connection, schema: str, connector: str,
                      tables: Iterable[ReplicatedTable]) -> dict[str, TableStatus]:
    """Per source table: the destination table's rows and the connector's applied position (its last applied
    event's source position, and when it was applied)."""
    applied = conn.execute(sql.SQL("SELECT source_position, applied_at FROM {} WHERE connector = %s").format(
        sql.Identifier(schema, "applied_positions")), (connector,)).fetchone() \
        if _control_table_exists(conn, schema, "applied_positions") else None
    position, applied_at = (applied[0], applied[1]) if applied else (None, None)
    status = {}
    for table in tables:
        rows, estimated = _row_count(conn, table.dest_schema, table.dest_table)
        status[table.source_table] = TableStatus(rows, estimated, position, applied_at)
    return status


def _row_count(conn: psycopg.Connection, dest_schema: str, dest_table: str) -> tuple[int | None, bool]:
    estimate = conn.execute("SELECT c.reltuples::bigint FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                            "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
                            (dest_schema, dest_table)).fetchone()
    if estimate is None:
        return None, False
    if estimate[0] > EXACT_ROW_COUNT_LIMIT:
        return int(estimate[0]), True
    return conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
        sql.Identifier(dest_schema, dest_table))).fetchone()[0], False


# The connector's running totals (`stats`) that a run outside Dagster reports on its connector's asset.
RUN_TOTALS = ("batches", "events", "snapshot_rows", "inserts", "updates", "deletes", "truncates", "ddls")


@dataclass(frozen=True)
class RunRecord:
    """What the engine recorded of a connector's runs, whoever ran them (Dagster, the CLI, a benchmark): its applied
    position and when it was applied, per source table when its bulk load ended or its snapshot rows were last
    applied (`loaded_at`), and its running totals."""

    applied_position: dict[str, Any] | None
    applied_at: datetime | None
    loaded_at: dict[str, datetime]
    totals: dict[str, int]

    @property
    def last_at(self) -> datetime | None:
        """When the engine last wrote the connector's tables, as far as it recorded."""
        return max(filter(None, (self.applied_at, *self.loaded_at.values())), default=None)


def read_run_record(conn: psycopg.Connection, schema: str, connector: str) -> RunRecord:
    """The connector's `RunRecord`; empty when the control schema holds nothing of it. Reads only."""
    applied = conn.execute(sql.SQL("SELECT source_position, applied_at FROM {} WHERE connector = %s").format(
        sql.Identifier(schema, "applied_positions")), (connector,)).fetchone() \
        if _control_table_exists(conn, schema, "applied_positions") else None
    loaded: dict[str, datetime] = {}
    if _control_table_exists(conn, schema, "snapshot_progress"):
        loaded.update(conn.execute(sql.SQL(
            "SELECT source_table, updated_at FROM {} WHERE connector = %s AND source_table <> '' AND snapshot_rows > 0"
        ).format(sql.Identifier(schema, "snapshot_progress")), (connector,)).fetchall())
    if _control_table_exists(conn, schema, "bulk_load_tables"):
        for source_table, finished_at in conn.execute(sql.SQL(
                "SELECT source_table, finished_at FROM {} WHERE connector = %s AND finished_at IS NOT NULL").format(
                sql.Identifier(schema, "bulk_load_tables")), (connector,)):
            loaded[source_table] = max(finished_at, loaded.get(source_table, finished_at))
    totals = conn.execute(sql.SQL("SELECT {} FROM {} WHERE connector = %s").format(
        sql.SQL(", ").join(map(sql.Identifier, RUN_TOTALS)), sql.Identifier(schema, "stats")),
        (connector,)).fetchone() if _control_table_exists(conn, schema, "stats") else None
    return RunRecord(applied[0] if applied else None, applied[1] if applied else None, loaded,
                     dict(zip(RUN_TOTALS, map(int, totals))) if totals else {})


def write_marks(conn: psycopg.Connection, tables: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Per existing destination table (schema, table): a mark that changes whenever rows are written to it or it is
    emptied or rewritten (PostgreSQL's cumulative statistics of rows inserted, updated and deleted, and its file
    node). The statistics count a write when its session reports them (at its end, or within a second or so of
    going idle) and go back to zero when reset: only a change of the mark tells."""
    wanted = list(tables)
    rows = conn.execute(
        """SELECT n.nspname, c.relname, c.relfilenode::text || ':' || coalesce(s.n_tup_ins, 0)::text || ':'
                  || coalesce(s.n_tup_upd, 0)::text || ':' || coalesce(s.n_tup_del, 0)::text
           FROM unnest(%s::text[], %s::text[]) AS w(schema_name, table_name)
           JOIN pg_catalog.pg_namespace n ON n.nspname = w.schema_name
           JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = w.table_name AND c.relkind IN ('r', 'p')
           LEFT JOIN pg_catalog.pg_stat_user_tables s ON s.relid = c.oid""",
        ([schema for schema, _ in wanted], [table for _, table in wanted])).fetchall()
    return {(schema, table): mark for schema, table, mark in rows}


def estimated_source_rows(connector: ConnectorConfig, source_tables: Iterable[str]) -> dict[str, int]:
    """Per source table, its rows as the source's catalog estimates them without reading the table (PostgreSQL's
    pg_class.reltuples, MariaDB/MySQL's information_schema.TABLES.TABLE_ROWS); a table the catalog has no estimate
    of (never analyzed) is left out, and so is every table of a source type where no estimate is cheap (the source's
    `estimated_rows` is None)."""
    wanted = {table.lower(): table for table in source_tables}
    source = sources.module_for(connector.type)
    if not wanted or source.estimated_rows is None:
        return {}
    with source.connect(connector) as conn, conn.cursor() as cur:
        rows = source.estimated_rows(cur, list(wanted.values()))
    return {wanted[name.lower()]: int(estimate) for name, estimate in rows
            if name.lower() in wanted and estimate is not None and int(estimate) >= 0}
