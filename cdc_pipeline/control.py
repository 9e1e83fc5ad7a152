"""The control schema in the destination PostgreSQL: connector state, requests, offsets, schema history,
applied positions, stats and snapshot progress, one row set per connector, so connectors never overwrite each
other. Everything here survives restarts of every process: the destination is the control plane's memory.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from cdc_pipeline.errors import CdcError, ConnectorBusyError, names_lost_position

if TYPE_CHECKING:
    from cdc_pipeline.config import ConnectorConfig

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
    """CREATE TABLE IF NOT EXISTS {schema}.requests (
        id bigserial PRIMARY KEY,
        connector text NOT NULL,
        kind text NOT NULL,
        argument text,
        status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'done', 'rejected')),
        reason text,
        requested_at timestamptz NOT NULL DEFAULT now(),
        served_at timestamptz)""",
    # One outstanding request per connector: a second pending one fails its INSERT, from psql too.
    """CREATE UNIQUE INDEX IF NOT EXISTS requests_one_pending_per_connector ON {schema}.requests (connector)
        WHERE status = 'pending'""",
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
    """CREATE TABLE IF NOT EXISTS {schema}.dead_letters (
        id bigserial PRIMARY KEY,
        connector text NOT NULL,
        source_table text,
        op text,
        position jsonb,
        raw_event text NOT NULL,
        value_schema text,
        error text NOT NULL,
        status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'retried', 'discarded')),
        created_at timestamptz NOT NULL DEFAULT now(),
        resolved_at timestamptz)""",
    "CREATE INDEX IF NOT EXISTS dead_letters_connector ON {schema}.dead_letters (connector, status, id)",
    # The bulk snapshot engine (cdc_pipeline/bulk_load): the running load of a connector, its tables and their
    # chunks. A chunk is checkpointed (done_at, rows) in the transaction that writes its rows.
    """CREATE TABLE IF NOT EXISTS {schema}.bulk_loads (
        connector text PRIMARY KEY,
        load_id bigint NOT NULL,
        tables text[],
        started_at timestamptz NOT NULL DEFAULT now(),
        finished_at timestamptz)""",
    """CREATE TABLE IF NOT EXISTS {schema}.bulk_load_tables (
        connector text NOT NULL,
        load_id bigint NOT NULL,
        source_table text NOT NULL,
        dest_schema text NOT NULL,
        dest_table text NOT NULL,
        key_columns text[] NOT NULL,
        estimated_rows bigint NOT NULL DEFAULT 0,
        next_lower jsonb,
        planned boolean NOT NULL DEFAULT false,
        started_at timestamptz NOT NULL DEFAULT now(),
        finished_at timestamptz,
        PRIMARY KEY (connector, source_table))""",
    """CREATE TABLE IF NOT EXISTS {schema}.bulk_load_chunks (
        id bigserial PRIMARY KEY,
        connector text NOT NULL,
        load_id bigint NOT NULL,
        source_table text NOT NULL,
        lower_bound jsonb,
        upper_bound jsonb,
        rows bigint NOT NULL DEFAULT 0,
        zero_dates bigint NOT NULL DEFAULT 0,
        snapshot_position jsonb,
        done_at timestamptz)""",
    "CREATE INDEX IF NOT EXISTS bulk_load_chunks_table ON {schema}.bulk_load_chunks (connector, source_table, id)",
    # A loaded table's primary key and its source's secondary indexes (made once its rows are copied), constraints
    # across rows and the destination's own indexes (made again once the stream has reconciled the load's chunks):
    # cdc_pipeline/sink/deferred_keys.py.
    """CREATE TABLE IF NOT EXISTS {schema}.deferred_constraints (
        connector text NOT NULL,
        dest_schema text NOT NULL,
        dest_table text NOT NULL,
        name text NOT NULL,
        kind text NOT NULL CONSTRAINT deferred_constraints_kind_check
            CHECK (kind IN ('constraint', 'index', 'primary key', 'source index')),
        definition text NOT NULL,
        PRIMARY KEY (connector, dest_schema, dest_table, name))""",
    # What waits where in the connector's running cycle, sampled every few seconds (cdc_pipeline/run_progress.py);
    # the row of a run that ended stays until the next run takes the run lock.
    """CREATE TABLE IF NOT EXISTS {schema}.run_progress (
        connector text PRIMARY KEY,
        run_started_at timestamptz NOT NULL,
        progress jsonb NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now())""",
    # Per source table: the changes applied to it (the stats' counts of the connector, table by table).
    """CREATE TABLE IF NOT EXISTS {schema}.table_stats (
        connector text NOT NULL,
        source_table text NOT NULL,
        snapshot_rows bigint NOT NULL DEFAULT 0,
        inserts bigint NOT NULL DEFAULT 0,
        updates bigint NOT NULL DEFAULT 0,
        deletes bigint NOT NULL DEFAULT 0,
        truncates bigint NOT NULL DEFAULT 0,
        ddls bigint NOT NULL DEFAULT 0,
        last_applied_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (connector, source_table))""",
    # Tables of a connector paused alone (`pause NAME TABLE...`): a source table, or `db.*` for a whole database.
    # Their row changes are let go while the connector streams on; their resume copies them again.
    """CREATE TABLE IF NOT EXISTS {schema}.paused_tables (
        connector text NOT NULL,
        source_table text NOT NULL,
        paused_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (connector, source_table))""",
)

# Columns added after a table was first created: applied to existing control schemas.
_MIGRATIONS = (
    "ALTER TABLE {schema}.stats ADD COLUMN IF NOT EXISTS redelivered bigint NOT NULL DEFAULT 0",
    "ALTER TABLE {schema}.stats ADD COLUMN IF NOT EXISTS truncates bigint NOT NULL DEFAULT 0",
    "ALTER TABLE {schema}.stats ADD COLUMN IF NOT EXISTS zero_dates bigint NOT NULL DEFAULT 0",
    "ALTER TABLE {schema}.stats ADD COLUMN IF NOT EXISTS transactions bigint NOT NULL DEFAULT 0",
    "ALTER TABLE {schema}.stats ADD COLUMN IF NOT EXISTS bad_events bigint NOT NULL DEFAULT 0",
    "ALTER TABLE {schema}.stats ADD COLUMN IF NOT EXISTS snapshot_began_at timestamptz",
    "ALTER TABLE {schema}.stats ADD COLUMN IF NOT EXISTS snapshot_ended_at timestamptz",
    "ALTER TABLE {schema}.stats ADD COLUMN IF NOT EXISTS reset_at timestamptz",
    "ALTER TABLE {schema}.stats ADD COLUMN IF NOT EXISTS first_debezium_ts timestamptz",
    "ALTER TABLE {schema}.stats ADD COLUMN IF NOT EXISTS last_debezium_ts timestamptz",
    "ALTER TABLE {schema}.connector_state ADD COLUMN IF NOT EXISTS phase text",
    "ALTER TABLE {schema}.connector_state ADD COLUMN IF NOT EXISTS next_snapshot_mode text",
    "ALTER TABLE {schema}.connector_state ADD COLUMN IF NOT EXISTS jvm_memory jsonb",
    # The source position before which every change is applied (cdc_pipeline/pending.py).
    "ALTER TABLE {schema}.connector_state ADD COLUMN IF NOT EXISTS source_checked jsonb",
    # The source's position once a load's last chunk was read, and when the stream had applied past it.
    "ALTER TABLE {schema}.bulk_loads ADD COLUMN IF NOT EXISTS end_position jsonb",
    "ALTER TABLE {schema}.bulk_loads ADD COLUMN IF NOT EXISTS reconciled_at timestamptz",
    # The source table's columns and key when the load planned it; a table whose definition changed is copied again.
    "ALTER TABLE {schema}.bulk_load_tables ADD COLUMN IF NOT EXISTS source_definition jsonb",
    "ALTER TABLE {schema}.bulk_load_tables ADD COLUMN IF NOT EXISTS copy_again boolean NOT NULL DEFAULT false",
    # Failed runs in a row, the last one's time, and when the change sensor may launch the next (NULL: at once, or
    # under error_strategy exit, only after a resume).
    "ALTER TABLE {schema}.connector_state ADD COLUMN IF NOT EXISTS failures integer NOT NULL DEFAULT 0",
    "ALTER TABLE {schema}.connector_state ADD COLUMN IF NOT EXISTS last_failed_at timestamptz",
    "ALTER TABLE {schema}.connector_state ADD COLUMN IF NOT EXISTS next_attempt_at timestamptz",
    # What the last run, once it succeeded, ran with and left (`run_digest`): a sync finds nothing to do without a
    # JVM only when the configuration and the positions are the same now.
    "ALTER TABLE {schema}.connector_state ADD COLUMN IF NOT EXISTS run_digest text",
    # A loaded table's primary key is withheld too (kind 'primary key'), and the source's secondary indexes are
    # built after its rows (kind 'source index'). Altered only once: ALTER TABLE would wait for the records a running
    # build of another connector holds.
    """DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = to_regclass('{schema}.deferred_constraints')
                       AND conname = 'deferred_constraints_kind_check'
                       AND pg_get_constraintdef(oid) LIKE '%source index%') THEN
            ALTER TABLE {schema}.deferred_constraints DROP CONSTRAINT IF EXISTS deferred_constraints_kind_check,
                ADD CONSTRAINT deferred_constraints_kind_check
                    CHECK (kind IN ('constraint', 'index', 'primary key', 'source index'));
        END IF;
    END $$""",
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
    # One writer per destination table (mapping/rule_store.py, claim_table): the connector whose DDL, load or
    # rules made the table its own, and the source table it holds.
    """CREATE TABLE IF NOT EXISTS {schema}.table_owners (
        dest_schema text NOT NULL,
        dest_table text NOT NULL,
        connector text NOT NULL,
        source_table text NOT NULL,
        claimed_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (dest_schema, dest_table))""",
    # Tables created before the ownership record was kept: the connector whose column record names each table.
    """INSERT INTO {schema}.table_owners (dest_schema, dest_table, connector, source_table)
       SELECT DISTINCT ON (dest_schema, dest_table) dest_schema, dest_table, connector, source_table
       FROM {schema}.objmap_columns ORDER BY dest_schema, dest_table, connector
       ON CONFLICT DO NOTHING""",
)

# Connector states. `syncing`: the connector replicates, each scheduled run a fetch cycle (its `phase` shows what
# a running cycle does, none between cycles); `stopped`: its last cycle failed (under error_strategy exit no run is
# launched until a resume; under retry and skip the next one after a backoff, `failure_hold`);
# `paused` and `schema sync done`: no run starts until a resume request.
STOPPED = "stopped"
INITIALIZING = "initializing"
SYNCING = "syncing"
PAUSED = "paused"
OFFSET_UPDATE = "offset update"
RESTARTING = "restarting"
SCHEMA_SYNC_DONE = "schema sync done"
# States in which no fetch cycle may start; a running cycle that sees one ends at its next batch boundary.
HALTED_STATES = (PAUSED, SCHEMA_SYNC_DONE, OFFSET_UPDATE)

# Stages (what the connector replicates) and phases (what a running cycle does now).
STAGE_SNAPSHOT = "initial snapshot"
STAGE_CDC = "change data capture"
STAGE_SCHEMA_SYNC = "schema sync"
PHASE_FETCHING = "fetching"
PHASE_PARSING = "parsing"
PHASE_CONVERTING = "converting"
PHASE_EXECUTING = "executing"
PHASE_LOADING = "loading"  # the bulk snapshot engine copies tables


def _lock_key(connector: str) -> sql.Composed:
    return sql.SQL("hashtextextended({}, 0)").format(sql.Literal(f"cdc-pipeline:{connector}"))


# A digest of every statement that makes the control schema: a schema made by these statements is not made again.
_CONTROL_DIGEST = hashlib.sha256("\n".join((*_TABLES, *_MIGRATIONS, *_OBJMAP_TABLES)).encode()).hexdigest()


def ensure_control_schema(conn: psycopg.Connection, schema: str) -> None:
    """Creates the control schema and its tables, and migrates them; does nothing when this version of the pipeline
    made them already (one read: `control_version` holds the digest of the statements that made them). A run that
    finds them made takes no lock on them: ALTER TABLE ... IF NOT EXISTS locks its table whether or not it alters it,
    and connectors whose runs start together deadlocked on those locks with each other's first statements."""
    if _control_schema_current(conn, schema):
        return
    with conn.transaction(), conn.cursor() as cur:
        # Concurrent first runs would race on CREATE ... IF NOT EXISTS; serialise them, and the second finds it made.
        cur.execute(sql.SQL("SELECT pg_advisory_xact_lock({})").format(_lock_key("control-schema")))
        if _control_schema_current(cur, schema):
            return
        cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        for statement in (*_TABLES, *_MIGRATIONS, *_OBJMAP_TABLES):
            cur.execute(sql.SQL(statement).format(schema=sql.Identifier(schema)))
        version = sql.Identifier(schema, "control_version")
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (digest text PRIMARY KEY, made_at timestamptz NOT NULL "
                            "DEFAULT now())").format(version))
        cur.execute(sql.SQL("DELETE FROM {}").format(version))
        cur.execute(sql.SQL("INSERT INTO {} (digest) VALUES (%s)").format(version), (_CONTROL_DIGEST,))


