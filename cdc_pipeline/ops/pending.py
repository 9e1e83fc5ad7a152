"""Whether a connector has work, told cheaply and without a JVM: what the `trigger: changes` sensor asks before it
launches a run (`cdc-pipeline pending NAME` asks the same).

A connector has work when it never ran, when its bulk snapshot is not finished, or when its source holds changes it
has not applied:
- MariaDB/MySQL: a run that ends idle records the source's binlog position from the start of its idle wait
  (`connector_state.source_checked`: everything before it was read). The check reads the binlog from there
  (`SHOW BINLOG EVENTS`, a bounded number of events per check) for a row event of a captured table or a schema
  change of the database; events of other tables and databases move the recorded position on, so writes
  elsewhere on the server launch nothing.
- PostgreSQL: the connector's replication slot is peeked (`pg_logical_slot_peek_binary_changes`, nothing is
  consumed) for a change of its publication after the last one applied. (Decoding reads the WAL flushed: with
  `synchronous_commit=off` a change shows within `wal_writer_delay`.) A slot holding more WAL than
  `retained_wal_run_mb` after its confirmed position also asks for a run, which confirms it past that WAL.
- SQL Server and Oracle have no such check here: every check says there is work (the schedule's behaviour).
A paused connector has none; nor has one whose last run failed, under error_strategy exit until it is resumed,
under retry and skip until its backoff has passed (`control.failure_hold`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc_pipeline import bulk_load, control
from cdc_pipeline.config import ConnectorConfig, DestinationConfig
from cdc_pipeline.sources import captures, mariadb, postgres

log = logging.getLogger(__name__)

BINLOG_EVENTS_PER_CHECK = 20_000


@dataclass(frozen=True)
class Pending:
    """Whether the connector has work, and why (or why not), for the sensor's log and the CLI."""

    work: bool
    reason: str


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
        if bulk_load.running_load(conn, schema, name) is not None:
            return Pending(True, "its bulk snapshot is not finished")
        if connector.type in ("mariadb", "mysql"):
            return _binlog(conn, schema, connector, state.get("source_checked"))
        if connector.type == "postgres":
            applied = control.read_applied_offset(conn, schema, name) or {}
            return _slot(connector, int(applied.get("lsn") or 0))
    return Pending(True, f"no change check for {connector.type} sources: every check launches a run")


def _binlog(conn: psycopg.Connection, schema: str, connector: ConnectorConfig, checked: Any) -> Pending:
    if not checked:
        return Pending(True, "no source position is recorded as applied yet (the last run did not end idle)")
    start = checked if isinstance(checked, dict) else json.loads(checked)
    with mariadb.connect(connector) as source, source.cursor() as cur:
        if mariadb.binlog_position(cur) == start:
            return Pending(False, f"no binlog event since {start['file']}:{start['pos']}")
        found, reached = mariadb.scan_binlog(cur, start, lambda table: captures(connector, table),
                                             connector.database, BINLOG_EVENTS_PER_CHECK)
    if found:
        return Pending(True, found)
    if reached != start:
        control.record_source_checked(conn, schema, connector.name, reached)
    return Pending(False, f"no change of the connector's tables up to {reached['file']}:{reached['pos']}")


def _slot(connector: ConnectorConfig, applied_lsn: int) -> Pending:
    slot = connector.replication_slot
    peeked = postgres.peek_slot(connector, applied_lsn)
    if peeked is None:
        return Pending(True, f"replication slot {slot} does not exist yet")
    if peeked.active:
        return Pending(False, f"replication slot {slot} is in use")
    if peeked.changes or peeked.messages >= postgres.SLOT_PEEK_MESSAGES:
        return Pending(True, f"replication slot {slot} holds changes of publication {slot}")
    unconfirmed_mb = peeked.unconfirmed_wal_bytes >> 20
    if unconfirmed_mb >= connector.retained_wal_run_mb:
        # Only other tables were written: a run confirms the slot past their WAL (the heartbeat), and the source
        # may remove it.
        return Pending(True, f"replication slot {slot} holds {unconfirmed_mb} MB of unconfirmed WAL "
                             f"(retained_wal_run_mb {connector.retained_wal_run_mb})")
    return Pending(False, f"replication slot {slot} holds no change ({unconfirmed_mb} MB of unconfirmed WAL)")
