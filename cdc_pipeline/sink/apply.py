"""Applying a batch's plan (`plan.py`) to the destination in one transaction, with its applied position: one group,
one job, one staging, one merge round.

`BatchApplier` conducts: the group's transaction (with the applied position, or a dead letter's retry), the row
changes of paused and unseen tables let go, then the stages in order: the group's keyed steps staged by one Spark
job and one COPY (`group_stage`), merged in rounds sent together (`merge_round`), and every other step on its own
path (`steps`: DDL, truncates, snapshot steps, and DML steps through `dml_step`, `key_moves` and `keyless`), in a
savepoint that sets failing events aside under `skip` (`dead_letters`). The run's reads of the destination are kept
in `destination_tables`; the lines Spark writes are built by `convert/dml_lines.py`.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from cdc_pipeline import control, faults
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.convert.dml_lines import DmlLines
from cdc_pipeline.errors import CdcError
from cdc_pipeline.mapping import objmap, rule_store
from cdc_pipeline.sink import unseen_tables
from cdc_pipeline.sink.dead_letters import SKIP, DeadLetters
from cdc_pipeline.sink.destination_tables import DestinationTables
from cdc_pipeline.sink.dml_step import DmlStepPath
from cdc_pipeline.sink.group_stage import GroupStage
from cdc_pipeline.sink.merge_round import StagedStep, merge_round
from cdc_pipeline.sink.plan import BatchPlan, DdlStep, DmlStep, SnapshotStep, TruncateStep, table_counts
from cdc_pipeline.sink.stage_copy import ExecutorStaging
from cdc_pipeline.sink.steps import StepPath

log = logging.getLogger(__name__)


class BatchApplier:
    """Applies batch plans of one connector to the destination, each in one transaction."""

    def __init__(self, conn: psycopg.Connection, connector: ConnectorConfig, control_schema: str,
                 object_map: objmap.ObjectMap | None = None, staging: ExecutorStaging | None = None) -> None:
        self.conn = conn
        self.connector = connector
        self.control_schema = control_schema
        self.object_map = object_map or objmap.ObjectMap(connector)
        # With staging, Spark's tasks COPY a keyed step's rows into the destination (`stage_copy`); without, the
        # driver collects them and COPYs them.
        self.staging = staging
        # The run's reads of the destination: forgotten at a schema change and when a transaction that may have
        # changed them is undone (`forget_run_reads`).
        self._tables = DestinationTables(conn, connector, control_schema, self.object_map)
        self._dead_letters = DeadLetters(conn, connector, control_schema, self._tables)
        lines = DmlLines()
        self._group = GroupStage(connector, self._tables, staging, lines)
        self._steps = StepPath(connector, control_schema, self._tables,
                               DmlStepPath(conn, connector, self._tables, staging, lines, self._dead_letters))
        self._unseen_reported: set[str] = set()  # tables whose changes were let go, said once a run

    def apply(self, plan: BatchPlan, *, dead_letter: int | None = None) -> control.BatchCounts:
        """Applies every step and records the batch's position, all in one transaction; returns the counts.

        Under the `skip` error strategy each step runs in a savepoint; a step that fails is narrowed down to the
        events that fail (`dead_letters`), which go to the dead letters while the rest of the batch applies.
        `dead_letter`: the plan replays that dead letter (`cdc-pipeline dead-letters retry`): it is marked retried
        and its counts move from the bad events to its kind; the applied position stays where it is.
        """
        self._dead_letters.begin(plan.parsed.refs)
        # Inside a transaction that spans groups (`cycle.TransactionSpan`), which holds the staging table read.
        held = self.conn.info.transaction_status != TransactionStatus.IDLE
        if self.staging is not None:
            self.staging.held = held
            self.staging.clear()
            # Widened before the transaction: once a step of it read the staging table, its lock would hold an
            # ALTER up.
            self.staging.ensure_width(max((len(step.fields) for step in plan.steps if isinstance(step, DmlStep)),
                                          default=0))
        try:
            return self._apply_in_transaction(plan, dead_letter, held)
        except BaseException:
            self.forget_run_reads()
            raise

    def forget_run_reads(self) -> None:
        """Forgets the catalog facts and claims read in this run: a transaction that wrote them was undone."""
        self._tables.forget()

    def _apply_in_transaction(self, plan: BatchPlan, dead_letter: int | None, held: bool) -> control.BatchCounts:
        skip = self.connector.error_strategy == SKIP and dead_letter is None
        with self.conn.transaction(), self.conn.cursor() as cur:
            if not held:  # (a savepoint's isolation is its transaction's)
                faults.take_snapshot_early(cur)
            plan = self._without_paused_tables(cur, self._without_unseen_tables(cur, plan))
            self._apply_steps(cur, plan, skip)
            control.record_table_counts(cur, self.control_schema, self.connector.name, table_counts(plan))
            if dead_letter is not None:
                if not control.resolve_dead_letter(cur, self.control_schema, dead_letter, control.DEAD_LETTER_RETRIED):
                    raise CdcError(f"dead letter {dead_letter} is no longer pending", connector=self.connector.name)
                control.record_dead_letter_applied(cur, self.control_schema, self.connector.name, plan.counts)
                return plan.counts
            if plan.retired_positions:
                control.retire_snapshot_positions(cur, self.control_schema, self.connector.name,
                                                  plan.retired_positions)
            last = plan.last_ref
            control.record_batch_applied(
                cur, self.control_schema, self.connector.name, plan.counts,
                source_position=last.position if last else {}, debezium_offset=plan.parsed.batch.last_offset)
            faults.pause_point(faults.IN_TRANSACTION)
        return plan.counts

    def _without_paused_tables(self, cur: psycopg.Cursor, plan: BatchPlan) -> BatchPlan:
        """The plan without the row changes of the connector's tables paused alone (`pause NAME TABLE...`): they are
        let go, and the table's resume copies it again. Their schema changes still apply: the copy needs the table's
        definition."""
        paused = control.paused_tables(cur, self.control_schema, self.connector.name)
        if not paused:
            return plan
        names = set(paused)
        databases = {name[:-2] for name in paused if name.endswith(".*")}

        def let_go(step: Any) -> bool:
            return isinstance(step, (DmlStep, TruncateStep)) and (
                step.source_table in names or self.connector.split_table(step.source_table)[0] in databases)

        kept = [step for step in plan.steps if not let_go(step)]
        return plan if len(kept) == len(plan.steps) else replace(plan, steps=kept)

    def _without_unseen_tables(self, cur: psycopg.Cursor, plan: BatchPlan) -> BatchPlan:
        """The plan without the row changes of tables the stream never created and no load copied (a database that
        came to match `databases`: Debezium's history knows its tables, the destination has none): a load copies
        them (`unseen_tables`, begun at the stream's idle end) after these changes, so they are let go, not failed."""
        if not self.connector.bulk_snapshot or not unseen_tables.creates_tables(self.connector):
            return plan
        created = {change.source_table for step in plan.steps if isinstance(step, DdlStep) for change in step.changes}
        candidates = {step.source_table for step in plan.steps if isinstance(step, (DmlStep, TruncateStep))
                      and step.source_table not in created}
        if not candidates:
            return plan
        missing = {table for table in candidates if self._tables.catalog.table(cur, *self._tables.names(table)) is None}
        if not missing:
            return plan
        unseen = missing - set(rule_store.owned_source_tables(cur, self.control_schema, self.connector.name))
        if not unseen:
            return plan
        for table in sorted(unseen - self._unseen_reported):
            log.warning("%s: changes of %s let go: the stream never created its table (its database came to match, or "
                        "it was created outside the binlog); a load copies it once the stream is idle",
                        self.connector.name, table)
        self._unseen_reported |= unseen
        return replace(plan, steps=[step for step in plan.steps if not (
            isinstance(step, (DmlStep, TruncateStep)) and step.source_table in unseen)])

    def _apply_steps(self, cur: psycopg.Cursor, plan: BatchPlan, skip: bool) -> None:
        """Applies the plan's steps in order. The keyed steps staged together (`GroupStage.stage`: one Spark job,
        one staging COPY) are merged in rounds of consecutive steps, each round sent without a round trip per
        statement (`merge_round`); every other step, and every step of a round the destination refused, takes its
        own path in its place (`StepPath.apply`; under `skip`, in a savepoint that sets its failing events aside)."""
        staged = self._group.stage(cur, plan, skip)

        def apply_alone(step: DdlStep | DmlStep | TruncateStep | SnapshotStep) -> None:
            if skip:
                self._dead_letters.apply_or_set_aside(cur, plan, step, self._steps.apply)
            else:
                self._steps.apply(cur, plan, step)

        round_steps: list[StagedStep] = []
        for index, step in enumerate(plan.steps):
            staged_step = staged.get(index)
            if staged_step is not None:
                round_steps.append(staged_step)
                continue
            merge_round(self.conn, cur, plan, round_steps, self.connector.name, apply_alone)
            round_steps = []
            apply_alone(step)
        merge_round(self.conn, cur, plan, round_steps, self.connector.name, apply_alone)