def _control_schema_current(conn: psycopg.Connection | psycopg.Cursor, schema: str) -> bool:
    """Whether this version's statements made the control schema already."""
    version = sql.Identifier(schema, "control_version")
    if conn.execute("SELECT to_regclass(%s) IS NOT NULL", (version.as_string(conn),)).fetchone()[0] is not True:
        return False
    return conn.execute(sql.SQL("SELECT 1 FROM {} WHERE digest = %s").format(version),
                        (_CONTROL_DIGEST,)).fetchone() is not None


# What the operator role may read: the state and the numbers, never replicated rows (dead letters hold some) nor
# the engine's offsets and schema history.
OPERATOR_READS = ("connector_state", "applied_positions", "stats", "requests", "snapshot_progress", "objmap",
                  "objmap_columns", "objmap_attributes", "table_owners", "bulk_loads", "bulk_load_tables",
                  "run_progress", "paused_tables", "table_stats", "control_version")
# Columns of those that may hold replicated values, which the operator does not read: an error's text may quote the
# value the destination refused, and a bulk load's next chunk begins at a key value.
OPERATOR_HIDDEN_COLUMNS = {"connector_state": ("last_error",), "bulk_load_tables": ("next_lower",)}


def grant_operator(conn: psycopg.Connection, schema: str, role: str) -> None:
    """Gives the operator role its rights in the control schema, and only those: read the state (but no column that
    may hold a replicated value: `OPERATOR_HIDDEN_COLUMNS`), submit requests (INSERT of connector, kind and
    argument: the pipeline serves and validates them), and add, change and delete mapping rules (which every run
    reads through `transform_guard`). Nothing on replicated tables."""
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    if not exists:
        raise CdcError(f"the destination's operator_role {role!r} does not exist: create it (CREATE ROLE "
                       f"{role} LOGIN PASSWORD ...) or take operator_role out of the connectors file")
    target, who = sql.Identifier(schema), sql.Identifier(role)
    with conn.transaction():
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(target, who))
        conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(sql.SQL(", ").join(
            sql.Identifier(schema, name) for name in OPERATOR_READS if name not in OPERATOR_HIDDEN_COLUMNS), who))
        for name, hidden in OPERATOR_HIDDEN_COLUMNS.items():
            table = sql.Identifier(schema, name)
            shown = [column for (column,) in conn.execute(
                "SELECT attname FROM pg_catalog.pg_attribute WHERE attrelid = %s::pg_catalog.regclass AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum", (table.as_string(conn),)) if column not in hidden]
            # A table-wide grant (as earlier versions made) would show every column.
            conn.execute(sql.SQL("REVOKE SELECT ON {} FROM {}").format(table, who))
            conn.execute(sql.SQL("GRANT SELECT ({}) ON {} TO {}").format(
                sql.SQL(", ").join(map(sql.Identifier, shown)), table, who))
        conn.execute(sql.SQL("GRANT INSERT (connector, kind, argument) ON {} TO {}").format(
            sql.Identifier(schema, "requests"), who))
        conn.execute(sql.SQL("GRANT USAGE ON SEQUENCE {} TO {}").format(sql.Identifier(schema, "requests_id_seq"), who))
        conn.execute(sql.SQL("GRANT INSERT, UPDATE, DELETE ON {} TO {}").format(sql.Identifier(schema, "objmap"), who))


