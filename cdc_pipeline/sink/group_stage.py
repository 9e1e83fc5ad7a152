"""The group's one Spark job and one staging COPY: the net changes of its keyed steps, up to its first step of
another kind, staged by Spark's tasks into the connector's staging table (`stage_copy`) in one job whatever the
number of tables, tables of one shape sharing one projection; then one query checks what every step staged (the
count the tasks committed, the zero dates, the sets of columns left out). The merge round (`merge_round`) merges them.
"""

from __future__ import annotations

import itertools
import json
import logging
from contextlib import nullcontext

import psycopg
from psycopg import sql
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.convert.dml import may_hold_zero_dates, may_leave_values_out, unavailable_placeholder
from cdc_pipeline.convert.dml_lines import STAGE_STEP, DmlLines, compact_shared_rows
from cdc_pipeline.convert.schema_infer import SCHEMA_FROM_EVENTS_TYPES
from cdc_pipeline.decode.events import fail_on_malformed
from cdc_pipeline.errors import StagingMismatchError
from cdc_pipeline.sink import stage_copy
from cdc_pipeline.sink.dead_letters import SKIPPABLE_ERRORS, SPARK_ERRORS, spark_failure
from cdc_pipeline.sink.destination_tables import DestinationTables
from cdc_pipeline.sink.key_moves import steps_moving_toasted_keys
from cdc_pipeline.sink.merge_round import StagedStep, drops_superseded, is_last_change
from cdc_pipeline.sink.plan import BatchPlan, DmlStep
from cdc_pipeline.sink.stage_copy import ExecutorStaging

log = logging.getLogger(__name__)

# A group's staged steps, by value schema: each row's target (its index in the group's staging targets), the shape
# of its table (which shared line it takes), its step's seq range, and its columns' source and destination names.
_STAGE_LOOKUP_TYPE = ("map<string, struct<target: string, shape: string, first: bigint, last: bigint, "
                      "names: array<string>, dests: array<string>>>")


