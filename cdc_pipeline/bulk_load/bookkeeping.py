"""A bulk load's bookkeeping in the control schema (`cdc.bulk_loads`, `cdc.bulk_load_tables`, `cdc.bulk_load_chunks`):
what the cycle and the operators read and write about loads, apart from the Spark engine that copies. A load is begun
(`begin_load`: of the connector's tables, or of those a snapshot request names), runs until every table is copied
(`running_load`; its progress per table: `read_progress`), ends at the source's position after its last chunk
(`unreconciled_end`), and is reconciled once the stream has passed that position (`reconcile`). A table read under one
consistent snapshot has that snapshot's position, before which the stream skips its changes (`snapshot_positions`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Sequence

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from cdc_pipeline.sink import deferred_keys
from cdc_pipeline.config import ConnectorConfig, DestinationConfig
from cdc_pipeline.sources import captures, module_for, select_tables

if TYPE_CHECKING:
    from cdc_pipeline.mapping import objmap

log = logging.getLogger(__name__)


def table_sql(schema: str, name: str) -> sql.Identifier:
    """The table `schema.name`, quoted for a statement."""
    return sql.Identifier(schema, name)


def begin_load(conn: psycopg.Connection, schema: str, connector: str, tables: list[str] | None = None) -> int:
    """Starts a new load of the connector's tables, or of `tables` only (a snapshot request: the others keep their
    rows and stream on), forgetting what an earlier load recorded of them; returns its id."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(sql.SQL(
            """INSERT INTO {} AS l (connector, load_id, tables) VALUES (%s, 1, %s)
               ON CONFLICT (connector) DO UPDATE SET load_id = l.load_id + 1, tables = EXCLUDED.tables,
                 started_at = now(), finished_at = NULL, end_position = NULL, reconciled_at = NULL
               RETURNING load_id""").format(table_sql(schema, "bulk_loads")), (connector, tables))
        load_id = int(cur.fetchone()[0])
        # `db.*` names every table of a database.
        prefixes = None if tables is None else [name[:-1] for name in tables if name.endswith(".*")]
        for name in ("bulk_load_tables", "bulk_load_chunks"):
            cur.execute(sql.SQL("DELETE FROM {} WHERE connector = %s AND (%s::text[] IS NULL OR "
                                "source_table = ANY(%s) OR EXISTS (SELECT 1 FROM unnest(%s::text[]) AS p "
                                "WHERE starts_with(source_table, p)))").format(table_sql(schema, name)),
                        (connector, tables, tables, prefixes))
        cur.execute(sql.SQL(
            """INSERT INTO {} AS s (connector, snapshot_began_at) VALUES (%s, now())
               ON CONFLICT (connector) DO UPDATE SET snapshot_began_at = now(), snapshot_ended_at = NULL""").format(
            table_sql(schema, "stats")), (connector,))
    log.info("%s: bulk snapshot %d begins", connector, load_id)
    return load_id


def forget_engine_position(conn: psycopg.Connection, schema: str, connector: str) -> None:
    """Drops the connector's Debezium offset and schema history, so its engine starts over with a schema snapshot
    (a new load's chunks must be read after the position its stream starts from)."""
    with conn.transaction():
        for name in ("debezium_offsets", "debezium_schema_history"):
            conn.execute(sql.SQL("DELETE FROM {} WHERE connector = %s").format(table_sql(schema, name)), (connector,))


def has_load(conn: psycopg.Connection, schema: str, connector: str) -> bool:
    """Whether a load of the connector's tables was begun (running or finished)."""
    return conn.execute(sql.SQL("SELECT 1 FROM {} WHERE connector = %s").format(
        table_sql(schema, "bulk_loads")), (connector,)).fetchone() is not None


def running_load(conn: psycopg.Connection, schema: str, connector: str) -> int | None:
    """The id of the connector's load that is not finished yet, or None."""
    row = conn.execute(sql.SQL("SELECT load_id FROM {} WHERE connector = %s AND finished_at IS NULL").format(
        table_sql(schema, "bulk_loads")), (connector,)).fetchone()
    return None if row is None else int(row[0])


def unreconciled_end(conn: psycopg.Connection, schema: str, connector: str) -> dict[str, Any] | None:
    """The end position of the connector's finished load that the stream has not passed yet (its tables may hold
    rows of different moments until then), or None."""
    row = conn.execute(sql.SQL("SELECT end_position FROM {} WHERE connector = %s AND finished_at IS NOT NULL "
                               "AND reconciled_at IS NULL AND end_position IS NOT NULL").format(
        table_sql(schema, "bulk_loads")), (connector,)).fetchone()
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
            table_sql(schema, "bulk_load_tables")), (connector,)).fetchall()]
        conn.execute(sql.SQL("UPDATE {} SET reconciled_at = now() WHERE connector = %s").format(
            table_sql(schema, "bulk_loads")), (connector,))
        if again:
            begin_load(conn, schema, connector, again)
            log.info("%s: %s changed during the bulk snapshot: copied again now", connector, ", ".join(again))
    return again


def reconciled_load(conn: psycopg.Connection, schema: str, connector: str) -> int | None:
    """The id of the connector's latest bulk load once the stream has reconciled it (its tables then show the source
    at one moment), or None."""
    row = conn.execute(sql.SQL("SELECT load_id FROM {} WHERE connector = %s AND reconciled_at IS NOT NULL").format(
        table_sql(schema, "bulk_loads")), (connector,)).fetchone()
    return None if row is None else int(row[0])


def load_tables(conn: psycopg.Connection, schema: str, connector: ConnectorConfig,
                cur: Any) -> tuple[list[Any], list[str]]:
    """The source tables the connector's load copies (those it captures, or the ones a snapshot request named), and
    the named ones the source does not have."""
    wanted = conn.execute(sql.SQL("SELECT tables FROM {} WHERE connector = %s").format(
        table_sql(schema, "bulk_loads")), (connector.name,)).fetchone()[0]
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
            table_sql(schema, "bulk_load_tables")), (connector.name, load_id)).fetchone() is not None:
        return []
    with source.connect(connector) as source_conn, source_conn.cursor() as cur:
        listed, _ = load_tables(conn, schema, connector, cur)
    targets = {table.name: object_map.table_name(table.name) for table in listed}
    existing = existing_tables(conn, list(targets.values()))
    return [name for name, target in targets.items() if target not in existing]


def existing_tables(conn: psycopg.Connection | psycopg.Cursor,
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
        "AND snapshot_position IS NOT NULL").format(table_sql(schema, "bulk_load_chunks")), (connector,)).fetchall()
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
            tables=table_sql(schema, "bulk_load_tables"), chunks=table_sql(schema, "bulk_load_chunks")),
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