def acquire_run_lock(conn: psycopg.Connection, connector: str) -> None:
    """Holds the connector's session lock for this connection's life: one fetch cycle per connector at a time."""
    row = conn.execute(sql.SQL("SELECT pg_try_advisory_lock({})").format(_lock_key(connector))).fetchone()
    if not row or not row[0]:
        raise ConnectorBusyError("another fetch cycle of this connector is running", connector=connector)


def wait_for_run_lock(conn: psycopg.Connection, connector: str, seconds: float) -> None:
    """Takes the connector's run lock as `acquire_run_lock` does, waiting at most `seconds` for the fetch cycle that
    holds it: the wait shows in pg_locks (`run_lock_awaited`), and a cycle that lingers or stands ends at its next cut
    once it sees it. Raises ConnectorBusyError when the cycle did not end in time."""
    try:
        with conn.transaction():
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{max(1, int(seconds * 1000))}ms",))
            conn.execute(sql.SQL("SELECT pg_advisory_lock({})").format(_lock_key(connector)))
    except psycopg.errors.LockNotAvailable:
        raise ConnectorBusyError(f"the connector's fetch cycle did not end within {seconds:.0f} s",
                                 connector=connector) from None


def run_lock_awaited(conn: psycopg.Connection, connector: str) -> bool:
    """Whether a session waits for the connector's run lock (`wait_for_run_lock`: a `verify --repair`)."""
    return _run_lock_session(conn, connector, granted=False) is not None


