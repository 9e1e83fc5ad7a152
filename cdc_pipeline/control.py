"""The control schema in the destination PostgreSQL: connector state, offsets, schema history, applied
positions, stats and snapshot progress, one row set per connector, so connectors never overwrite each other.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from cdc_pipeline.errors import ConnectorBusyError

log = logging.getLogger(__name__)

_TABLES = (
    """CREATE TABLE IF NOT EXISTS {schema}.connector_state (
        connector text PRIMARY KEY,
        connector_type text NOT NULL,
        state text NOT NULL,
        stage text,
        last_error text,
        last_offset jsonb,
        updated_at timestamptz NOT NULL DEFAULT now())""",
    """CREATE TABLE IF NOT EXISTS {schema}.debezium_offsets (
        connector text NOT NULL,
        offset_key text NOT NULL,
        offset_value text,
        updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (connector, offset_key))""",
    """CREATE TABLE IF NOT EXISTS {schema}.debezium_schema_history (
        connector text NOT NULL,
        id bigserial,
        record text NOT NULL,
        recorded_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (connector, id))""",
    """CREATE TABLE IF NOT EXISTS {schema}.applied_positions (
        connector text PRIMARY KEY,
        batch_events integer NOT NULL,
        source_position jsonb,
        debezium_offset jsonb,
        applied_at timestamptz NOT NULL DEFAULT now())""",
    """CREATE TABLE IF NOT EXISTS {schema}.stats (
        connector text PRIMARY KEY,
        batches bigint NOT NULL DEFAULT 0,
        events bigint NOT NULL DEFAULT 0,
        ddls bigint NOT NULL DEFAULT 0,
        inserts bigint NOT NULL DEFAULT 0,
        snapshot_rows bigint NOT NULL DEFAULT 0,
        updates bigint NOT NULL DEFAULT 0,
        deletes bigint NOT NULL DEFAULT 0,
        other_events bigint NOT NULL DEFAULT 0,
        redelivered bigint NOT NULL DEFAULT 0,
        truncates bigint NOT NULL DEFAULT 0,
        zero_dates bigint NOT NULL DEFAULT 0,
        first_source_ts timestamptz,
        last_source_ts timestamptz,
        first_applied_at timestamptz,
        last_applied_at timestamptz)""",
    """CREATE TABLE IF NOT EXISTS {schema}.snapshot_progress (
        connector text NOT NULL,
        source_table text NOT NULL,
        events bigint NOT NULL DEFAULT 0,
        ddls bigint NOT NULL DEFAULT 0,
        snapshot_rows bigint NOT NULL DEFAULT 0,
        other_events bigint NOT NULL DEFAULT 0,
        rows_replaced boolean NOT NULL DEFAULT false,
        updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (connector, source_table))""",
)

# Columns added after a table was first created: applied to existing control schemas.
_MIGRATIONS = (
    "ALTER TABLE {schema}.stats ADD COLUMN IF NOT EXISTS redelivered bigint NOT NULL DEFAULT 0",
    "ALTER TABLE {schema}.stats ADD COLUMN IF NOT EXISTS truncates bigint NOT NULL DEFAULT 0",
    "ALTER TABLE {schema}.stats ADD COLUMN IF NOT EXISTS zero_dates bigint NOT NULL DEFAULT 0",
)

# Object mapping (cdc_pipeline/objmap.py): the rules per connector, what each source column became, and the
# attribute view of both with the live destination type.
_OBJMAP_TABLES = (
    """CREATE TABLE IF NOT EXISTS {schema}.objmap (
        connector text NOT NULL,
        kind text NOT NULL CHECK (kind IN ('table', 'column', 'datatype', 'transform')),
        source_object text NOT NULL,
        destination_object text NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now())""",
    "CREATE UNIQUE INDEX IF NOT EXISTS objmap_rule ON {schema}.objmap (connector, kind, lower(source_object))",
    """CREATE TABLE IF NOT EXISTS {schema}.objmap_columns (
        connector text NOT NULL,
        source_table text NOT NULL,
        source_column text NOT NULL,
        position integer NOT NULL,
        source_type text NOT NULL,
        source_length integer,
        source_scale integer,
        autoincrement boolean NOT NULL,
        type_map_type text NOT NULL,
        dest_schema text NOT NULL,
        dest_table text NOT NULL,
        dest_column text NOT NULL,
        dest_type text NOT NULL,
        PRIMARY KEY (connector, source_table, source_column))""",
    """CREATE OR REPLACE VIEW {schema}.objmap_attributes AS
        SELECT c.connector, c.source_table, c.source_column, c.position, c.source_type,
               c.dest_schema, c.dest_table, c.dest_column,
               coalesce(format_type(a.atttypid, a.atttypmod), c.dest_type) AS dest_type,
               r.destination_object AS transform
        FROM {schema}.objmap_columns c
        LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = c.dest_schema
        LEFT JOIN pg_catalog.pg_class t ON t.relnamespace = n.oid AND t.relname = c.dest_table
             AND t.relkind IN ('r', 'p')
        LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = t.oid AND a.attname = c.dest_column
             AND a.attnum > 0 AND NOT a.attisdropped
        LEFT JOIN {schema}.objmap r ON r.connector = c.connector AND r.kind = 'transform'
             AND lower(r.source_object) = lower(c.source_table || '.' || c.source_column)""",
)

STOPPED = "stopped"
INITIALIZING = "initializing"
SYNCING = "syncing"


def _lock_key(connector: str) -> sql.Composed:
    return sql.SQL("hashtextextended({}, 0)").format(sql.Literal(f"cdc-pipeline:{connector}"))


def ensure_control_schema(conn: psycopg.Connection, schema: str) -> None:
    """Creates the control schema and its tables; does nothing for what already exists."""
    with conn.transaction(), conn.cursor() as cur:
        # Concurrent first runs would race on CREATE ... IF NOT EXISTS; serialise them.
        cur.execute(sql.SQL("SELECT pg_advisory_xact_lock({})").format(_lock_key("control-schema")))
        cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        for statement in (*_TABLES, *_MIGRATIONS, *_OBJMAP_TABLES):
            cur.execute(sql.SQL(statement).format(schema=sql.Identifier(schema)))


def acquire_run_lock(conn: psycopg.Connection, connector: str) -> None:
    """Holds the connector's session lock for this connection's life: one fetch cycle per connector at a time."""
    row = conn.execute(sql.SQL("SELECT pg_try_advisory_lock({})").format(_lock_key(connector))).fetchone()
    if not row or not row[0]:
        raise ConnectorBusyError("another fetch cycle of this connector is running", connector=connector)


def release_run_lock(conn: psycopg.Connection, connector: str) -> None:
    conn.execute(sql.SQL("SELECT pg_advisory_unlock({})").format(_lock_key(connector)))


def set_state(conn: psycopg.Connection, schema: str, connector: str, connector_type: str, state: str, *,
              stage: str | None = None, last_error: str | None = None, clear_error: bool = False,
              last_offset: Any = None) -> None:
    """Records the connector's state; keeps the previous error and offset unless new ones are given."""
    statement = sql.SQL(
        """INSERT INTO {table} AS s (connector, connector_type, state, stage, last_error, last_offset, updated_at)
           VALUES (%(connector)s, %(type)s, %(state)s, %(stage)s, %(error)s, %(offset)s, now())
           ON CONFLICT (connector) DO UPDATE SET
             connector_type = EXCLUDED.connector_type, state = EXCLUDED.state, stage = EXCLUDED.stage,
             last_error = CASE WHEN %(clear)s THEN EXCLUDED.last_error
                               ELSE coalesce(EXCLUDED.last_error, s.last_error) END,
             last_offset = coalesce(EXCLUDED.last_offset, s.last_offset), updated_at = now()"""
    ).format(table=sql.Identifier(schema, "connector_state"))
    with conn.transaction():
        conn.execute(statement, {
            "connector": connector, "type": connector_type, "state": state, "stage": stage, "error": last_error,
            "clear": clear_error, "offset": None if last_offset is None else json.dumps(last_offset),
        })


