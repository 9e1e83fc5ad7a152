"""The tables a connector replicates, one by one: their destination names as the control schema records them
(`table_owners`, kept by the DDL, the bulk snapshot and the mapping rules), what a fetch cycle applied to each, and
each one's rows and the connector's applied position after it. The Dagster layer shows each table as an asset."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import psycopg
from psycopg import sql

from cdc_pipeline.sink.plan import DML_COUNTERS, BatchPlan, DdlStep, DmlStep, TruncateStep

log = logging.getLogger(__name__)

# Above this estimate (pg_class.reltuples) a table's rows are not counted after a run: the estimate is shown.
EXACT_ROW_COUNT_LIMIT = 1_000_000


@dataclass(frozen=True)
class ReplicatedTable:
    """A source table of a connector and the destination table it is written to."""

    source_table: str
    dest_schema: str
    dest_table: str


@dataclass
class TableChanges:
    """What a fetch cycle applied, per source table: row changes by kind (snapshot_rows, inserts, updates, deletes),
    truncates and schema changes."""

    by_table: dict[str, Counter] = field(default_factory=dict)

    def add(self, plan: BatchPlan) -> None:
        for step in plan.steps:
            if isinstance(step, DmlStep):
                counter = self.by_table.setdefault(step.source_table, Counter())
                for op, count in step.ops.items():
                    counter[DML_COUNTERS[op]] += count
            elif isinstance(step, TruncateStep):
                self.by_table.setdefault(step.source_table, Counter())["truncates"] += 1
            elif isinstance(step, DdlStep):
                for change in step.changes:
                    self.by_table.setdefault(change.source_table, Counter())["ddls"] += 1

    def tables(self) -> list[str]:
        return sorted(self.by_table)

    def counts(self, source_table: str) -> dict[str, int]:
        counter = self.by_table.get(source_table, Counter())
        return {name: int(counter[name]) for name in ("snapshot_rows", "inserts", "updates", "deletes", "truncates",
                                                      "ddls")}


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
    them; an empty dict when the control schema has no record yet. Reads only: nothing is created."""
    if not _control_table_exists(conn, schema, "table_owners"):
        return {}
    rows = conn.execute(sql.SQL(
        """SELECT connector, source_table, dest_schema, dest_table FROM {} WHERE %(c)s::text IS NULL
           OR connector = %(c)s ORDER BY connector, dest_schema, dest_table""").format(
        sql.Identifier(schema, "table_owners")), {"c": connector}).fetchall()
    tables: dict[str, list[ReplicatedTable]] = {}
    for name, source_table, dest_schema, dest_table in rows:
        tables.setdefault(name, []).append(ReplicatedTable(source_table, dest_schema, dest_table))
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