def release_run_lock(conn: psycopg.Connection, connector: str) -> None:
    conn.execute(sql.SQL("SELECT pg_advisory_unlock({})").format(_lock_key(connector)))


def run_lock_holder(conn: psycopg.Connection, connector: str) -> int | None:
    """The backend pid of the session that holds the connector's run lock (a fetch cycle running now, whoever started
    it: a sync run, a materialization of its assets, the CLI), or None. Read in `pg_locks`, without taking the lock:
    a cycle starting at that moment is never refused for it (a bigint key's lock shows as its high and low 32 bits)."""
    return _run_lock_session(conn, connector, granted=True)


def _run_lock_session(conn: psycopg.Connection, connector: str, granted: bool) -> int | None:
    """The backend pid of a session that holds (`granted`) or waits for the connector's run lock, read in
    `pg_locks`, or None."""
    row = conn.execute(sql.SQL(
        """SELECT pid FROM pg_catalog.pg_locks
           WHERE locktype = 'advisory' AND granted = %s AND objsubid = 1
             AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
             AND ((classid::bigint << 32) | objid::bigint) = {}
           LIMIT 1""").format(_lock_key(connector)), (granted,)).fetchone()
    return None if row is None else int(row[0])


def requests_pending(conn: psycopg.Connection, schema: str, connector: str) -> bool:
    """Whether a request of the connector waits to be served (cdc_pipeline.ops.requests): a run that lingers or
    stands ends at its next cut, so that the request is served."""
    return conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE connector = %s AND status = 'pending')").format(
        sql.Identifier(schema, "requests")), (connector,)).fetchone()[0]


def run_lock_held(conn: psycopg.Connection, connector: str) -> bool:
    """Whether a fetch cycle of the connector runs now (`run_lock_holder`)."""
    return run_lock_holder(conn, connector) is not None


def set_state(conn: psycopg.Connection, schema: str, connector: str, connector_type: str, state: str, *,
              stage: str | None = None, phase: str | None = None, last_error: str | None = None,
              clear_error: bool = False, last_offset: Any = None,
              unless_in: tuple[str, ...] = ()) -> bool:
    """Records the connector's state and its running cycle's phase (None: no cycle runs); keeps the previous
    stage, error and offset unless new ones are given.

    With `unless_in`, a connector whose state is one of those keeps it (only its phase and error are recorded):
    a cycle never overwrites a pause that came while it ran. Returns whether the state was set.
    """
    statement = sql.SQL(
        """INSERT INTO {table} AS s (connector, connector_type, state, stage, phase, last_error, last_offset, updated_at)
           VALUES (%(connector)s, %(type)s, %(state)s, %(stage)s, %(phase)s, %(error)s, %(offset)s, now())
           ON CONFLICT (connector) DO UPDATE SET
             connector_type = EXCLUDED.connector_type,
             state = CASE WHEN s.state = ANY(%(keep)s::text[]) THEN s.state ELSE EXCLUDED.state END,
             stage = coalesce(EXCLUDED.stage, s.stage), phase = EXCLUDED.phase,
             last_error = CASE WHEN %(clear)s THEN EXCLUDED.last_error
                               ELSE coalesce(EXCLUDED.last_error, s.last_error) END,
             last_offset = coalesce(EXCLUDED.last_offset, s.last_offset), updated_at = now()
           RETURNING state"""
    ).format(table=sql.Identifier(schema, "connector_state"))
    with conn.transaction():
        row = conn.execute(statement, {
            "connector": connector, "type": connector_type, "state": state, "stage": stage, "phase": phase,
            "error": last_error, "clear": clear_error, "keep": list(unless_in),
            "offset": None if last_offset is None else json.dumps(last_offset),
        }).fetchone()
    return row is not None and row[0] == state


def set_phase(conn: psycopg.Connection, schema: str, connector: str, phase: str | None,
              stage: str | None = None) -> None:
    """Records what the connector's running cycle does now (and the stage it is in, when given)."""
    conn.execute(sql.SQL("UPDATE {} SET phase = %s, stage = coalesce(%s, stage), updated_at = now() "
                         "WHERE connector = %s").format(sql.Identifier(schema, "connector_state")),
                 (phase, stage, connector))