@dataclass
class BatchCounts:
    """What one batch applied, by kind of change; every event is counted once."""

    events: int = 0
    ddls: int = 0
    inserts: int = 0
    snapshot_rows: int = 0
    updates: int = 0
    deletes: int = 0
    other_events: int = 0
    redelivered: int = 0
    truncates: int = 0
    zero_dates: int = 0  # MariaDB/MySQL zero dates written as NULL
    first_source_ms: int | None = None
    last_source_ms: int | None = None

    COUNTERS = ("events", "ddls", "inserts", "snapshot_rows", "updates", "deletes", "other_events", "redelivered",
                "truncates", "zero_dates")

    def add(self, other: "BatchCounts") -> None:
        for name in self.COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if other.first_source_ms is not None:
            self.first_source_ms = min(filter(None, (self.first_source_ms, other.first_source_ms)))
        if other.last_source_ms is not None:
            self.last_source_ms = max(filter(None, (self.last_source_ms, other.last_source_ms)))

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.COUNTERS}


def record_batch_applied(cur: psycopg.Cursor, schema: str, connector: str, counts: BatchCounts,
                         source_position: dict[str, Any], debezium_offset: Any) -> None:
    """Writes the batch's applied position and adds its counts to the stats, inside the batch's transaction.

    A batch made only of re-delivered events leaves the applied position where it is (it must never move back).
    """
    if counts.events:
        cur.execute(sql.SQL(
        """INSERT INTO {table} (connector, batch_events, source_position, debezium_offset, applied_at)
           VALUES (%s, %s, %s, %s, now())
           ON CONFLICT (connector) DO UPDATE SET batch_events = EXCLUDED.batch_events,
             source_position = EXCLUDED.source_position, debezium_offset = EXCLUDED.debezium_offset,
             applied_at = now()""").format(table=sql.Identifier(schema, "applied_positions")),
            (connector, counts.events, json.dumps(source_position), json.dumps(debezium_offset)))
    values = counts.as_dict()
    cur.execute(sql.SQL(
        """INSERT INTO {table} AS s (connector, batches, events, ddls, inserts, snapshot_rows, updates, deletes,
             other_events, redelivered, truncates, zero_dates, first_source_ts, last_source_ts, first_applied_at, last_applied_at)
           VALUES (%(connector)s, 1, %(events)s, %(ddls)s, %(inserts)s, %(snapshot_rows)s, %(updates)s, %(deletes)s,
             %(other_events)s, %(redelivered)s, %(truncates)s, %(zero_dates)s, to_timestamp(%(first_ms)s / 1000.0), to_timestamp(%(last_ms)s / 1000.0), now(), now())
           ON CONFLICT (connector) DO UPDATE SET batches = s.batches + 1, events = s.events + EXCLUDED.events,
             ddls = s.ddls + EXCLUDED.ddls, inserts = s.inserts + EXCLUDED.inserts,
             snapshot_rows = s.snapshot_rows + EXCLUDED.snapshot_rows, updates = s.updates + EXCLUDED.updates,
             deletes = s.deletes + EXCLUDED.deletes, other_events = s.other_events + EXCLUDED.other_events,
             redelivered = s.redelivered + EXCLUDED.redelivered, truncates = s.truncates + EXCLUDED.truncates,
             zero_dates = s.zero_dates + EXCLUDED.zero_dates,
             first_source_ts = coalesce(s.first_source_ts, EXCLUDED.first_source_ts),
             last_source_ts = coalesce(EXCLUDED.last_source_ts, s.last_source_ts),
             first_applied_at = coalesce(s.first_applied_at, EXCLUDED.first_applied_at),
             last_applied_at = now()""").format(table=sql.Identifier(schema, "stats")),
        {"connector": connector, "first_ms": counts.first_source_ms, "last_ms": counts.last_source_ms, **values})