class GroupStage:
    """Stages a group's keyed steps for its merge round: one Spark job, one COPY per task, one query to check them."""

    def __init__(self, connector: ConnectorConfig, tables: DestinationTables, staging: ExecutorStaging | None,
                 lines: DmlLines) -> None:
        self.connector = connector
        self.tables = tables
        # Without staging (`apply_copy: driver`) every step takes its own path.
        self.staging = staging
        self.lines = lines

    def stage(self, cur: psycopg.Cursor, plan: BatchPlan, skip: bool) -> dict[int, StagedStep]:
        """Stages the net changes of the group's keyed steps, up to its first step of another kind, in one Spark
        job, and checks what was staged with one query; returns them by their index in the plan.

        Tables of one shape share one expression (`DmlLines.shared_stage`): each row finds its step, its target and
        its columns' names in a lookup keyed by its value schema, so a group's job is planned once per shape of
        table, not once per table, and its compiled code serves every later group.

        Where a change may leave a TOASTed value out, Spark keeps each key's last change per step (`_shape_rows`).
        Left to their own path: steps after a step of another kind (a schema change alters their columns), from a
        table's second step on (its columns may change between the two), keyless tables, steps with transforms (a
        failing transform is traced to its value there) and key updates that leave TOASTed values out. A step whose
        destination cannot be prepared ends the staging here: its own path raises (or, under `skip`, sets its events
        aside) in its place in the plan.
        """
        events = plan.parsed.events
        if self.staging is None or events is None:
            return {}
        chosen: dict[int, StagedStep] = {}
        placeholder = unavailable_placeholder(self.connector)
        may_alter = self.connector.type in SCHEMA_FROM_EVENTS_TYPES
        leading = list(itertools.takewhile(lambda step: isinstance(step, DmlStep), plan.steps))
        self.tables.claim_all(cur, leading)
        self.tables.catalog.prefetch(cur, [self.tables.names(step.source_table) for step in leading])
        moved = steps_moving_toasted_keys(plan, leading, placeholder)
        for index, step in enumerate(leading):
            if any(other.step.source_table == step.source_table for other in chosen.values()):
                break
            try:
                # Under `skip` a failure must leave the transaction usable: a table the events alter gets a savepoint.
                with self.tables.savepoint() if skip and may_alter else nullcontext():
                    prepared = self.tables.prepare_dml(cur, step)
            except SKIPPABLE_ERRORS:
                if not skip:
                    raise
                break
            by_dest = {column.dest_name: column for column in prepared.columns}
            if not prepared.key or prepared.transforms or any(name not in by_dest for name in prepared.key):
                continue
            key_columns = [by_dest[name] for name in prepared.key]
            if id(step) in moved:
                continue
            chosen[index] = StagedStep(step, prepared, key_columns,
                                       may_leave_values_out(prepared.columns, placeholder), self.staging.table)
        if not chosen:
            return {}
        staged_steps = list(chosen.values())
        lookup: dict[str, dict] = {}
        shapes: dict[str, tuple[str, Column, StagedStep]] = {}  # a shared line's text -> (its shape, the line, a step)
        for target, staged_step in enumerate(staged_steps):
            line, text = self.lines.shared_stage(staged_step.prepared.columns, staged_step.key_columns,
                                                  placeholder if staged_step.compacted_in_spark else None)
            shape, _, _ = shapes.setdefault(text, (str(len(shapes)), line, staged_step))
            step = staged_step.step
            lookup[step.schema_id] = {"target": str(target), "shape": shape, "first": step.first_seq,
                                      "last": step.last_seq,
                                      "names": [column.source_name for column in staged_step.prepared.columns],
                                      "dests": [column.dest_name for column in staged_step.prepared.columns]}
        # The lookup is a literal: Spark folds it into a map constant, kept out of the code it generates. Read with
        # element_at, which Spark computes once per row (`map[key]` it would repeat at every use of a name).
        found = F.element_at(F.from_json(F.lit(json.dumps(lookup)), _STAGE_LOOKUP_TYPE), F.col("schema_id"))
        rows = fail_on_malformed(events).select("seq", "op", "before", "after", found.alias(STAGE_STEP)).where(
            F.col(f"{STAGE_STEP}.first").isNotNull()
            & F.col("seq").between(F.col(f"{STAGE_STEP}.first"), F.col(f"{STAGE_STEP}.last")))
        frames = [(self._shape_rows(rows.where(F.col(f"{STAGE_STEP}.shape") == F.lit(shape)), example, placeholder)
                   .select(F.col(f"{STAGE_STEP}.target"), line), len(example.prepared.columns))
                  for shape, line, example in shapes.values()]
        try:
            written = self.staging.write_tagged(frames, [len(s.prepared.columns) for s in staged_steps])
        except SPARK_ERRORS as exc:
            message, _ = spark_failure(exc)
            log.info("%s: staging the group's %d steps failed (%s); each step is staged on its own to name the event",
                     self.connector.name, len(staged_steps), message)
            return {}
        for staged_step, (number, _) in zip(staged_steps, written):
            staged_step.number = number
        self._read_staged(cur, staged_steps, [staged for _, staged in written])
        return chosen

    @staticmethod
    def _shape_rows(rows: DataFrame, example: StagedStep, placeholder: str | None) -> DataFrame:
        """The rows of one shape of table, each key's last change kept in Spark where a change may leave a TOASTed
        value out (`compact_shared_rows`, per step: keys of two tables are never compared)."""
        if not example.compacted_in_spark:
            return rows
        return compact_shared_rows(rows, example.prepared.columns, example.key_columns, placeholder)

    def _read_staged(self, cur: psycopg.Cursor, staged_steps: list[StagedStep], staged: list[int]) -> None:
        """One query for the whole group: per step, the rows the batch's transaction sees (raises
        StagingMismatchError unless they are those the tasks committed), the zero dates its merge writes as NULL,
        and the sets of unchanged columns its upserts leave out."""
        branches = []
        for index, s in enumerate(staged_steps):
            step_rows = sql.SQL("SELECT {op}, {z}, {u}, {last} AS last FROM {s} WHERE {step} = {n}").format(
                op=sql.Identifier(stage_copy.OP), z=sql.Identifier(stage_copy.ZERO_DATES),
                u=sql.Identifier(stage_copy.UNCHANGED), s=s.staging, step=sql.Identifier(stage_copy.STEP),
                n=sql.Literal(s.number),
                last=is_last_change(s.number, s.key_columns, s.prepared.columns)
                if drops_superseded(s) and may_hold_zero_dates(s.prepared.columns) else sql.SQL("true"))
            branches.append(sql.SQL(
                "SELECT {i}, pg_catalog.count(*), coalesce(sum({z}) FILTER (WHERE {op} <> 'd' AND last), 0), "
                "coalesce(array_agg(DISTINCT {u}) FILTER (WHERE {op} <> 'd' AND last), '{{}}') FROM ({rows}) AS w"
            ).format(i=sql.Literal(index), z=sql.Identifier(stage_copy.ZERO_DATES),
                     op=sql.Identifier(stage_copy.OP), u=sql.Identifier(stage_copy.UNCHANGED), rows=step_rows))
        seen = {row[0]: row[1:] for row in cur.execute(sql.SQL(" UNION ALL ").join(branches)).fetchall()}
        for index, s in enumerate(staged_steps):
            rows, zero_dates, unchanged_sets = seen[index]
            if rows != staged[index]:
                raise StagingMismatchError(
                    f"the merge sees {rows} of the {staged[index]} rows Spark's tasks staged in "
                    f"{s.staging.as_string(cur)} (events {s.step.first_seq}..{s.step.last_seq} of the batch): the "
                    "batch is not applied", connector=self.connector.name, table=s.step.source_table,
                    position=s.step.last_ref.position if s.step.last_ref else None)
            s.zero_dates, s.unchanged_sets = int(zero_dates), sorted(unchanged_sets)
