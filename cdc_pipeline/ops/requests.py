"""State-change requests: how an operator asks a connector to pause, resume, move its offset, restart with a
snapshot mode, reload its rules or copy tables again, and the rules that accept or reject each request.

A request is a row of the `requests` table, written by `cdc-pipeline pause|resume|...`, by the Dagster control
job or by a plain `INSERT` from psql. The request sensor serves pending requests in id order: each is done (the
connector's state changed) or rejected with its reason, in one transaction with the state change. One request
per connector may be pending (a unique index refuses a second one, from psql too).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import class_row

from cdc_pipeline import control
from cdc_pipeline.bulk_load import bookkeeping

from cdc_pipeline.decode import offsets

from cdc_pipeline.mapping import rule_store
from cdc_pipeline.sources import captures, module_for
from cdc_pipeline.config import SNAPSHOT_MODES, ConnectorConfig, PipelineConfig, load_config
from cdc_pipeline.errors import CdcError, ConfigError

log = logging.getLogger(__name__)

PAUSE = "pause"
RESUME = "resume"
SET_OFFSET = "set_offset"
RESTART = "restart"
RELOAD_OBJMAP = "reload_objmap"
SNAPSHOT = "snapshot"
KINDS = (PAUSE, RESUME, SET_OFFSET, RESTART, RELOAD_OBJMAP, SNAPSHOT)

PENDING = "pending"
DONE = "done"
REJECTED = "rejected"

NEVER_RUN = "never run"
_PAUSED = (control.PAUSED, control.SCHEMA_SYNC_DONE)


class RequestError(CdcError):
    """A request that cannot be submitted: unknown kind, or another request of the connector is pending."""


@dataclass
class Request:
    """One row of the requests table."""

    id: int
    connector: str
    kind: str
    argument: str | None
    status: str
    reason: str | None
    requested_at: datetime
    served_at: datetime | None

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass
class Outcome:
    """What serving a request did: its final status and reason, and whether the connector needs a run now."""

    request: Request
    status: str
    reason: str
    launch_run: bool = False


def submit_request(conn: psycopg.Connection, schema: str, connector: str, kind: str,
                   argument: str | None = None) -> int:
    """Adds a pending request; returns its id. Raises RequestError for an unknown kind or when the connector has
    a pending request already (naming it)."""
    if kind not in KINDS:
        raise RequestError(f"unknown request kind {kind!r}; kinds: {', '.join(KINDS)}", connector=connector)
    table = sql.Identifier(schema, "requests")
    try:
        with conn.transaction():
            row = conn.execute(sql.SQL("INSERT INTO {} (connector, kind, argument) VALUES (%s, %s, %s) RETURNING id")
                               .format(table), (connector, kind, argument)).fetchone()
    except psycopg.errors.UniqueViolation:
        pending = read_requests(conn, schema, connector, status=PENDING)
        shown = f"request {pending[0].id} ({pending[0].kind})" if pending else "a request"
        raise RequestError(f"{shown} is still pending: one request per connector at a time", connector=connector) \
            from None
    assert row is not None
    return int(row[0])


def read_requests(conn: psycopg.Connection, schema: str, connector: str | None = None, *,
                  status: str | None = None, after_id: int = 0, limit: int | None = None) -> list[Request]:
    """Requests in id order (the latest `limit` of them when given), of one connector or all, of one status
    or all."""
    query = sql.SQL(
        """SELECT * FROM (SELECT * FROM {} WHERE (%(connector)s::text IS NULL OR connector = %(connector)s)
             AND (%(status)s::text IS NULL OR status = %(status)s) AND id > %(after)s
             ORDER BY id DESC LIMIT %(limit)s) r ORDER BY id""").format(sql.Identifier(schema, "requests"))
    with conn.cursor(row_factory=class_row(Request)) as cur:
        return list(cur.execute(query, {"connector": connector, "status": status, "after": after_id,
                                        "limit": limit}))


def read_request(conn: psycopg.Connection, schema: str, request_id: int) -> Request | None:
    with conn.cursor(row_factory=class_row(Request)) as cur:
        return cur.execute(sql.SQL("SELECT * FROM {} WHERE id = %s").format(sql.Identifier(schema, "requests")),
                           (request_id,)).fetchone()


def serve_pending_requests(conn: psycopg.Connection, schema: str, config: PipelineConfig) -> list[Outcome]:
    """Serves every pending request, oldest first; returns what each did."""
    return [serve_request(conn, schema, config, request)
            for request in read_requests(conn, schema, status=PENDING)]


def serve_request(conn: psycopg.Connection, schema: str, config: PipelineConfig, request: Request) -> Outcome:
    """Applies the request's rule to its connector's state and records the outcome, in one transaction.

    Rules: pause from any state but paused; resume only from paused, `schema sync done` or stopped (a failed run;
    its failures in a row are forgotten), and the connector needs a run; set offset only while paused and no cycle runs, with an offset of the connector type's shape,
    then paused again; restart with a snapshot mode from any state but paused (its next cycle starts the engine
    in that mode; a schema sync only for a connector without an offset), and the connector needs a run; reload
    the object-mapping rules from any state, when the connectors file still reads (while a cycle of the connector
    runs, the request stays pending with its reason, and the cycle ends at its next cut); snapshot tables again (the
    bulk snapshot engine, the connector's own tables, no bulk snapshot running, not paused), and the connector needs
    a run.
    """
    with conn.transaction():
        # Serialise with other servers of the same request (two sensors, the CLI): the first one serves it.
        current = conn.execute(sql.SQL("SELECT status FROM {} WHERE id = %s FOR UPDATE").format(
            sql.Identifier(schema, "requests")), (request.id,)).fetchone()
        if current is None or current[0] != PENDING:
            return Outcome(request, current[0] if current else REJECTED, "served already", False)
        try:
            reason, launch = _apply_rule(conn, schema, config, request)
            status = DONE
        except _Rejected as rejection:
            reason, launch, status = str(rejection), False, REJECTED
        except _Waits as waits:
            conn.execute(sql.SQL("UPDATE {} SET reason = %s WHERE id = %s").format(
                sql.Identifier(schema, "requests")), (str(waits), request.id))
            return Outcome(request, PENDING, str(waits), False)
        conn.execute(sql.SQL("UPDATE {} SET status = %s, reason = %s, served_at = now() WHERE id = %s").format(
            sql.Identifier(schema, "requests")), (status, reason, request.id))
    log.info("Request %d (%s %s) of connector %s: %s, %s", request.id, request.kind, request.argument or "",
             request.connector, status, reason)
    return Outcome(request, status, reason, launch)


class _Rejected(Exception):
    """The request breaks a rule; its message is the reason recorded."""


class _Waits(Exception):
    """The request waits (stays pending) for the connector's running cycle, which ends at its next cut once it sees
    a request pending (`control.requests_pending`); its message is the reason recorded meanwhile."""


def _apply_rule(conn: psycopg.Connection, schema: str, config: PipelineConfig, request: Request) -> tuple[str, bool]:
    name, kind, argument = request.connector, request.kind, request.argument
    if name not in config.connectors:
        raise _Rejected(f"no connector {name!r} in {config.path}; configured: {', '.join(config.connectors)}")
    connector = config.connectors[name]
    if kind not in KINDS:
        raise _Rejected(f"unknown request kind {kind!r}; kinds: {', '.join(KINDS)}")
    row = conn.execute(sql.SQL("SELECT state FROM {} WHERE connector = %s FOR UPDATE").format(
        sql.Identifier(schema, "connector_state")), (name,)).fetchone()
    state = row[0] if row else NEVER_RUN

    def set_state(new_state: str) -> None:
        control.set_state(conn, schema, name, connector.type, new_state)

    if kind in (PAUSE, RESUME) and argument:
        return _pause_tables(conn, schema, connector, kind == PAUSE, argument, state)
    if kind == PAUSE:
        if state in _PAUSED:
            raise _Rejected(f"the connector is already {state}")
        set_state(control.PAUSED)
        return f"{state} -> paused", False
    if kind == RESUME:
        if state not in (*_PAUSED, control.STOPPED):
            raise _Rejected(f"only a paused or stopped connector resumes; it is {state}")
        set_state(control.SYNCING)
        control.clear_failures(conn, schema, name)
        return f"{state} -> syncing", True
    if kind == SET_OFFSET:
        if state not in _PAUSED:
            raise _Rejected(f"the offset moves only while the connector is paused; it is {state} "
                            f"(cdc-pipeline pause {name})")
        if not argument:
            raise _Rejected(f"set_offset needs the offset as its argument, e.g. {offsets.SHAPES[connector.type].example}")
        try:
            offset = offsets.parse_offset(argument, name, connector.type)
        except offsets.OffsetError as exc:
            raise _Rejected(exc.message) from None
        _require_no_running_cycle(conn, name)
        try:
            set_state(control.OFFSET_UPDATE)
            offsets.move_offset(conn, schema, name, connector.type, connector.database, offset)
            set_state(state)
        finally:
            control.release_run_lock(conn, name)
        return f"offset moved; {state} -> {control.OFFSET_UPDATE} -> {state}", False
    if kind == RESTART:
        if argument not in SNAPSHOT_MODES:
            raise _Rejected(f"restart needs a snapshot mode as its argument, one of: {', '.join(SNAPSHOT_MODES)}; "
                            f"got {argument!r}")
        if state in _PAUSED:
            raise _Rejected(f"the connector is {state}: resume it first (a restart would start a cycle)")
        if argument == "schemasync" and control.has_offset(conn, schema, name):
            raise _Rejected("schemasync creates the destination tables of a connector that has not replicated yet; "
                            "this one has an offset (restart with always to take its snapshot again)")
        set_state(control.RESTARTING)
        control.set_next_snapshot_mode(conn, schema, name, argument)
        return f"{state} -> restarting; its next cycle starts the engine with snapshot mode {argument}", True
    if kind == SNAPSHOT:
        tables = _snapshot_tables(connector, argument, state)
        paused = set(control.paused_tables(conn, schema, name)) & set(tables)
        if paused:
            raise _Rejected(f"{', '.join(sorted(paused))} paused: resume them instead (their resume copies them)")
        if bookkeeping.running_load(conn, schema, name) is not None:
            raise _Rejected("a bulk snapshot of the connector is still running; ask again when it is done "
                            f"(cdc-pipeline state {name})")
        bookkeeping.begin_load(conn, schema, name, tables)
        return (f"a bulk snapshot of {', '.join(tables)} begins with the connector's next cycle (their rows are "
                "replaced; the other tables keep streaming)"), True
    try:
        reloaded = load_config(config.path)
        connector = reloaded.connector(name)
    except ConfigError as exc:
        raise _Rejected(f"the connectors file does not read: {exc}") from None
    # A running cycle keeps the rules it started with: renaming under it is not allowed. The request waits for it (a
    # run that lingers or stands ends at its next cut once it sees the request pending).
    try:
        control.acquire_run_lock(conn, name)
    except CdcError:
        raise _Waits("waits for the connector's running fetch cycle, which ends at its next cut between source "
                     "transactions; served once it has ended") from None
    try:
        object_map = rule_store.reload_mapping(conn, schema, connector)
    except CdcError as exc:
        raise _Rejected(f"the destination cannot follow the mapping rules: {exc}") from None
    finally:
        control.release_run_lock(conn, name)
    return (f"{config.path} re-read and {len(object_map.rules)} mapping rules applied to the destination (renames and "
            "type changes); the next cycle uses them"), False


def _pause_tables(conn: psycopg.Connection, schema: str, connector: ConnectorConfig, pause: bool, argument: str,
                  state: str) -> tuple[str, bool]:
    """Pauses tables (`db.table`, `db.*`) of the connector alone: their row changes are let go while it streams on.
    Their resume copies them again with the bulk snapshot engine (their destination rows then match the source), so
    it needs that engine and no other bulk snapshot running."""
    name = connector.name
    tables = _named_tables(connector, argument, PAUSE if pause else RESUME)
    paused = set(control.paused_tables(conn, schema, name))
    if pause:
        if state == NEVER_RUN:
            raise _Rejected("the connector never ran: its first cycle copies every table; pause tables once it ran")
        if not connector.bulk_snapshot:
            raise _Rejected(f"pausing single tables needs the bulk snapshot engine (snapshot_engine: spark), which "
                            f"copies them on their resume; this connector takes Debezium's snapshot")
        control.set_tables_paused(conn, schema, name, tables, True)
        return (f"{', '.join(tables)} paused: their changes are let go while the other tables stream; resume them "
                f"with cdc-pipeline resume {name} {' '.join(tables)}"), False
    not_paused = [table for table in tables if table not in paused]
    if not_paused:
        raise _Rejected(f"not paused: {', '.join(not_paused)} (paused: {', '.join(sorted(paused)) or 'none'})")
    if bookkeeping.running_load(conn, schema, name) is not None:
        raise _Rejected("a bulk snapshot of the connector is still running; ask again when it is done "
                        f"(cdc-pipeline state {name})")
    control.set_tables_paused(conn, schema, name, tables, False)
    bookkeeping.begin_load(conn, schema, name, tables)
    return (f"{', '.join(tables)} resumed: the connector's next cycle copies them again (their changes were let go "
            "while they were paused)"), True


def _named_tables(connector: ConnectorConfig, argument: str | None, kind: str) -> list[str]:
    """The tables a request names (`db.table`, or `db.*` for every table of a database, separated by commas or
    spaces), each one of the connector's."""
    tables = list(dict.fromkeys(part for part in (argument or "").replace(",", " ").split() if part))
    if not tables:
        raise _Rejected(f"{kind} needs the tables as its argument, e.g. db.table1,db.table2 or db.* (every table of "
                        "a database)")
    foreign = [table for table in tables if not (module_for(connector.type).replicates(connector, table)
                                                 if table.endswith(".*") else captures(connector, table))]
    if foreign:
        raise _Rejected(f"not tables of the connector: {', '.join(foreign)} (tables are named db.table, within "
                        f"the connector's databases ({connector.databases_text}) and its include list)")
    return tables


def _snapshot_tables(connector: ConnectorConfig, argument: str | None, state: str) -> list[str]:
    """The tables a snapshot request names (`db.table`, separated by commas or spaces), checked."""
    if not connector.bulk_snapshot:
        raise _Rejected(f"snapshotting single tables needs the bulk snapshot engine (snapshot_engine: spark); this "
                        f"connector takes Debezium's snapshot (restart {connector.name} always takes it again)")
    if state in _PAUSED or state == NEVER_RUN:
        raise _Rejected(f"the connector is {state}: " + ("resume it first" if state in _PAUSED else
                                                         "its first cycle takes the snapshot of every table"))
    return _named_tables(connector, argument, SNAPSHOT)


def _require_no_running_cycle(conn: psycopg.Connection, connector: str) -> None:
    """Takes the connector's run lock (released by the caller), or rejects: a running cycle's engine would flush
    its own offset over the new one."""
    try:
        control.acquire_run_lock(conn, connector)
    except CdcError:
        raise _Rejected("a fetch cycle of the connector is still running (it ends at its next batch boundary); "
                        "ask again when it has ended") from None