SNAPSHOT_COUNTERS = ("events", "ddls", "snapshot_rows", "other_events")


def supersede_snapshot(cur: psycopg.Cursor, schema: str, connector: str) -> BatchCounts:
    """A snapshot starts again: what the connector applied of its earlier snapshot is superseded (in the batch's
    transaction); returns the counts that moved.

    Debezium cannot resume a MariaDB/MySQL snapshot: it takes it again from its first event, so the events applied
    of the earlier one are re-delivered. Their counts move from their kinds to `redelivered` in the stats, and
    every table is marked as not yet replaced by the new snapshot.
    """
    progress = sql.Identifier(schema, "snapshot_progress")
    totals = cur.execute(sql.SQL("SELECT {} FROM {} WHERE connector = %s").format(
        sql.SQL(", ").join(sql.SQL("coalesce(sum({}), 0)").format(sql.Identifier(name)) for name in SNAPSHOT_COUNTERS),
        progress), (connector,)).fetchone()
    moved = BatchCounts(**{name: int(value) for name, value in zip(SNAPSHOT_COUNTERS, totals or ())})
    if moved.events:
        cur.execute(sql.SQL("UPDATE {} SET {}, redelivered = redelivered + %(events)s WHERE connector = %(connector)s").format(
            sql.Identifier(schema, "stats"),
            sql.SQL(", ").join(sql.SQL("{0} = {0} - {1}").format(sql.Identifier(name), sql.Placeholder(name))
                               for name in SNAPSHOT_COUNTERS)),
            {"connector": connector, **{name: getattr(moved, name) for name in SNAPSHOT_COUNTERS}})
    cur.execute(sql.SQL("UPDATE {} SET {}, rows_replaced = false, updated_at = now() WHERE connector = %s").format(
        progress, sql.SQL(", ").join(sql.SQL("{} = 0").format(sql.Identifier(name)) for name in SNAPSHOT_COUNTERS)),
        (connector,))
    return moved


