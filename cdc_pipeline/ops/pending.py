"""Whether a connector has work, told cheaply and without a JVM: what the `trigger: changes` sensor asks before it
launches a run (`cdc-pipeline pending NAME` asks the same).

A connector has work when it never ran, when its bulk snapshot is not finished, or when its source holds changes it
has not applied, which its source type's module tells (`check_changes`):
- MariaDB/MySQL: a run that ends idle records the source's binlog end from the middle of its idle wait, once its
  log reader read past it (`connector_state.source_checked`: every change before it was applied). The check reads
  the binlog from there up to where it ended when the check began (`SHOW BINLOG EVENTS`, page by page, for at most
  a few seconds) for a row event of a captured table or a schema change of the database; events of other tables
  and databases move the recorded position on, so writes elsewhere on the server launch nothing. A check out of
  time before the end says there is work (a busy server's other databases): the run reads the rest and records
  where it ended idle.
- PostgreSQL: the connector's replication slot is peeked (`pg_logical_slot_peek_binary_changes`, nothing is
  consumed) for a change of its publication after the last one applied. (Decoding reads the WAL flushed: with
  `synchronous_commit=off` a change shows within `wal_writer_delay`.) A slot holding more WAL than
  `retained_wal_run_mb` after its confirmed position also asks for a run, which confirms it past that WAL.
- SQL Server: `sys.fn_cdc_get_max_lsn()` not past the applied `commit_lsn` is nothing new; past it, each capture
  instance of a captured table is asked for a row after the applied position (writes to other captured tables move
  the max LSN too). A position the cleanup job removed changes after (a capture instance's oldest LSN is later) is
  said, and launches nothing: the changes are gone, and Debezium would read on without them.
- Oracle: the SCN moves with any activity of the database, so the redo since the applied position is mined with
  LogMiner (archived redo up to `CHECK_REDO_BYTES` of `sources/oracle/checks.py`, for `CHECK_SECONDS`) for a change
  of a captured table the connector has not applied; more redo asks for a run. A position older than every redo log the database
  keeps is said, and launches nothing (Debezium cannot resume from it).
Only a check that read the source to its end tells that there is nothing to do (`Pending.caught_up`, what `sync`
asks in `nothing_to_do`).
A connector in a state where no cycle starts (paused, schema sync done, offset update: `control.HALTED_STATES`) has
none, and neither has one whose fetch cycle runs now (its run lock is held: a run the sensor did not launch, such
as a materialization of its assets or `cdc-pipeline sync`). `stopped` is not one of those: a connector whose last run failed has none under error_strategy exit until it
is resumed, and under retry and skip until its backoff has passed (`control.failure_hold`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc_pipeline import control, sources
from cdc_pipeline.bulk_load import bookkeeping
from cdc_pipeline.mapping import rule_store
from cdc_pipeline.config import ConnectorConfig, DestinationConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pending:
    """Whether the connector has work, and why (or why not), for the sensor's log and the CLI."""

    work: bool
    reason: str
    known: bool = True  # False: no run is asked for, though the source could not be checked (a slot in use)
    caught_up: bool = False  # the source was checked to its end and holds nothing the connector has not applied
    # The source was checked and holds nothing for the connector as far as it was read (not: paused, held, running).
    idle: bool = False


def check(connector: ConnectorConfig, destination: DestinationConfig) -> Pending:
    """Whether a run of the connector would find work now."""
    schema, name = destination.control_schema, connector.name
    with destination.connect(connector.name) as conn:
        control.ensure_control_schema(conn, schema)
        state = control.read_state(conn, schema, name)
        if state is None:
            return Pending(True, "the connector has not run yet")
        if state["state"] in control.HALTED_STATES:
            return Pending(False, f"the connector is {state['state']}")
        held = control.failure_hold(state, connector)
        if held is not None:
            return Pending(False, held)
        if control.run_lock_held(conn, name):
            return Pending(False, "a fetch cycle of the connector is running (its run lock is held)", known=False)
        if bookkeeping.running_load(conn, schema, name) is not None:
            return Pending(True, "its bulk snapshot is not finished")
        return _source_check(conn, schema, connector, state)


def _source_check(conn: psycopg.Connection, schema: str, connector: ConnectorConfig, state: dict[str, Any]) -> Pending:
    """The source type's change check from where the connector's state says it applied (records how far a binlog
    was read when only other tables' changes were found)."""
    name = connector.name
    source = sources.module_for(connector.type)
    if source.check_changes is None:
        return Pending(True, f"no change check for {connector.type} sources: every check launches a run")
    found = source.check_changes(connector, state.get("source_checked"), checked_offset(conn, schema, name, source),
                                 lambda table: sources.captures(connector, table))
    if found.checked is not None and _recorded_checked(conn, schema, name) == state.get("source_checked"):
        control.record_source_checked(conn, schema, name, found.checked)
    return Pending(found.changes, found.reason, found.known,
                   caught_up=not found.changes and found.known and found.reached_end,
                   idle=not found.changes and found.known and not control.requests_pending(conn, schema, name))


def checked_offset(conn: psycopg.Connection, schema: str, name: str, source: Any) -> dict[str, Any]:
    """The offset the change check starts from: the last event applied, or (SQL Server, Oracle: `check_position`)
    the engine's stored offset when it is later. Their offsets move on without events to apply (a finished
    snapshot's, a heartbeat's), and their engine stores an offset only once what precedes it is applied."""
    applied = control.read_applied_offset(conn, schema, name) or {}
    if source.check_position is None:
        return applied
    engine = control.read_engine_offset(conn, schema, name)
    later = engine is not None and (source.check_position(engine) or ()) > (source.check_position(applied) or ())
    return engine if later else applied


def _recorded_checked(conn: psycopg.Connection, schema: str, name: str) -> Any:
    """The source position recorded as checked now: a run that ended idle while a check read the source (a sync or a
    materialization the sensor did not launch) recorded its own, later one, which the check leaves."""
    return (control.read_state(conn, schema, name) or {}).get("source_checked")


def nothing_to_do(connector: ConnectorConfig, destination: DestinationConfig) -> str | None:
    """Why a run of the connector asked for now would find nothing to do, told without a JVM, or None when it
    may find work: `cdc-pipeline sync` then ends without starting Spark or Debezium.

    Only a connector whose last run succeeded, under the same configuration, with the positions it left (no offset
    set or moved since: `control.run_digest`), and that has nothing pending qualifies: no restart or snapshot request, no bulk snapshot running or to reconcile, an engine offset outside a
    snapshot, and no change of its tables in the source (the change check above). The mapping rules are re-read as
    a run does (renames and retypes are applied), under the run lock."""
    schema, name = destination.control_schema, connector.name
    if sources.module_for(connector.type).check_changes is None:
        return None
    with destination.connect(name) as conn:
        control.ensure_control_schema(conn, schema)
        control.acquire_run_lock(conn, name)
        try:
            state = control.read_state(conn, schema, name)
            if not state or state["state"] != control.SYNCING or state.get("next_snapshot_mode") \
                    or state.get("run_digest") != control.run_digest(conn, schema, name,
                                                                      connector.fingerprint(destination)) \
                    or not control.has_offset(conn, schema, name) \
                    or control.offset_in_snapshot(conn, schema, name) \
                    or bookkeeping.running_load(conn, schema, name) is not None \
                    or bookkeeping.unreconciled_end(conn, schema, name) is not None:
                return None
            found = _source_check(conn, schema, connector, state)
            if found.work or not found.caught_up:
                return None
            rule_store.reload_mapping(conn, schema, connector)
            return found.reason
        finally:
            control.release_run_lock(conn, name)