def read_state(conn: psycopg.Connection, schema: str, connector: str) -> dict[str, Any] | None:
    """The connector's row of connector_state, or None before its first run or request."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql.SQL("SELECT * FROM {} WHERE connector = %s").format(
            sql.Identifier(schema, "connector_state")), (connector,)).fetchone()


def set_next_snapshot_mode(conn: psycopg.Connection, schema: str, connector: str, mode: str) -> None:
    """The snapshot mode the connector's next cycle starts its engine with, instead of the configured one."""
    conn.execute(sql.SQL("UPDATE {} SET next_snapshot_mode = %s, updated_at = now() WHERE connector = %s").format(
        sql.Identifier(schema, "connector_state")), (mode, connector))


def clear_next_snapshot_mode(conn: psycopg.Connection, schema: str, connector: str, mode: str) -> None:
    """A cycle consumed the restart's snapshot mode (one asked for meanwhile stays, unless it is the same)."""
    conn.execute(sql.SQL("UPDATE {} SET next_snapshot_mode = NULL, updated_at = now() WHERE connector = %s "
                         "AND next_snapshot_mode = %s").format(sql.Identifier(schema, "connector_state")),
                 (connector, mode))


def record_jvm_memory(conn: psycopg.Connection, schema: str, connector: str, memory: dict[str, int]) -> None:
    """Keeps the runner JVM's heap and non-heap use as the connector's cycle last saw it."""
    conn.execute(sql.SQL("UPDATE {} SET jvm_memory = %s WHERE connector = %s").format(
        sql.Identifier(schema, "connector_state")), (json.dumps(memory), connector))


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
    transactions: int = 0  # source transactions the batch's streamed changes belong to (counted where they begin)
    bad_events: int = 0  # events the `skip` error strategy moved to the dead letters instead of applying them
    first_source_ms: int | None = None
    last_source_ms: int | None = None
    first_debezium_ms: int | None = None  # when Debezium processed the batch's first and last change
    last_debezium_ms: int | None = None

    COUNTERS = ("events", "ddls", "inserts", "snapshot_rows", "updates", "deletes", "other_events", "redelivered",
                "truncates", "zero_dates", "transactions", "bad_events")

    def add(self, other: "BatchCounts") -> None:
        for name in self.COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if other.first_source_ms is not None:
            self.first_source_ms = min(filter(None, (self.first_source_ms, other.first_source_ms)))
        if other.last_source_ms is not None:
            self.last_source_ms = max(filter(None, (self.last_source_ms, other.last_source_ms)))
        if other.first_debezium_ms is not None:
            self.first_debezium_ms = min(filter(None, (self.first_debezium_ms, other.first_debezium_ms)))
        if other.last_debezium_ms is not None:
            self.last_debezium_ms = max(filter(None, (self.last_debezium_ms, other.last_debezium_ms)))

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.COUNTERS}


def retire_snapshot_positions(cur: psycopg.Cursor, schema: str, connector: str, tables: list[str]) -> None:
    """Forgets the bulk snapshot's positions of these tables (the stream has passed them), inside the batch's
    transaction: they are never compared with a later event again."""
    cur.execute(sql.SQL("UPDATE {} SET snapshot_position = NULL WHERE connector = %s AND source_table = ANY(%s) "
                        "AND snapshot_position IS NOT NULL").format(sql.Identifier(schema, "bulk_load_chunks")),
                (connector, tables))


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
    names = sql.SQL(", ").join(map(sql.Identifier, BatchCounts.COUNTERS))
    cur.execute(sql.SQL(
        """INSERT INTO {table} AS s (connector, batches, {names}, first_source_ts, last_source_ts, first_debezium_ts,
             last_debezium_ts, first_applied_at, last_applied_at)
           VALUES (%(connector)s, 1, {values}, to_timestamp(%(first_ms)s / 1000.0), to_timestamp(%(last_ms)s / 1000.0),
             to_timestamp(%(first_dbz_ms)s / 1000.0), to_timestamp(%(last_dbz_ms)s / 1000.0), now(), now())
           ON CONFLICT (connector) DO UPDATE SET batches = s.batches + 1, {added},
             first_source_ts = coalesce(s.first_source_ts, EXCLUDED.first_source_ts),
             last_source_ts = coalesce(EXCLUDED.last_source_ts, s.last_source_ts),
             first_debezium_ts = coalesce(s.first_debezium_ts, EXCLUDED.first_debezium_ts),
             last_debezium_ts = coalesce(EXCLUDED.last_debezium_ts, s.last_debezium_ts),
             first_applied_at = coalesce(s.first_applied_at, EXCLUDED.first_applied_at),
             last_applied_at = now()""").format(
        table=sql.Identifier(schema, "stats"), names=names,
        values=sql.SQL(", ").join(map(sql.Placeholder, BatchCounts.COUNTERS)),
        added=sql.SQL(", ").join(sql.SQL("{0} = s.{0} + EXCLUDED.{0}").format(sql.Identifier(name))
                                 for name in BatchCounts.COUNTERS)),
        {"connector": connector, "first_ms": counts.first_source_ms, "last_ms": counts.last_source_ms,
         "first_dbz_ms": counts.first_debezium_ms, "last_dbz_ms": counts.last_debezium_ms, **values})


SNAPSHOT_COUNTERS = ("events", "ddls", "snapshot_rows", "other_events")


def supersede_snapshot(cur: psycopg.Cursor, schema: str, connector: str) -> BatchCounts:
    """A snapshot starts (again): what the connector applied of its earlier snapshot is superseded (in the batch's
    transaction), and the snapshot's begin time goes to the stats; returns the counts that moved.

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
    cur.execute(sql.SQL(
        """INSERT INTO {} AS s (connector, snapshot_began_at) VALUES (%s, now())
           ON CONFLICT (connector) DO UPDATE SET snapshot_began_at = now(), snapshot_ended_at = NULL""").format(
        sql.Identifier(schema, "stats")), (connector,))
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
    source), marked replaced now; the snapshot's end time goes to the stats."""
    rows = cur.execute(sql.SQL(
        """UPDATE {} SET rows_replaced = true, updated_at = now()
           WHERE connector = %s AND NOT rows_replaced AND source_table <> '' RETURNING source_table""").format(
        sql.Identifier(schema, "snapshot_progress")), (connector,)).fetchall()
    cur.execute(sql.SQL("UPDATE {} SET snapshot_ended_at = now() WHERE connector = %s").format(
        sql.Identifier(schema, "stats")), (connector,))
    return sorted(row[0] for row in rows)