def record_snapshot_progress(cur: psycopg.Cursor, schema: str, connector: str, source_table: str,
                             counts: BatchCounts) -> None:
    """Adds a batch's snapshot events of one table ('' for events naming none) to the running snapshot's counts."""
    names = sql.SQL(", ").join(map(sql.Identifier, SNAPSHOT_COUNTERS))
    cur.execute(sql.SQL(
        """INSERT INTO {table} AS p (connector, source_table, {names}) VALUES (%s, %s, {values})
           ON CONFLICT (connector, source_table) DO UPDATE SET {added}, updated_at = now()""").format(
        table=sql.Identifier(schema, "snapshot_progress"), names=names,
        values=sql.SQL(", ").join(sql.Placeholder() * len(SNAPSHOT_COUNTERS)),
        added=sql.SQL(", ").join(sql.SQL("{0} = p.{0} + EXCLUDED.{0}").format(sql.Identifier(name))
                                 for name in SNAPSHOT_COUNTERS)),
        (connector, source_table, *(getattr(counts, name) for name in SNAPSHOT_COUNTERS)))


def replace_snapshot_rows(cur: psycopg.Cursor, schema: str, connector: str, source_table: str) -> bool:
    """Marks the table's rows as replaced by the running snapshot; True when they were not yet, which is when the
    caller empties the destination table before the snapshot's first rows of it."""
    progress = sql.Identifier(schema, "snapshot_progress")
    row = cur.execute(sql.SQL("SELECT rows_replaced FROM {} WHERE connector = %s AND source_table = %s FOR UPDATE")
                      .format(progress), (connector, source_table)).fetchone()
    if row is not None and row[0]:
        return False
    cur.execute(sql.SQL(
        """INSERT INTO {} (connector, source_table, rows_replaced) VALUES (%s, %s, true)
           ON CONFLICT (connector, source_table) DO UPDATE SET rows_replaced = true, updated_at = now()""").format(
        progress), (connector, source_table))
    return True


def tables_not_replaced_by_snapshot(cur: psycopg.Cursor, schema: str, connector: str) -> list[str]:
    """At the end of a snapshot: the tables of earlier snapshots it read no rows of (their rows are gone from the
    source), marked replaced now."""
    rows = cur.execute(sql.SQL(
        """UPDATE {} SET rows_replaced = true, updated_at = now()
           WHERE connector = %s AND NOT rows_replaced AND source_table <> '' RETURNING source_table""").format(
        sql.Identifier(schema, "snapshot_progress")), (connector,)).fetchall()
    return sorted(row[0] for row in rows)


def read_applied_offset(conn: psycopg.Connection, schema: str, connector: str) -> dict[str, Any] | None:
    """The Debezium offset of the last event applied for the connector, or None."""
    row = conn.execute(sql.SQL("SELECT debezium_offset FROM {} WHERE connector = %s").format(
        sql.Identifier(schema, "applied_positions")), (connector,)).fetchone()
    return row[0] if row else None


def read_states(conn: psycopg.Connection, schema: str, connector: str | None = None) -> list[dict[str, Any]]:
    """Each connector's state row joined with its Debezium offset, applied position and stats."""
    query = sql.SQL(
        """SELECT s.connector, s.connector_type, s.state, s.stage, s.last_error, s.updated_at,
                  o.offset_value AS debezium_offset, a.source_position AS applied_position, a.applied_at,
                  st.batches, st.events, st.ddls, st.inserts, st.snapshot_rows, st.updates, st.deletes
           FROM {state} s
           LEFT JOIN {offsets} o ON o.connector = s.connector
           LEFT JOIN {applied} a ON a.connector = s.connector
           LEFT JOIN {stats} st ON st.connector = s.connector
           WHERE %(connector)s::text IS NULL OR s.connector = %(connector)s
           ORDER BY s.connector""").format(
        state=sql.Identifier(schema, "connector_state"), offsets=sql.Identifier(schema, "debezium_offsets"),
        applied=sql.Identifier(schema, "applied_positions"), stats=sql.Identifier(schema, "stats"))
    with conn.cursor(row_factory=dict_row) as cur:
        return list(cur.execute(query, {"connector": connector}))
