"""Whether a connector has work, told cheaply and without a JVM: what the `trigger: changes` sensor asks before it
launches a run (`cdc-pipeline pending NAME` asks the same).

A connector has work when it never ran, when its bulk snapshot is not finished, or when its source holds changes it
has not applied, which its source type's module tells (`check_changes`):
- MariaDB/MySQL: a run that ends idle records the source's binlog position from the start of its idle wait
  (`connector_state.source_checked`: everything before it was read). The check reads the binlog from there
  (`SHOW BINLOG EVENTS`, a bounded number of events per check) for a row event of a captured table or a schema
  change of the database; events of other tables and databases move the recorded position on, so writes
  elsewhere on the server launch nothing.
- PostgreSQL: the connector's replication slot is peeked (`pg_logical_slot_peek_binary_changes`, nothing is
  consumed) for a change of its publication after the last one applied. (Decoding reads the WAL flushed: with
  `synchronous_commit=off` a change shows within `wal_writer_delay`.) A slot holding more WAL than
  `retained_wal_run_mb` after its confirmed position also asks for a run, which confirms it past that WAL.
- SQL Server and Oracle have no such check: every check says there is work (the schedule's behaviour).
A paused connector has none; nor has one whose last run failed, under error_strategy exit until it is resumed,
under retry and skip until its backoff has passed (`control.failure_hold`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from cdc_pipeline import bulk_load, control, sources
from cdc_pipeline.config import ConnectorConfig, DestinationConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pending:
    """Whether the connector has work, and why (or why not), for the sensor's log and the CLI."""

    work: bool
    reason: str


def check(connector: ConnectorConfig, destination: DestinationConfig) -> Pending:
    """Whether a run of the connector would find work now."""
    schema, name = destination.control_schema, connector.name
    source = sources.module_for(connector.type)
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
        if not hasattr(source, "check_changes"):
            return Pending(True, f"no change check for {connector.type} sources: every check launches a run")
        found = source.check_changes(connector, state.get("source_checked"),
                                     control.read_applied_offset(conn, schema, name) or {},
                                     lambda table: sources.captures(connector, table))
        if found.checked is not None:
            control.record_source_checked(conn, schema, name, found.checked)
    return Pending(found.changes, found.reason)