def has_offset(conn: psycopg.Connection, schema: str, connector: str) -> bool:
    """Whether Debezium has recorded an offset for the connector (it has replicated something)."""
    row = conn.execute(sql.SQL("SELECT EXISTS (SELECT FROM {} WHERE connector = %s)").format(
        sql.Identifier(schema, "debezium_offsets")), (connector,)).fetchone()
    return bool(row and row[0])


def read_engine_offset(conn: psycopg.Connection, schema: str, connector: str) -> dict[str, Any] | None:
    """The connector's stored Debezium offset (where its engine resumes), or None; with several partitions, the
    first."""
    row = conn.execute(sql.SQL("SELECT offset_value FROM {} WHERE connector = %s ORDER BY offset_key").format(
        sql.Identifier(schema, "debezium_offsets")), (connector,)).fetchone()
    return json.loads(row[0]) if row and row[0] else None


def offset_in_snapshot(conn: psycopg.Connection, schema: str, connector: str) -> bool:
    """Whether the connector's stored offset was taken inside a snapshot (Debezium then takes that snapshot again
    from its start)."""
    rows = conn.execute(sql.SQL("SELECT offset_value FROM {} WHERE connector = %s").format(
        sql.Identifier(schema, "debezium_offsets")), (connector,)).fetchall()
    return any(inside_snapshot(json.loads(value) if value else {}) for (value,) in rows)


def inside_snapshot(offset: dict[str, Any] | None) -> bool:
    """Whether a Debezium offset was taken inside a snapshot that had not completed."""
    offset = offset or {}
    snapshot = str(offset.get("snapshot", "false")).lower()  # true, or the snapshot's kind (INITIAL, ...)
    return snapshot != "false" and str(offset.get("snapshot_completed")).lower() != "true"


def read_applied_offset(conn: psycopg.Connection, schema: str, connector: str) -> dict[str, Any] | None:
    """The Debezium offset of the last event applied for the connector, or None."""
    row = conn.execute(sql.SQL("SELECT debezium_offset FROM {} WHERE connector = %s").format(
        sql.Identifier(schema, "applied_positions")), (connector,)).fetchone()
    return row[0] if row else None


def consistent_as_of(conn: psycopg.Connection, schema: str, connector: str) -> dict[str, Any] | None:
    """The source commit the connector's destination tables are consistent as of: groups commit only where source
    transactions end, so the last applied event's source position (`position`) and the source time of the last
    change applied (`source_time`, None before any) name a state the source had; `applied_at`: when it was
    committed. None before anything was applied. (A table a bulk load is still copying is not consistent.)"""
    row = conn.execute(sql.SQL(
        "SELECT a.source_position, a.applied_at, s.last_source_ts FROM {} a LEFT JOIN {} s USING (connector) "
        "WHERE a.connector = %s").format(sql.Identifier(schema, "applied_positions"), sql.Identifier(schema, "stats")),
        (connector,)).fetchone()
    if row is None:
        return None
    return {"position": row[0], "applied_at": row[1], "source_time": row[2]}


TABLE_STAT_COUNTERS = ("snapshot_rows", "inserts", "updates", "deletes", "truncates", "ddls")


def record_table_counts(cur: psycopg.Cursor, schema: str, connector: str,
                        counts: dict[str, dict[str, int]]) -> None:
    """Adds a batch's changes per source table to `table_stats`, in the batch's transaction (one statement)."""
    if not counts:
        return
    rows = [(connector, table, *(int(by_kind.get(name, 0)) for name in TABLE_STAT_COUNTERS))
            for table, by_kind in sorted(counts.items())]
    names = sql.SQL(", ").join(sql.Identifier(name) for name in TABLE_STAT_COUNTERS)
    added = sql.SQL(", ").join(sql.SQL("{name} = t.{name} + EXCLUDED.{name}").format(name=sql.Identifier(name))
                               for name in TABLE_STAT_COUNTERS)
    cur.executemany(sql.SQL(
        "INSERT INTO {table} AS t (connector, source_table, {names}) VALUES (%s, %s, {values}) "
        "ON CONFLICT (connector, source_table) DO UPDATE SET {added}, last_applied_at = now()").format(
        table=sql.Identifier(schema, "table_stats"), names=names, added=added,
        values=sql.SQL(", ").join(sql.Placeholder() for _ in TABLE_STAT_COUNTERS)), rows)


def paused_tables(conn: psycopg.Connection | psycopg.Cursor, schema: str, connector: str) -> list[str]:
    """The connector's tables paused alone (`db.table`, or `db.*` for every table of a database), sorted."""
    return [row[0] for row in conn.execute(sql.SQL(
        "SELECT source_table FROM {} WHERE connector = %s ORDER BY source_table").format(
        sql.Identifier(schema, "paused_tables")), (connector,)).fetchall()]


def set_tables_paused(conn: psycopg.Connection, schema: str, connector: str, tables: Sequence[str],
                      paused: bool) -> None:
    """Pauses these tables (names or `db.*`) of the connector alone, or resumes them."""
    table = sql.Identifier(schema, "paused_tables")
    with conn.cursor() as cur:
        if paused:
            cur.executemany(sql.SQL("INSERT INTO {} (connector, source_table) VALUES (%s, %s) ON CONFLICT DO NOTHING")
                            .format(table), [(connector, name) for name in tables])
        else:
            cur.execute(sql.SQL("DELETE FROM {} WHERE connector = %s AND source_table = ANY(%s)").format(table),
                        (connector, list(tables)))


def read_states(conn: psycopg.Connection, schema: str, connector: str | None = None) -> list[dict[str, Any]]:
    """Each connector's state row joined with its Debezium offset, applied position and totals."""
    query = sql.SQL(
        """SELECT s.connector, s.connector_type, s.state, s.stage, s.phase, s.next_snapshot_mode, s.last_error,
                  s.failures, s.last_failed_at, s.next_attempt_at, s.updated_at, o.offset_value AS debezium_offset, a.source_position AS applied_position,
                  a.debezium_offset AS applied_offset, a.applied_at, s.jvm_memory,
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


# Dead letters: events the `skip` error strategy set aside, kept with what is needed to apply them later.

DEAD_LETTER_PENDING = "pending"
DEAD_LETTER_RETRIED = "retried"
DEAD_LETTER_DISCARDED = "discarded"


@dataclass
class DeadLetter:
    connector: str
    source_table: str | None
    op: str | None
    position: Any
    raw_event: str
    value_schema: str | None
    error: str


def add_dead_letter(cur: psycopg.Cursor, schema: str, letter: DeadLetter) -> int:
    """Records a skipped event inside the batch's transaction; returns its id."""
    row = cur.execute(sql.SQL(
        """INSERT INTO {} (connector, source_table, op, position, raw_event, value_schema, error)
           VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id""").format(sql.Identifier(schema, "dead_letters")),
        (letter.connector, letter.source_table, letter.op, json.dumps(letter.position, default=str),
         letter.raw_event, letter.value_schema, letter.error)).fetchone()
    assert row is not None
    return int(row[0])


def read_dead_letters(conn: psycopg.Connection, schema: str, connector: str, *, ids: list[int] | None = None,
                      status: str | None = None) -> list[dict[str, Any]]:
    """The connector's dead letters in id order (the order their events came in), all or the given ids."""
    conditions = [sql.SQL("connector = %(connector)s")]
    if ids:
        conditions.append(sql.SQL("id = ANY(%(ids)s)"))
    if status:
        conditions.append(sql.SQL("status = %(status)s"))
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql.SQL(
            """SELECT id, connector, source_table, op, position, raw_event, value_schema, error, status, created_at,
                      resolved_at FROM {} WHERE {} ORDER BY id""").format(
            sql.Identifier(schema, "dead_letters"), sql.SQL(" AND ").join(conditions)),
            {"connector": connector, "ids": ids, "status": status}).fetchall()


def resolve_dead_letter(cur: psycopg.Cursor, schema: str, letter_id: int, status: str) -> bool:
    """Marks a pending dead letter retried or discarded; False when it was no longer pending."""
    row = cur.execute(sql.SQL(
        "UPDATE {} SET status = %s, resolved_at = now() WHERE id = %s AND status = 'pending' RETURNING id").format(
        sql.Identifier(schema, "dead_letters")), (status, letter_id)).fetchone()
    return row is not None


def record_dead_letter_applied(cur: psycopg.Cursor, schema: str, connector: str, counts: BatchCounts) -> None:
    """A retried dead letter applied: its event moves from the bad events to its kind in the stats."""
    moved = {name: getattr(counts, name) for name in ("ddls", "inserts", "snapshot_rows", "updates", "deletes",
                                                       "truncates", "zero_dates")}
    cur.execute(sql.SQL("UPDATE {} SET bad_events = bad_events - 1, {} WHERE connector = %(connector)s").format(
        sql.Identifier(schema, "stats"),
        sql.SQL(", ").join(sql.SQL("{0} = {0} + {1}").format(sql.Identifier(name), sql.Placeholder(name))
                           for name in moved)),
        {"connector": connector, **moved})


def record_source_checked(conn: psycopg.Connection, schema: str, connector: str, position: dict[str, Any]) -> None:
    """Records that the connector has applied every change of its source before `position`."""
    conn.execute(sql.SQL("UPDATE {} SET source_checked = %s WHERE connector = %s").format(
        sql.Identifier(schema, "connector_state")), (json.dumps(position), connector))


def record_run_progress(conn: psycopg.Connection, schema: str, connector: str, run_started_at: datetime,
                        progress: dict[str, Any]) -> None:
    """Keeps the running cycle's latest progress sample (one row per connector, replaced)."""
    conn.execute(sql.SQL(
        """INSERT INTO {} (connector, run_started_at, progress, updated_at) VALUES (%s, %s, %s, now())
           ON CONFLICT (connector) DO UPDATE SET run_started_at = EXCLUDED.run_started_at,
             progress = EXCLUDED.progress, updated_at = now()""").format(sql.Identifier(schema, "run_progress")),
        (connector, run_started_at, json.dumps(progress)))


def clear_run_progress(conn: psycopg.Connection, schema: str, connector: str) -> None:
    """Forgets the connector's progress row: a cycle clears it when it takes the run lock (an earlier cycle killed
    left one) and before it releases the lock."""
    conn.execute(sql.SQL("DELETE FROM {} WHERE connector = %s").format(sql.Identifier(schema, "run_progress")),
                 (connector,))


def read_run_progress(conn: psycopg.Connection, schema: str, connector: str) -> dict[str, Any] | None:
    """The connector's latest progress sample, with when its run started and the sample's age in seconds; None
    when no run sampled any."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(sql.SQL(
            """SELECT progress, run_started_at, updated_at,
                      round(extract(epoch FROM now() - updated_at)::numeric, 1)::float8 AS age_seconds
               FROM {} WHERE connector = %s""").format(sql.Identifier(schema, "run_progress")),
            (connector,)).fetchone()
    return None if row is None else {**row.pop("progress"), **row}


# Failed runs: counted in a row, backed off, or under error_strategy exit held until a resume.

EXIT = "exit"


def backoff_seconds(connector: "ConnectorConfig", failures: int) -> float:
    """Seconds after the `failures`-th failure in a row (of a run, or of the change check) before the next run:
    the check interval, doubling with each failure, at most `failure_backoff_max_seconds`."""
    return min(connector.failure_backoff_max_seconds,
               connector.check_interval_seconds * 2.0 ** min(max(0, failures - 1), 30))


def failure_backoff(connector: "ConnectorConfig", failures: int) -> float | None:
    """When the change sensor may launch the next run after the `failures`-th failed run in a row (`backoff_seconds`);
    None under error_strategy exit (no run until a resume)."""
    return None if connector.error_strategy == EXIT else backoff_seconds(connector, failures)


def record_failure(conn: psycopg.Connection, schema: str, connector: "ConnectorConfig", error: str, *,
                   unless_recorded_since: float | None = None) -> int | None:
    """Counts a failed run of the connector (its error, its time, when the next run may start) and marks it stopped
    unless it is paused; returns the failures in a row, or None when a failure was already recorded at or after
    `unless_recorded_since` (epoch seconds: the run's start, when the run's own session recorded it)."""
    row = conn.execute(sql.SQL(
        """INSERT INTO {table} AS s (connector, connector_type, state, last_error, failures, last_failed_at, updated_at)
           VALUES (%(connector)s, %(type)s, %(stopped)s, %(error)s, 1, now(), now())
           ON CONFLICT (connector) DO UPDATE SET
             state = CASE WHEN s.state = ANY(%(keep)s::text[]) THEN s.state ELSE EXCLUDED.state END,
             last_error = EXCLUDED.last_error, failures = s.failures + 1, last_failed_at = now(), updated_at = now()
           WHERE %(since)s::float8 IS NULL OR s.last_failed_at IS NULL OR s.last_failed_at < to_timestamp(%(since)s)
           RETURNING failures""").format(table=sql.Identifier(schema, "connector_state")),
        {"connector": connector.name, "type": connector.type, "stopped": STOPPED, "error": error,
         "keep": list(HALTED_STATES), "since": unless_recorded_since}).fetchone()
    if row is None:
        return None
    failures = int(row[0])
    backoff = failure_backoff(connector, failures)
    conn.execute(sql.SQL("UPDATE {} SET next_attempt_at = last_failed_at + make_interval(secs => %s) "
                         "WHERE connector = %s")
                 .format(sql.Identifier(schema, "connector_state")),
                 (backoff, connector.name))
    return failures


def clear_failures(conn: psycopg.Connection, schema: str, connector: str) -> None:
    """A run succeeded, or an operator resumed the connector: no failure in a row any more."""
    conn.execute(sql.SQL("UPDATE {} SET failures = 0, next_attempt_at = NULL WHERE connector = %s").format(
        sql.Identifier(schema, "connector_state")), (connector,))


def run_digest(conn: psycopg.Connection, schema: str, connector: str, config_digest: str) -> str:
    """A digest of the connector's configuration (`ConnectorConfig.fingerprint`) and of its positions: the engine's
    stored offsets and the applied position. An offset set, moved or lost since changes it."""
    offsets = conn.execute(sql.SQL("SELECT offset_key, offset_value FROM {} WHERE connector = %s ORDER BY offset_key")
                           .format(sql.Identifier(schema, "debezium_offsets")), (connector,)).fetchall()
    applied = conn.execute(sql.SQL("SELECT source_position::text, debezium_offset::text FROM {} WHERE connector = %s")
                           .format(sql.Identifier(schema, "applied_positions")), (connector,)).fetchall()
    text = json.dumps([config_digest, offsets, applied], default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def record_run_digest(conn: psycopg.Connection, schema: str, connector: str, digest: str | None) -> None:
    """A run succeeded and left `run_digest` (None: a run began and has not succeeded yet)."""
    conn.execute(sql.SQL("UPDATE {} SET run_digest = %s WHERE connector = %s").format(
        sql.Identifier(schema, "connector_state")), (digest, connector))


def failure_hold(state: dict[str, Any] | None, connector: "ConnectorConfig",
                 now: datetime | None = None) -> str | None:
    """Why no run may be launched now for a connector whose last run failed, or None: under error_strategy exit it
    stays stopped until an operator resumes it; under retry and skip, until its backoff has passed."""
    if not state or state.get("state") != STOPPED:
        return None
    name, failures = connector.name, int(state.get("failures") or 0)
    error = (state.get("last_error") or "unknown error").strip().splitlines()[0]
    if names_lost_position(error, name):
        # A resume would fail the same way: the error's own words name the command that recovers.
        return f"{error} (the connector is stopped, {failures} failed run(s) in a row)"
    error = error[:300]
    if connector.error_strategy == EXIT:
        return (f"connector {name} is stopped after a failed run ({failures} in a row): {error}; under error_strategy "
                f"exit it stays stopped until an operator resumes it (cdc-pipeline resume {name})")
    next_attempt = state.get("next_attempt_at")
    if next_attempt is not None and next_attempt > (now or datetime.now(timezone.utc)):
        return (f"connector {name} failed {failures} run(s) in a row: {error}; next attempt at "
                f"{next_attempt.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC (backoff, at most "
                f"{connector.failure_backoff_max_seconds:.0f} s)")
    return None
