"""Applying a batch's plan (`plan.py`) to the destination in one transaction, with its applied position.

DDL steps run as statements; DML segments are applied set-wise: converted per column in Spark, loaded with COPY into
a staging table (by Spark's tasks, or by the driver), compacted per primary key to each key's last change (in the
destination from the tasks' staged rows; in Spark for the driver's path, and where an unchanged TOASTed value must
come from an earlier change), then merged.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections import Counter, OrderedDict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Collection, Iterable, Iterator

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_pipeline import control, faults

from cdc_pipeline.mapping import objmap, rule_store, transform_sql

from cdc_pipeline.sink import deferred_keys, stage_copy, unseen_tables
from cdc_pipeline.catalog import CatalogCache, destination_table
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.copy_text import copy_escape
from cdc_pipeline.convert.ddl import (
    DROP_DATABASE,
    DdlChange,
    alter_table_sql,
    create_table_sql,
    drop_table_sql,
    rename_table_sql,
)
from cdc_pipeline.convert.dml import (
    ColumnKeys,
    ColumnPlan,
    apply_error,
    compact_by_key,
    copy_line,
    may_hold_zero_dates,
    may_leave_values_out,
    parse_copy_line,
    placeholder_forms,
    plan_columns,
    unavailable_placeholder,
    unchanged_columns,
    zero_dates,
)
from cdc_pipeline.errors import CdcError, ConversionError, StagingMismatchError, TableOwnerError
from cdc_pipeline.decode.events import (
    BEGIN,
    DATA_CHANGE,
    SCHEMA_CHANGE,
    TRUNCATE,
    EventRef,
    fail_on_malformed,
    index_entry_of,
)
from cdc_pipeline.convert.schema_infer import SCHEMA_FROM_EVENTS_TYPES, ensure_table_matches
from cdc_pipeline.capture.spark import collect_lines
from cdc_pipeline.sink.plan import (
    DML_COUNTERS,
    SNAPSHOT_END,
    SNAPSHOT_RESTART,
    BatchPlan,
    DdlStep,
    DmlStep,
    SnapshotStep,
    TruncateStep,
    snapshot_reads,
    table_counts,
    with_frame,
)
from cdc_pipeline.sink.stage_copy import ExecutorStaging
from cdc_pipeline.catalog import DestinationTable
from cdc_pipeline.sources import captures

log = logging.getLogger(__name__)

_COPY_CHUNK = 1 << 20
SKIP = "skip"
# Spark's failures: PySpark's own exceptions, or Py4JJavaError from a call made through py4j directly.
SPARK_ERRORS = (PySparkException, Py4JJavaError)
# What a step may fail with because of its events (a value the destination refuses, a conversion, a transform).
SKIPPABLE_ERRORS = (psycopg.Error, CdcError, *SPARK_ERRORS)
# The message of Spark's raise_error (a malformed event line) and the seq it names.
_RAISED_IN_SPARK = re.compile(r"\[USER_RAISED_EXCEPTION\] (.*?)(?: SQLSTATE: \w+)?$", re.MULTILINE)
_SEQ_IN_MESSAGE = re.compile(r"\(seq (\d+)\b")
# Line expressions kept per applier, the least recently used dropped first: two per table version, for schemas of a
# few thousand tables.
_EXPRESSION_CACHE_SIZE = 8192
# A group's staged steps, by value schema: each row's target (its index in the group's staging targets), the shape
# of its table (which shared line it takes), its step's seq range, and its columns' source and destination names.
_STAGE_STEP = "_cdc_step"
_STAGE_LOOKUP_TYPE = ("map<string, struct<target: string, shape: string, first: bigint, last: bigint, "
                      "names: array<string>, dests: array<string>>>")


@dataclass
class KeyMove:
    """A key update whose new row leaves unchanged TOASTed values out: the seqs of its delete and create, the old
    key's values and the new row's (COPY text values, in key and column order), and the columns left out."""

    delete_seq: int
    create_seq: int
    old_key: list[str | None]
    after: list[str | None]
    unchanged: set[str]
    zero_dates: int


@dataclass
class PreparedDml:
    """A DML step's destination, known before its rows move: the table (made to match the events' columns), the
    columns' plan, the transforms of the mapping rules and the primary key's columns (none: a keyless table)."""

    schema: str
    table: str
    destination: DestinationTable
    columns: list[ColumnPlan]
    transforms: dict[str, objmap.Transform]
    key: list[str]


@dataclass
class StagedStep:
    """A keyed DML step whose net changes Spark's tasks staged with the rest of its group (`_stage_group`): where,
    under which step number, and what the staged rows hold (checked by one query for the whole group)."""

    step: DmlStep
    prepared: PreparedDml
    key_columns: list[ColumnPlan]
    compacted_in_spark: bool
    staging: sql.Identifier
    number: int = 0
    zero_dates: int = 0
    unchanged_sets: list[str] = field(default_factory=list)


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
        self._staging_seq = 0
        self._lines = _Kept(_EXPRESSION_CACHE_SIZE)
        self._batch_refs: list[EventRef] = []
        self._set_aside_seqs: set[int] = set()
        # The run's reads of the destination: forgotten at a schema change and when a transaction that may have
        # changed them is undone (`forget_run_reads`).
        self._catalog = CatalogCache()
        self._claimed: set[tuple[str, str]] = set()  # the destination tables this run claimed (`_claim`)
        self._unseen_reported: set[str] = set()  # tables whose changes were let go, said once a run

    def apply(self, plan: BatchPlan, *, dead_letter: int | None = None) -> control.BatchCounts:
        """Applies every step and records the batch's position, all in one transaction; returns the counts.

        Under the `skip` error strategy each step runs in a savepoint; a step that fails is narrowed down to the
        events that fail (`_set_aside_failures`), which go to the dead letters while the rest of the batch applies.
        `dead_letter`: the plan replays that dead letter (`cdc-pipeline dead-letters retry`): it is marked retried
        and its counts move from the bad events to its kind; the applied position stays where it is.
        """
        self._batch_refs = plan.parsed.refs
        self._set_aside_seqs = set()
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
        self._catalog.forget()
        self._claimed.clear()

    @contextmanager
    def _savepoint(self) -> Iterator[None]:
        """A savepoint (under `skip`) whose rollback also forgets the run's reads: the table it altered or created,
        and its claims, are undone with it."""
        try:
            with self.conn.transaction():
                yield
        except BaseException:
            self.forget_run_reads()
            raise

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
        missing = {table for table in candidates if self._catalog.table(cur, *self._dest_names(table)) is None}
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
        """Applies the plan's steps in order; the keyed steps staged together (`_stage_group`) are merged in rounds
        of consecutive steps, each round sent without a round trip per statement (`_merge_round`)."""
        staged = self._stage_group(cur, plan, skip)
        merge_round: list[StagedStep] = []
        for index, step in enumerate(plan.steps):
            staged_step = staged.get(index)
            if staged_step is not None:
                merge_round.append(staged_step)
                continue
            self._merge_round(cur, plan, merge_round, skip)
            merge_round = []
            if skip:
                self._apply_step_or_set_aside(cur, plan, step)
            else:
                self._apply_step(cur, plan, step)
        self._merge_round(cur, plan, merge_round, skip)

    def _stage_group(self, cur: psycopg.Cursor, plan: BatchPlan, skip: bool) -> dict[int, StagedStep]:
        """Stages the net changes of the group's keyed steps, up to its first step of another kind, in one Spark
        job, and checks what was staged with one query; returns them by their index in the plan.

        Tables of one shape share one expression (`_shared_stage_line`): each row finds its step, its target and
        its columns' names in a lookup keyed by its value schema, so a group's job is planned once per shape of
        table, not once per table, and its compiled code serves every later group.

        Where a change may leave a TOASTed value out, Spark keeps each key's last change per step (`_shape_rows`).
        Left to their own path: steps after a step of another kind (a schema change alters their columns), from a
        table's second step on (its columns may change between the two), keyless tables, steps with transforms (a failing transform is traced to its value
        there) and key updates that leave TOASTed values out. A step whose destination cannot be prepared ends the
        staging here: its own path raises (or, under `skip`, sets its events aside) in its place in the plan.
        """
        events = plan.parsed.events
        if self.staging is None or events is None:
            return {}
        chosen: dict[int, StagedStep] = {}
        placeholder = unavailable_placeholder(self.connector)
        may_alter = self.connector.type in SCHEMA_FROM_EVENTS_TYPES
        leading = list(itertools.takewhile(lambda step: isinstance(step, DmlStep), plan.steps))
        self._claim_all(cur, leading)
        self._catalog.prefetch(cur, [self._dest_names(step.source_table) for step in leading])
        moved = self._steps_moving_toasted_keys(plan, leading, placeholder)
        for index, step in enumerate(leading):
            if any(other.step.source_table == step.source_table for other in chosen.values()):
                break
            try:
                # Under `skip` a failure must leave the transaction usable: a table the events alter gets a savepoint.
                with self._savepoint() if skip and may_alter else nullcontext():
                    prepared = self._prepare_dml(cur, step)
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
            line, text = self._shared_stage_line(staged_step.prepared.columns, staged_step.key_columns,
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
        rows = fail_on_malformed(events).select("seq", "op", "before", "after", found.alias(_STAGE_STEP)).where(
            F.col(f"{_STAGE_STEP}.first").isNotNull()
            & F.col("seq").between(F.col(f"{_STAGE_STEP}.first"), F.col(f"{_STAGE_STEP}.last")))
        frames = [(self._shape_rows(rows.where(F.col(f"{_STAGE_STEP}.shape") == F.lit(shape)), example, placeholder)
                   .select(F.col(f"{_STAGE_STEP}.target"), line), len(example.prepared.columns))
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
    def _steps_moving_toasted_keys(plan: BatchPlan, steps: list[DmlStep], placeholder: str | None) -> set[int]:
        """The steps (their `id`) holding a key update whose new row may leave a TOASTed value out: their own path
        applies it to the old key's row (`_key_moves`). Found from the index, then with one Spark job for the whole
        group: a create of a key update that carries a placeholder in any column (a superset of those `_key_moves`
        finds)."""
        if placeholder is None or plan.parsed.events is None:
            return set()
        refs_of: dict[str, list[EventRef]] = {}
        for ref in plan.parsed.refs:
            if ref.kind == DATA_CHANGE and ref.source_table:
                refs_of.setdefault(ref.source_table, []).append(ref)
        creates: dict[int, int] = {}  # a key update's create -> the id of its step
        for step in steps:
            if not {"c", "d"} <= set(step.ops):
                continue
            refs = [ref for ref in refs_of.get(step.source_table, []) if step.first_seq <= ref.seq <= step.last_seq]
            creates.update((create, id(step)) for create in _key_update_pairs(refs))
        if not creates:
            return set()
        forms = sorted({form for connect_type in ("string", "bytes", "array")
                        for form in placeholder_forms(placeholder, connect_type)})
        found = plan.parsed.events.where(F.col("seq").isin(sorted(creates))).where(
            F.exists(F.map_values("after"), lambda value: value.isin(*forms))).select("seq").collect()
        return {creates[row.seq] for row in found}

    @staticmethod
    def _shape_rows(rows: DataFrame, example: StagedStep, placeholder: str | None) -> DataFrame:
        """The rows of one shape of table, each key's last change kept in Spark where a change may leave a TOASTed
        value out (`compact_by_key`, per step: keys of two tables are never compared)."""
        if not example.compacted_in_spark:
            return rows
        columns = example.prepared.columns
        position = {column.source_name: index for index, column in enumerate(columns)}
        return compact_by_key(rows, [column.source_name for column in example.key_columns], columns, placeholder,
                              name_of=lambda name: F.col(f"{_STAGE_STEP}.names")[position[name]],
                              within=F.col(f"{_STAGE_STEP}.target"))

    def _shared_stage_line(self, columns: list[ColumnPlan], key_columns: list[ColumnPlan], placeholder: str | None
                           ) -> tuple[Column, str]:
        """`_stage_line` with each column's source and destination name read from the row's step in the group's
        lookup, and the expression's text: tables whose lines read the same share one projection."""
        def build() -> tuple[Column, str]:
            line = stage_line(columns, key_columns, placeholder,
                              names=[F.col(f"{_STAGE_STEP}.names")[index] for index in range(len(columns))],
                              dests=[F.col(f"{_STAGE_STEP}.dests")[index] for index in range(len(columns))])
            return line, str(line._jc.toString())

        return self._lines.get(("shared", *_line_key(columns, key_columns, placeholder)), build)

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
                last=self._is_last_change(s.number, s.key_columns, s.prepared.columns)
                if self._drops_superseded(s) and may_hold_zero_dates(s.prepared.columns) else sql.SQL("true"))
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
                    f"{s.staging.as_string(cur)} (events {s.step.first_seq}..{s.step.last_seq} of the batch): the batch "
                    "is not applied", connector=self.connector.name, table=s.step.source_table,
                    position=s.step.last_ref.position if s.step.last_ref else None)
            s.zero_dates, s.unchanged_sets = int(zero_dates), sorted(unchanged_sets)

    @staticmethod
    def _drops_superseded(staged_step: StagedStep) -> bool:
        """Whether the step's merge drops changes a later change of their key supersedes (`_drop_superseded`)."""
        return not staged_step.compacted_in_spark and not set(staged_step.step.ops) <= {"c", "r"}

    @staticmethod
    def _is_last_change(number: int, key_columns: list[ColumnPlan], columns: list[ColumnPlan]) -> sql.Composed:
        """Whether a staged row of step `number` is its key's last change of the step (what `_drop_superseded`
        keeps)."""
        return sql.SQL("{seq} = max({seq}) OVER (PARTITION BY {keys})").format(
            seq=sql.Identifier(stage_copy.SEQ), keys=sql.SQL(", ").join(_staged_keys(key_columns, columns)))

    def _merge_round(self, cur: psycopg.Cursor, plan: BatchPlan, merge_round: list[StagedStep], skip: bool) -> None:
        """Merges consecutive staged steps into their tables, their statements sent in one pipeline (no round trip
        each), in a savepoint. When the destination refuses one (a value, a lock or statement timeout), the round is
        undone and its steps applied one by one, each through its own path, which names the table, the value and
        its event (or, under `skip`, sets a refused event aside)."""
        if not merge_round:
            return
        try:
            with self.conn.transaction(), self.conn.pipeline():
                for staged_step in merge_round:
                    for statement in self._staged_merge_statements(staged_step):
                        cur.execute(statement)
        except psycopg.Error as exc:
            if self.conn.broken:
                raise
            # A refused value, a lock or statement timeout: the steps' own path names the table (and the value).
            log.info("%s: the merge of %d staged steps failed (%s); applying them one by one to name the table",
                     self.connector.name, len(merge_round), exc.diag.message_primary or exc)
            for staged_step in merge_round:
                if skip:
                    self._apply_step_or_set_aside(cur, plan, staged_step.step)
                else:
                    self._apply_step(cur, plan, staged_step.step)
            return
        for staged_step in merge_round:
            plan.counts.zero_dates += self._zero_dates_written(staged_step.step, staged_step.zero_dates)

    def _staged_merge_statements(self, s: StagedStep) -> list[sql.Composed]:
        statements = []
        if self._drops_superseded(s):
            statements.append(self._drop_superseded_sql(s.staging, s.number, s.key_columns, s.prepared.columns))
        return statements + self._merge_sql(s.prepared.schema, s.prepared.table, s.step, s.staging, s.number,
                                            s.prepared.columns, s.key_columns, s.prepared.transforms,
                                            s.unchanged_sets)

    def _apply_step(self, cur: psycopg.Cursor, plan: BatchPlan, step: DdlStep | DmlStep | TruncateStep | SnapshotStep
                    ) -> None:
        if isinstance(step, DdlStep):
            for change in step.changes:
                if change.kind == DROP_DATABASE:
                    self._drop_database(cur, change, step.ref)
                else:
                    self._apply_ddl(cur, change, step.ref)
        elif isinstance(step, TruncateStep):
            self._apply_truncate(cur, step)
        elif isinstance(step, SnapshotStep):
            self._apply_snapshot_step(cur, step)
        else:
            plan.counts.zero_dates += self._apply_dml(cur, step)

    def _apply_step_or_set_aside(self, cur: psycopg.Cursor, plan: BatchPlan,
                                 step: DdlStep | DmlStep | TruncateStep | SnapshotStep) -> None:
        error = self._try_in_savepoint(cur, plan, step, lambda: self._apply_step(cur, plan, step))
        if error is None:
            return
        if isinstance(step, DmlStep):
            refs = [ref for ref in plan.parsed.refs if ref.kind == DATA_CHANGE and ref.source_table == step.source_table
                    and ref.schema_id == step.schema_id and step.first_seq <= ref.seq <= step.last_seq
                    and ref.seq not in self._set_aside_seqs]
            self._set_aside_failures(cur, plan, step, refs, error)
        else:
            self._set_aside(cur, plan, step.ref, error)

    def _raise_unless_event_error(self, error: BaseException, step: object) -> None:
        """Errors of the destination connection or of the snapshot's bookkeeping are not an event's: they fail
        the batch under every strategy."""
        if self.conn.closed or self.conn.broken or isinstance(error, (psycopg.OperationalError, StagingMismatchError,
                                                                       TableOwnerError)) \
                or isinstance(step, SnapshotStep):
            raise error

    def _set_aside_failures(self, cur: psycopg.Cursor, plan: BatchPlan, step: DmlStep, refs: list[EventRef],
                            error: BaseException) -> None:
        """Applies what it can of a failed DML step, in source order, and sets aside the events that fail.

        The step's events are halved, each half applied in its own savepoint (first half first, so order holds),
        and a failing half is halved again, down to single events: a poison event among n costs about 2 log2(n)
        Spark jobs, on this failure path only.
        """
        if len(refs) <= 1:
            if refs:
                self._set_aside(cur, plan, refs[0], error)
            return
        half = len(refs) // 2
        for part in (refs[:half], refs[half:]):
            sub_step = DmlStep(step.source_table, step.schema_id, part[0].seq, part[-1].seq,
                               ops=Counter(ref.op for ref in part), last_ref=part[-1], fields=step.fields,
                               frame=step.frame.where(F.col("seq").between(part[0].seq, part[-1].seq))
                               if step.frame is not None else None)
            error = self._try_in_savepoint(cur, plan, sub_step, lambda: self._apply_step(cur, plan, sub_step))
            if error is not None:
                self._set_aside_failures(cur, plan, sub_step, [ref for ref in part if ref.seq not in
                                                               self._set_aside_seqs], error)

    def _try_in_savepoint(self, cur: psycopg.Cursor, plan: BatchPlan, step: object, apply: Callable[[], None]
                          ) -> BaseException | None:
        """Runs `apply` in a savepoint (a failure undoes it only); returns the event error it failed with, or None.

        An error naming its event (a malformed line: `ConversionError.seq`) sets that event aside at once and
        tries again without it.
        """
        while True:
            try:
                with self._savepoint():
                    apply()
                return None
            except SKIPPABLE_ERRORS as exc:
                self._raise_unless_event_error(exc, step)
                ref = self._batch_event(exc.seq) if isinstance(exc, ConversionError) else None
                if ref is None or ref.seq in self._set_aside_seqs:
                    return exc
                self._set_aside(cur, plan, ref, exc)

    def _batch_event(self, seq: int | None) -> EventRef | None:
        """The applying batch's event of this seq (failure paths only: a scan of the batch's index)."""
        return next((ref for ref in self._batch_refs if ref.seq == seq), None)

    def _set_aside(self, cur: psycopg.Cursor, plan: BatchPlan, ref: EventRef, error: BaseException) -> None:
        """Moves one event to the dead letters (same transaction) and counts it as a bad event, not as applied."""
        if ref.kind == DATA_CHANGE:
            raw_event = plan.parsed.data_line(ref.seq)
            schema = plan.parsed.batch.schemas.get(ref.schema_id or "")
            value_schema = json.dumps(schema) if schema is not None else None
        else:
            raw_event, value_schema = json.dumps(index_entry_of(ref), default=str), None
        message = str(error)
        self._set_aside_seqs.add(ref.seq)
        # The rest of its source transaction applies without it: the letter names the transaction.
        position = {**ref.position, **({"transaction": transaction} if (transaction := self._transaction_of(ref))
                                       else {})}
        letter_id = control.add_dead_letter(cur, self.control_schema, control.DeadLetter(
            connector=self.connector.name, source_table=ref.source_table, op=ref.op, position=position,
            raw_event=raw_event, value_schema=value_schema, error=message))
        counter = {DATA_CHANGE: DML_COUNTERS.get(ref.op or ""), SCHEMA_CHANGE: "ddls",
                   TRUNCATE: "truncates"}.get(ref.kind) or "other_events"
        setattr(plan.counts, counter, max(0, getattr(plan.counts, counter) - 1))
        plan.counts.bad_events += 1
        log.warning("%s: event %d of the batch (table %s, op %s, position %s) set aside as dead letter %d%s: %s",
                    self.connector.name, ref.seq, ref.source_table, ref.op, position, letter_id,
                    f"; the rest of source transaction {position['transaction']} applies without it"
                    if "transaction" in position else "", message)

    def _transaction_of(self, ref: EventRef) -> str | None:
        """The id of the source transaction an event of the applying batch is in (its BEGIN's, when in the batch)."""
        begin = None
        for other in self._batch_refs:
            if other.seq >= ref.seq:
                break
            if other.transaction is not None:
                status, transaction = other.transaction
                begin = transaction if status == BEGIN else None
        return begin

    @staticmethod
    def _rename_table(cur: psycopg.Cursor, change: DdlChange) -> list[sql.Composed]:
        """The rename of the table the change renames, when the old one exists and the new one does not yet."""
        if change.renamed_from is None:
            return []
        old_schema, old_name = change.renamed_from
        if destination_table(cur, old_schema, old_name) is None or destination_table(cur, change.schema, change.name):
            return []
        return rename_table_sql(old_schema, old_name, change.name,
                                new_schema=change.schema if change.schema != old_schema else None)

    def _apply_truncate(self, cur: psycopg.Cursor, step: TruncateStep) -> None:
        schema, table = self._dest_names(step.source_table)
        if self._catalog.table(cur, schema, table) is None:
            log.warning("TRUNCATE of %s: destination table %s.%s does not exist", step.source_table, schema, table)
            return
        self._claim(cur, step.source_table, schema, table)
        cur.execute(sql.SQL("TRUNCATE TABLE {}").format(sql.Identifier(schema, table)))
        log.info("Applied TRUNCATE of %s at %s", step.source_table, step.ref.position)

    def _apply_snapshot_step(self, cur: psycopg.Cursor, step: SnapshotStep) -> None:
        """Supersedes an earlier snapshot, replaces a table's rows before its snapshot rows, or ends a snapshot."""
        name, schema = self.connector.name, self.control_schema
        if step.kind == SNAPSHOT_RESTART:
            moved = control.supersede_snapshot(cur, schema, name)
            if moved.events:
                log.info("%s: the snapshot starts again at %s; the %d events applied of the earlier one (%d rows) are "
                         "counted as re-delivered and its tables replaced", name, step.ref.position, moved.events,
                         moved.snapshot_rows)
        elif step.kind == SNAPSHOT_END:
            for source_table in control.tables_not_replaced_by_snapshot(cur, schema, name):
                if captures(self.connector, source_table) and snapshot_reads(self.connector, source_table):
                    self._empty_for_snapshot(cur, source_table, step.ref, "the snapshot read no rows of it")
        else:
            if step.counts.snapshot_rows and control.replace_snapshot_rows(cur, schema, name, step.source_table):
                self._empty_for_snapshot(cur, step.source_table, step.ref, "its snapshot rows replace its rows")
            control.record_snapshot_progress(cur, schema, name, step.source_table, step.counts)

    def _empty_for_snapshot(self, cur: psycopg.Cursor, source_table: str, ref: EventRef, reason: str) -> None:
        schema, table = self._dest_names(source_table)
        if self._catalog.table(cur, schema, table) is None:
            return
        self._claim(cur, source_table, schema, table)
        try:
            cur.execute(sql.SQL("TRUNCATE TABLE {}").format(sql.Identifier(schema, table)))
        except psycopg.Error as exc:
            raise ConversionError(f"cannot empty {schema}.{table} for the snapshot: {exc}",
                                  connector=self.connector.name, table=source_table, position=ref.position) from exc
        log.info("%s: emptied %s.%s (%s) at %s", self.connector.name, schema, table, reason, ref.position)

    def _dest_names(self, source_table: str) -> tuple[str, str]:
        return self.object_map.table_name(source_table)

    def _claim_all(self, cur: psycopg.Cursor, steps: list[DmlStep]) -> None:
        """`_claim` of every step's table not claimed yet in this run, in one round."""
        wanted = [(*self._dest_names(step.source_table), step.source_table) for step in steps]
        wanted = [(schema, table, source) for schema, table, source in wanted if (schema, table) not in self._claimed]
        rule_store.claim_tables(cur, self.control_schema, self.connector.name, wanted)
        self._claimed.update((schema, table) for schema, table, _ in wanted)

    def _claim(self, cur: psycopg.Cursor, source_table: str, schema: str, table: str) -> None:
        """Makes sure the connector writes the destination table alone (once a run per table): a table another
        connector created, that a source without DDL events would find matching, is refused, not written."""
        if (schema, table) not in self._claimed:
            rule_store.claim_table(cur, self.control_schema, self.connector.name, schema, table, source_table)
            self._claimed.add((schema, table))

    def _drop_database(self, cur: psycopg.Cursor, change: DdlChange, ref: EventRef) -> None:
        """A source database dropped: each destination table the connector writes of its tables is dropped, as a
        DROP TABLE of each would (their schema stays)."""
        database = change.source_table[:-1]
        tables = [table for table in rule_store.owned_source_tables(cur, self.control_schema, self.connector.name)
                  if self.connector.split_table(table)[0] == database]
        for source_table in tables:
            self._apply_ddl(cur, DdlChange("drop", None, *self._dest_names(source_table), source_table,
                                           change.ddl_text), ref)
        log.info("%s: database %s was dropped at %s: dropped the destination tables of its %d table(s)",
                 self.connector.name, database, ref.position, len(tables))

    def _apply_ddl(self, cur: psycopg.Cursor, change: DdlChange, ref: EventRef) -> None:
        # Before any statement: another connector's table is neither altered nor dropped.
        self._claim(cur, change.source_table, change.schema, change.name)
        try:
            change = deferred_keys.follow_ddl(cur, self.control_schema, self.connector.name, change)
            if change.kind == "drop":
                statements = drop_table_sql(change.schema, change.name)
            elif change.table is None:
                return
            else:
                statements = self._rename_table(cur, change)
                for statement in statements:
                    cur.execute(statement)
                self._catalog.forget()
                existing = destination_table(cur, change.schema, change.name)
                statements = create_table_sql(change.table) if existing is None else alter_table_sql(
                    change.table, existing.columns, existing_primary_key=existing.primary_key,
                    column_renames=change.column_renames, existing_defaults=existing.defaults,
                    existing_not_null=existing.not_null, existing_unique=existing.unique,
                    unique_dropped=change.unique_dropped, user_typed=existing.user_typed)
            self._catalog.forget()
            for statement in statements:
                cur.execute(statement)
            self._record_columns(cur, change)
            # A dropped or renamed table's claim is let go (`_record_columns`): claim again from here on.
            self._claimed.clear()
            log.info("Applied %s of %s as %s.%s (%d statements) for %r at %s", change.kind, change.source_table,
                     change.schema, change.name, len(statements), change.ddl_text[:200], ref.position)
        except psycopg.Error as exc:
            raise ConversionError(f"cannot apply {change.kind} table ({change.ddl_text!r}): {exc}",
                                  connector=self.connector.name, table=change.source_table,
                                  position=ref.position) from exc

    def _record_columns(self, cur: psycopg.Cursor, change: DdlChange) -> None:
        """Keeps the record of what each source column became (for reloads of the rules and the attribute view)."""
        name, schema = self.connector.name, self.control_schema
        if change.previous_source_table is not None:
            rule_store.forget_columns(cur, schema, name, change.previous_source_table)
        if change.table is None:
            rule_store.forget_columns(cur, schema, name, change.source_table)
        else:
            rule_store.record_columns(cur, schema, name, change.table)

    def _prepare_dml(self, cur: psycopg.Cursor, step: DmlStep) -> PreparedDml:
        """Claims the step's destination table, makes it match the events' columns, and plans its columns."""
        schema, table = self._dest_names(step.source_table)
        position = step.last_ref.position if step.last_ref else None
        self._claim(cur, step.source_table, schema, table)
        destination = ensure_table_matches(
            cur, self.connector, schema, table, step.fields, source_table=step.source_table, position=position,
            object_map=self.object_map, catalog=self._catalog,
            on_change=lambda wanted: rule_store.record_columns(cur, self.control_schema, self.connector.name, wanted))
        columns = plan_columns(step.fields, destination.columns,
                               lambda name: self.object_map.column_name(step.source_table, name),
                               connector=self.connector.name, table=step.source_table,
                               dest_types=destination.types, position=position)
        columns, transforms = self.object_map.transforms(step.source_table, columns)
        key = list(destination.primary_key[1]) if destination.primary_key else []
        return PreparedDml(schema, table, destination, columns, transforms, key)

    def _apply_dml(self, cur: psycopg.Cursor, step: DmlStep) -> int:
        with_frame(step)
        if self._set_aside_seqs and step.frame is not None:
            step = replace(step, frame=step.frame.where(~F.col("seq").isin(sorted(self._set_aside_seqs))))
        prepared = self._prepare_dml(cur, step)
        schema, table, columns, transforms, key = (prepared.schema, prepared.table, prepared.columns,
                                                   prepared.transforms, prepared.key)
        position = step.last_ref.position if step.last_ref else None
        try:
            # With transforms, a savepoint: a transform failing on a value is then traced to its column and event.
            with self.conn.transaction() if transforms else nullcontext():
                if key:
                    return self._apply_keyed(cur, schema, table, step, columns, key, transforms)
                return self._apply_keyless(cur, schema, table, step, columns, transforms)
        except SPARK_ERRORS as exc:
            message, seq = spark_failure(exc)
            ref = self._batch_event(seq)
            if ref is None:
                raise ConversionError(f"cannot convert changes to {schema}.{table} (events {step.first_seq}.."
                                      f"{step.last_seq} of the batch): {message}", connector=self.connector.name,
                                      table=step.source_table, position=position) from exc
            # The event's own table, from the runner's index: a malformed line has none of its own.
            named = ConversionError(f"cannot convert event {seq} of the batch (op {ref.op}): {message}",
                                    connector=self.connector.name, table=ref.source_table, position=ref.position)
            named.seq = seq
            raise named from exc
        except psycopg.Error as exc:
            refs = {ref.seq: ref for ref in self._batch_refs}
            failed = transforms and transform_sql.transform_error(
                cur, step.frame, columns, transforms, connector=self.connector.name, table=step.source_table,
                target=f"{schema}.{table}", refs=refs)
            if failed:
                raise failed from exc
            raise apply_error(exc, step.frame, columns, connector=self.connector.name, table=step.source_table,
                              target=f"{schema}.{table}", seqs=(step.first_seq, step.last_seq),
                              position=position, refs=refs) from exc

    def _staging(self, cur: psycopg.Cursor, target: sql.Identifier, columns: list[str],
                 text_columns: Collection[str] = ()) -> sql.Identifier:
        """A temporary table with the target's columns; `text_columns` (those with a transform) hold text."""
        self._staging_seq += 1
        staging = sql.Identifier("pg_temp", f"_cdc_staging_{self._staging_seq}")
        cur.execute(staging_table_sql(staging, target, columns, text_columns))
        return staging

    def _copy(self, cur: psycopg.Cursor, table: sql.Identifier, columns: list[str], lines: Iterable[str]) -> None:
        statement = sql.SQL("COPY {} ({}) FROM STDIN").format(table, sql.SQL(", ").join(map(sql.Identifier, columns)))
        with cur.copy(statement) as copy:
            buffer: list[str] = []
            size = 0
            for line in lines:
                buffer.append(line)
                size += len(line) + 1
                if size >= _COPY_CHUNK:
                    copy.write("\n".join(buffer) + "\n")
                    buffer, size = [], 0
            if buffer:
                copy.write("\n".join(buffer) + "\n")

    def _apply_keyed(self, cur: psycopg.Cursor, schema: str, table: str, step: DmlStep, columns: list[ColumnPlan],
                     key: list[str], transforms: dict[str, objmap.Transform]) -> int:
        """Merges the step's net changes per key; returns how many zero dates were written as NULL.

        A key update whose new row leaves TOASTed values out (`_key_moves`) has its values nowhere in the batch: the
        destination's row of the old key holds them. The step is then applied in source order: the changes before
        each such key update merged, the update applied to the old row (`_move_key`), the changes after it merged.
        """
        moves = self._key_moves(step, columns, key)
        if not moves:
            return self._merge_keyed_any(cur, schema, table, step, columns, key, transforms)
        seqs = [ref.seq for ref in self._step_refs(step)]
        zero_dates_written, first = 0, step.first_seq
        for move in moves:
            zero_dates_written += self._merge_seq_range(cur, schema, table, step, first, move.delete_seq - 1, seqs,
                                                        columns, key, transforms)
            zero_dates_written += self._move_key(cur, schema, table, step, move, columns, key, transforms)
            first = move.create_seq + 1
        return zero_dates_written + self._merge_seq_range(cur, schema, table, step, first, step.last_seq, seqs,
                                                          columns, key, transforms)

    def _merge_keyed_any(self, cur: psycopg.Cursor, schema: str, table: str, step: DmlStep,
                         columns: list[ColumnPlan], key: list[str], transforms: dict[str, objmap.Transform]) -> int:
        if self.staging is not None:
            return self._merge_keyed_staged(cur, schema, table, step, columns, key, transforms)
        return self._merge_keyed(cur, schema, table, step, columns, key, transforms)

    def _merge_seq_range(self, cur: psycopg.Cursor, schema: str, table: str, step: DmlStep, first: int, last: int,
                         seqs: list[int], columns: list[ColumnPlan], key: list[str],
                         transforms: dict[str, objmap.Transform]) -> int:
        """Merges the step's changes from seq `first` to `last` (none: nothing to do)."""
        if not any(first <= seq <= last for seq in seqs):
            return 0
        part = replace(step, first_seq=first, last_seq=last, frame=step.frame.where(F.col("seq").between(first, last)))
        return self._merge_keyed_any(cur, schema, table, part, columns, key, transforms)

    def _step_refs(self, step: DmlStep) -> list[EventRef]:
        """The step's data changes, in source order (those set aside left out)."""
        return [ref for ref in self._batch_refs
                if ref.kind == DATA_CHANGE and ref.source_table == step.source_table
                and step.first_seq <= ref.seq <= step.last_seq and ref.seq not in self._set_aside_seqs]

    def _key_moves(self, step: DmlStep, columns: list[ColumnPlan], key: list[str]) -> list[KeyMove]:
        """The step's key updates whose new row leaves unchanged TOASTed values out, in source order.

        Debezium sends a key update as a delete of the old key and a create of the new one, both with the update's
        offset; a create never carries the placeholder otherwise. Found from the index first (one Spark job only
        for a step that holds such a pair)."""
        placeholder = unavailable_placeholder(self.connector)
        if placeholder is None or not {"c", "d"} <= set(step.ops):
            return []
        pairs = _key_update_pairs(self._step_refs(step))
        if not pairs:
            return []
        with_frame(step)
        by_dest = {column.dest_name: column for column in columns}
        key_columns = [by_dest[name] for name in key if name in by_dest]
        rows = step.frame.where(F.col("seq").isin([*pairs, *pairs.values()])).select(
            "seq", copy_line("before", key_columns).alias("key_line"),
            copy_line("after", columns, placeholder).alias("after_line"),
            unchanged_columns("after", columns, placeholder).alias("unchanged"),
            zero_dates("after", columns).alias("zero_dates")).collect()
        by_seq = {row.seq: row for row in rows}
        moves = []
        for create_seq, delete_seq in sorted(pairs.items()):
            create, delete = by_seq.get(create_seq), by_seq.get(delete_seq)
            if create is not None and delete is not None and create.unchanged:
                moves.append(KeyMove(delete_seq, create_seq, parse_copy_line(delete.key_line),
                                     parse_copy_line(create.after_line), set(create.unchanged), create.zero_dates))
        return moves

    def _move_key(self, cur: psycopg.Cursor, schema: str, table: str, step: DmlStep, move: KeyMove,
                  columns: list[ColumnPlan], key: list[str], transforms: dict[str, objmap.Transform]) -> int:
        """Applies one key update to the old key's row: its key and written columns take the new values, its
        unchanged TOASTed columns keep theirs. Without that row (never copied), the new row is upserted without
        them, as a create is."""
        target = param_identifier(schema, table)
        names = [column.dest_name for column in columns]
        values = {column.dest_name: transform_sql.parameter_value(column, transforms.get(column.dest_name))
                  for column in columns}
        written = [i for i, name in enumerate(names) if name not in move.unchanged]
        assignments = sql.SQL(", ").join(
            sql.SQL("{} = {}").format(param_identifier(names[i]), values[names[i]]) for i in written)
        match = sql.SQL(" AND ").join(
            sql.SQL("{} = {}").format(param_identifier(name), values[name]) for name in key)
        new_values = [move.after[i] for i in written]
        cur.execute(sql.SQL("UPDATE {} SET ").format(target) + assignments + sql.SQL(" WHERE ") + match,
                    [*new_values, *move.old_key])
        if cur.rowcount == 0:
            log.warning("%s: the row of the old key of a key update of %s.%s (event %d) is not in the destination; "
                        "its unchanged TOASTed columns %s stay empty", self.connector.name, schema, table,
                        move.create_seq, sorted(move.unchanged))
            updates = [names[i] for i in written if names[i] not in key]
            action = sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
                sql.SQL("{0} = EXCLUDED.{0}").format(param_identifier(name)) for name in updates)) if updates \
                else sql.SQL("DO NOTHING")
            cur.execute(sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) {}").format(
                target, sql.SQL(", ").join(param_identifier(names[i]) for i in written),
                sql.SQL(", ").join(values[names[i]] for i in written),
                sql.SQL(", ").join(map(param_identifier, key)), action), new_values)
        return self._zero_dates_written(step, move.zero_dates)

    def _merge_keyed(self, cur: psycopg.Cursor, schema: str, table: str, step: DmlStep, columns: list[ColumnPlan],
                     key: list[str], transforms: dict[str, objmap.Transform]) -> int:
        """Deletes and upserts the net changes per key; returns how many zero dates were written as NULL.

        A column an update left out (an unchanged TOASTed value, sent as a placeholder) is not written: the
        destination keeps its stored value. Transformed columns are staged as text and transformed in the merge.
        """
        compacted, key_columns, placeholder = self._net_changes(schema, table, step, columns, key)
        lines = collect_lines(compacted.select(self._merge_line(columns, key_columns, placeholder)))
        upserts: dict[tuple[str, ...], list[str]] = {}
        deletes: list[str] = []
        zero_dates_written = 0
        for line in lines:
            header, copy_text = line.split("\t", 1)
            op, zeros, unchanged = header.split(" ", 2)
            if op == "d":
                deletes.append(copy_text)
                continue
            zero_dates_written += int(zeros)
            upserts.setdefault(tuple(json.loads(unchanged)) if unchanged != "[]" else (), []).append(copy_text)
        target = sql.Identifier(schema, table)
        key_names = [column.dest_name for column in key_columns]
        values = transform_sql.staged_values(columns, transforms, "s")
        if deletes:
            staging = self._staging(cur, target, key_names, transforms)
            self._copy(cur, staging, key_names, deletes)
            cur.execute(sql.SQL("DELETE FROM {t} AS t USING {s} AS s WHERE {match}").format(
                t=target, s=staging, match=_match_columns(key_names, "t", values)))
        names = [column.dest_name for column in columns]
        for unchanged, lines in upserts.items():
            staging = self._staging(cur, target, names, transforms)
            self._copy(cur, staging, names, lines)
            written = [name for name in names if name not in unchanged]
            cur.execute(sql.SQL(
                "INSERT INTO {t} AS t ({cols}) SELECT {values} FROM {s} AS s ON CONFLICT ({key}) {action}").format(
                t=target, s=staging, cols=sql.SQL(", ").join(map(sql.Identifier, written)),
                values=sql.SQL(", ").join(values[name] for name in written),
                key=sql.SQL(", ").join(map(sql.Identifier, key_names)), action=_on_conflict(written, key_names)))
        return self._zero_dates_written(step, zero_dates_written)

    def _net_changes(self, schema: str, table: str, step: DmlStep, columns: list[ColumnPlan], key: list[str],
                     compact: bool = True) -> tuple[DataFrame, list[ColumnPlan], str | None]:
        """The step's last change per key (lazily, in Spark; with `compact` false, every change, for a merge that
        keeps each key's last itself), the key's columns and the TOAST placeholder."""
        by_dest = {column.dest_name: column for column in columns}
        missing = [name for name in key if name not in by_dest]
        if missing:
            raise ConversionError(f"primary key column(s) {missing} of {schema}.{table} are not in the change events",
                                  connector=self.connector.name, table=step.source_table)
        key_columns = [by_dest[name] for name in key]
        placeholder = unavailable_placeholder(self.connector)
        if not compact or set(step.ops) <= {"c", "r"}:
            # Inserts and snapshot reads alone never repeat a key: no compaction (and no shuffle) needed.
            return step.frame, key_columns, placeholder
        return (compact_by_key(step.frame, [column.source_name for column in key_columns], columns, placeholder),
                key_columns, placeholder)

    def _merge_keyed_staged(self, cur: psycopg.Cursor, schema: str, table: str, step: DmlStep,
                            columns: list[ColumnPlan], key: list[str], transforms: dict[str, objmap.Transform]) -> int:
        """`_merge_keyed` with the rows staged by Spark's tasks (`stage_copy`): the net changes never reach Python.

        PostgreSQL refusing a value in the merge (a cast, a constraint) says less than a COPY into the table does
        (which names the column, the value and its line), so the merge is undone (a savepoint) and the step is
        applied again through the driver (`_merge_keyed`), whose COPY fails with the column, value and event.

        Each key's last change is kept by the destination (`_drop_superseded`), from every change staged with its
        seq: Spark's compaction would cost the job a shuffle. Only where a change may leave a TOASTed value out does
        Spark compact (`compact_by_key`), which takes such a value from an earlier change of the key.
        """
        assert self.staging is not None
        in_spark = may_leave_values_out(columns, unavailable_placeholder(self.connector))
        compacted, key_columns, placeholder = self._net_changes(schema, table, step, columns, key, compact=in_spark)
        names = [column.dest_name for column in columns]
        staging = self.staging.table
        number, staged = self.staging.write(compacted.select(self._stage_line(columns, key_columns, placeholder)),
                                            names)
        self._check_staged_rows(cur, step, staging, number, staged)
        try:
            with self.conn.transaction():
                if not in_spark and not set(step.ops) <= {"c", "r"}:
                    cur.execute(self._drop_superseded_sql(staging, number, key_columns, columns))
                return self._merge_staged(cur, schema, table, step, staging, number, columns, key_columns, transforms)
        except psycopg.Error as exc:
            if self.conn.broken or isinstance(exc, psycopg.OperationalError):
                raise
            log.info("%s: the merge into %s.%s refused a staged value (%s); applying the step through the driver "
                     "to name it", self.connector.name, schema, table, exc.diag.message_primary or exc)
            return self._merge_keyed(cur, schema, table, step, columns, key, transforms)

    def _check_staged_rows(self, cur: psycopg.Cursor, step: DmlStep, staging: sql.Identifier, number: int,
                           staged: int) -> None:
        """Raises StagingMismatchError unless the batch's transaction sees exactly the rows the tasks committed for
        step `number`: a merge that saw fewer would drop changes while the position commits."""
        seen = cur.execute(sql.SQL("SELECT pg_catalog.count(*) FROM {} WHERE {} = {}").format(
            staging, sql.Identifier(stage_copy.STEP), sql.Literal(number))).fetchone()[0]
        if seen != staged:
            raise StagingMismatchError(
                f"the merge sees {seen} of the {staged} rows Spark's tasks staged in {staging.as_string(cur)} "
                f"(events {step.first_seq}..{step.last_seq} of the batch): the batch is not applied",
                connector=self.connector.name, table=step.source_table,
                position=step.last_ref.position if step.last_ref else None)

    @staticmethod
    def _drop_superseded_sql(staging: sql.Identifier, number: int, key_columns: list[ColumnPlan],
                             columns: list[ColumnPlan]) -> sql.Composed:
        """The statement that deletes the staged changes of step `number` that a later change of the same key supersedes, leaving each
        key's last change in source order, as `compact_by_key` leaves it. A delete's row holds its key (from the
        row's `before`), any other change's its new key: a key update, sent as a delete and a create, ends as both.

        The rows go by their `ctid`, found by a window over the step's rows (one sort): no join, so no plan that the
        table's statistics can make quadratic. They were gathered while the table held another step (the step
        number is new each time): a join of the table with itself, estimated at a row, ran as a nested loop that
        took a minute a group of 18,000 changes."""
        keys = _staged_keys(key_columns, columns)
        seq, step = sql.Identifier(stage_copy.SEQ), sql.Identifier(stage_copy.STEP)
        return sql.SQL(
            "DELETE FROM {s} WHERE ctid = ANY (ARRAY(SELECT w.ctid FROM (SELECT ctid, {seq} AS seq, max({seq}) OVER "
            "(PARTITION BY {keys}) AS last FROM {s} WHERE {step} = {n}) AS w WHERE w.seq < w.last))").format(
            s=staging, keys=sql.SQL(", ").join(keys), seq=seq, step=step, n=sql.Literal(number))

    def _merge_staged(self, cur: psycopg.Cursor, schema: str, table: str, step: DmlStep, staging: sql.Identifier,
                      number: int, columns: list[ColumnPlan], key_columns: list[ColumnPlan],
                      transforms: dict[str, objmap.Transform]) -> int:
        """Deletes and upserts the staged net changes of step `number`; returns the zero dates written as NULL."""
        unchanged_column = sql.Identifier("s", stage_copy.UNCHANGED)
        cur.execute(sql.SQL("SELECT {u}, sum(s.{z}) FROM {s} AS s WHERE s.{step} = {n} AND s.{op} <> 'd' "
                            "GROUP BY {u}").format(
            u=unchanged_column, z=sql.Identifier(stage_copy.ZERO_DATES), s=staging,
            step=sql.Identifier(stage_copy.STEP), n=sql.Literal(number), op=sql.Identifier(stage_copy.OP)))
        groups = cur.fetchall()
        for statement in self._merge_sql(schema, table, step, staging, number, columns, key_columns, transforms,
                                         [unchanged_text for unchanged_text, _ in groups]):
            cur.execute(statement)
        return self._zero_dates_written(step, sum(int(zero_dates) for _, zero_dates in groups))

    @staticmethod
    def _merge_sql(schema: str, table: str, step: DmlStep, staging: sql.Identifier, number: int,
                   columns: list[ColumnPlan], key_columns: list[ColumnPlan], transforms: dict[str, objmap.Transform],
                   unchanged_sets: list[str]) -> list[sql.Composed]:
        """The statements that delete and upsert the staged net changes of step `number`: one DELETE for its
        deletes, one INSERT ... ON CONFLICT per set of unchanged columns its upserts leave out (JSON arrays)."""
        target = sql.Identifier(schema, table)
        names = [column.dest_name for column in columns]
        key_names = [column.dest_name for column in key_columns]
        values = transform_sql.staged_values(columns, transforms, "s", all_text=True,
                                             staged_names=ExecutorStaging.value_columns(names))
        this_step = sql.SQL("s.{} = {}").format(sql.Identifier(stage_copy.STEP), sql.Literal(number))
        op = sql.Identifier("s", stage_copy.OP)
        statements = []
        if "d" in step.ops:
            statements.append(sql.SQL(
                "DELETE FROM {t} AS t USING {s} AS s WHERE {step} AND {op} = 'd' AND {match}").format(
                t=target, s=staging, step=this_step, op=op, match=_match_columns(key_names, "t", values)))
        unchanged_column = sql.Identifier("s", stage_copy.UNCHANGED)
        for unchanged_text in unchanged_sets:
            unchanged = set(json.loads(unchanged_text))
            written = [name for name in names if name not in unchanged]
            statements.append(sql.SQL(
                "INSERT INTO {t} AS t ({cols}) SELECT {values} FROM {s} AS s WHERE {step} AND {op} <> 'd' "
                "AND {u} = {unchanged} ON CONFLICT ({key}) {action}").format(
                t=target, s=staging, cols=sql.SQL(", ").join(map(sql.Identifier, written)),
                values=sql.SQL(", ").join(values[name] for name in written), step=this_step, op=op,
                u=unchanged_column, unchanged=sql.Literal(unchanged_text),
                key=sql.SQL(", ").join(map(sql.Identifier, key_names)), action=_on_conflict(written, key_names)))
        return statements

    def _stage_line(self, columns: list[ColumnPlan], key_columns: list[ColumnPlan], placeholder: str | None
                    ) -> Column:
        """The line Spark's tasks stage per change (`stage_copy.LINE_HEADER`, then every column's value; a delete's
        line has its key's values only). Built once per table version, as `_merge_line` is."""
        return self._cached_line("stage", columns, key_columns, placeholder,
                                 lambda: stage_line(columns, key_columns, placeholder))

    def _merge_line(self, columns: list[ColumnPlan], key_columns: list[ColumnPlan], placeholder: str | None) -> Column:
        """The line `_merge_keyed` collects per change: a header "op zero_dates unchanged" (the unchanged columns
        as a JSON array, which holds no tab), a tab, and the COPY text of the upsert or of the deleted key.

        One Spark job serves upserts and deletes.
        """
        return self._cached_line("collect", columns, key_columns, placeholder, lambda: F.concat(
            F.concat_ws(" ", F.col("op"), zero_dates("after", columns).cast("string"),
                        F.to_json(unchanged_columns("after", columns, placeholder))),
            F.lit("\t"),
            F.when(F.col("op") == "d", copy_line("before", key_columns))
            .otherwise(copy_line("after", columns, placeholder)),
        ))

    def _cached_line(self, kind: str, columns: list[ColumnPlan], key_columns: list[ColumnPlan],
                     placeholder: str | None, build: Callable[[], Column]) -> Column:
        """A line expression, built once per kind and table version and reused by every later batch: it depends only
        on the columns, and building it costs many calls into the JVM. The least recently used is dropped past the
        cache's size."""
        return self._lines.get((kind, *_line_key(columns, key_columns, placeholder)), build)

    def _zero_dates_written(self, step: DmlStep, count: int) -> int:
        if count:
            log.warning("%s: %d zero dates of %s written as NULL (up to %s)", self.connector.name, count,
                        step.source_table, step.last_ref.position if step.last_ref else None)
        return count

    def _apply_keyless(self, cur: psycopg.Cursor, schema: str, table: str, step: DmlStep,
                       columns: list[ColumnPlan], transforms: dict[str, objmap.Transform]) -> int:
        """Without a key, an insert adds a row and an update or delete takes away one row equal to its before image
        (adding its after image). Returns how many zero dates were written as NULL. Values of transformed columns
        are matched and written transformed.

        The source made every change on the rows as they were then, so the table's rows as a multiset end up as
        they were, plus the images added, minus those taken away, in whatever order that is done: set-wise
        (`_apply_keyless_net`). Images with columns left out (unchanged TOASTed values, which the before row must
        supply) are applied one event at a time, in source order, neither matching nor writing those columns.
        """
        placeholder = unavailable_placeholder(self.connector)
        rows = step.frame.select(
            "seq", "op", copy_line("before", columns, placeholder).alias("before_line"),
            copy_line("after", columns, placeholder).alias("after_line"),
            unchanged_columns("before", columns, placeholder).alias("unchanged_before"),
            unchanged_columns("after", columns, placeholder).alias("unchanged_after"),
            zero_dates("after", columns).alias("zero_dates")).orderBy("seq").collect()
        target = sql.Identifier(schema, table)
        # Statements with parameters: a `%` in a name must reach psycopg doubled, or it reads as a placeholder.
        param_target = param_identifier(schema, table)
        zero_dates_written = sum(row.zero_dates for row in rows if row.op != "d")
        if not any(row.op in ("u", "d") and (row.unchanged_before or row.unchanged_after) for row in rows):
            self._apply_keyless_net(cur, target, columns, rows, transforms)
            return self._zero_dates_written(step, zero_dates_written)
        names = [column.dest_name for column in columns]
        values = [transform_sql.parameter_value(column, transforms.get(column.dest_name)) for column in columns]
        pending_inserts: list[str] = []
        for row in rows:
            if row.op in ("c", "r"):
                pending_inserts.append(row.after_line)
                continue
            if pending_inserts:
                self._insert_lines(cur, target, columns, pending_inserts, transforms)
                pending_inserts = []
            matched = [i for i, name in enumerate(names) if name not in row.unchanged_before]
            before = [parse_copy_line(row.before_line)[i] for i in matched]
            match = sql.SQL(" AND ").join(
                sql.SQL("{} IS NOT DISTINCT FROM {}").format(param_identifier(names[i]), values[i]) for i in matched)
            one_row = sql.SQL("ctid = (SELECT ctid FROM {t} WHERE {match} LIMIT 1)").format(t=param_target,
                                                                                              match=match)
            if row.op == "d":
                cur.execute(sql.SQL("DELETE FROM {} WHERE ").format(param_target) + one_row, before)
            else:
                written = [i for i, name in enumerate(names) if name not in row.unchanged_after]
                after = [parse_copy_line(row.after_line)[i] for i in written]
                assignments = sql.SQL(", ").join(
                    sql.SQL("{} = {}").format(param_identifier(names[i]), values[i]) for i in written)
                cur.execute(sql.SQL("UPDATE {} SET ").format(param_target) + assignments + sql.SQL(" WHERE ")
                            + one_row, [*after, *before])
        if pending_inserts:
            self._insert_lines(cur, target, columns, pending_inserts, transforms)
        return self._zero_dates_written(step, zero_dates_written)

    def _apply_keyless_net(self, cur: psycopg.Cursor, target: sql.Identifier, columns: list[ColumnPlan],
                           rows: list, transforms: dict[str, objmap.Transform]) -> None:
        """Applies a keyless segment's net effect set-wise: per row image, the copies its events add less those they
        take away; one DELETE takes away the images short of copies (a hash join on the rows' text), one COPY adds
        the others."""
        net: Counter = Counter()
        for row in rows:
            if row.op in ("c", "r", "u"):
                net[row.after_line] += 1
            if row.op in ("u", "d"):
                net[row.before_line] -= 1
        names = [column.dest_name for column in columns]
        removed = [f"{line}\t{-copies}" for line, copies in net.items() if copies < 0]
        if removed:
            staging = self._staging(cur, target, names, transforms)
            cur.execute(sql.SQL("ALTER TABLE {} ADD COLUMN _cdc_copies integer").format(staging))
            self._copy(cur, staging, [*names, "_cdc_copies"], removed)
            values = transform_sql.staged_values(columns, transforms, "s")
            cur.execute(sql.SQL(
                "DELETE FROM {t} WHERE ctid IN (SELECT m.ctid FROM ("
                "SELECT t.ctid, s._cdc_copies, row_number() OVER (PARTITION BY s._cdc_image) AS _cdc_nth "
                "FROM {t} AS t JOIN (SELECT s._cdc_copies, ROW({staged})::text AS _cdc_image FROM {s} AS s) AS s "
                "ON ROW({current})::text = s._cdc_image) AS m WHERE m._cdc_nth <= m._cdc_copies)").format(
                t=target, s=staging, staged=sql.SQL(", ").join(values[name] for name in names),
                current=sql.SQL(", ").join(sql.Identifier("t", name) for name in names)))
        added = [line for line, copies in net.items() for _ in range(copies)]
        if added:
            self._insert_lines(cur, target, columns, added, transforms)

    def _insert_lines(self, cur: psycopg.Cursor, target: sql.Identifier, columns: list[ColumnPlan], lines: list[str],
                      transforms: dict[str, objmap.Transform]) -> None:
        """COPYs rows into the target; with transforms through a staging table, transformed in the INSERT."""
        names = [column.dest_name for column in columns]
        if not transforms:
            self._copy(cur, target, names, lines)
            return
        staging = self._staging(cur, target, names, transforms)
        self._copy(cur, staging, names, lines)
        values = transform_sql.staged_values(columns, transforms, "s")
        cur.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} AS s").format(
            target, sql.SQL(", ").join(map(sql.Identifier, names)), sql.SQL(", ").join(values[name] for name in names),
            staging))


class _Kept:
    """Values built once and kept (line expressions: building one costs many calls into the JVM), the least recently
    used dropped past `size`."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._values: OrderedDict[tuple, Any] = OrderedDict()

    def get(self, key: tuple, build: Callable[[], Any]) -> Any:
        value = self._values.get(key)
        if value is None:
            value = build()
            if len(self._values) >= self._size:
                self._values.popitem(last=False)
            self._values[key] = value
        else:
            self._values.move_to_end(key)
        return value


def _line_key(columns: list[ColumnPlan], key_columns: list[ColumnPlan], placeholder: str | None) -> tuple:
    """What a line expression depends on: a table version's columns, its key and the TOAST placeholder."""
    return repr(columns), tuple(column.source_name for column in key_columns), placeholder


def stage_line(columns: list[ColumnPlan], key_columns: list[ColumnPlan], placeholder: str | None,
               names: ColumnKeys | None = None, dests: ColumnKeys | None = None) -> Column:
    """The line Spark's tasks stage per change (`stage_copy.LINE_HEADER`, then every column's value; a delete's line
    has its key's values only); with `names` and `dests`, each column's source and destination name read from the
    row (`copy_line`'s keys)."""
    return F.concat_ws(
        "\t", F.col("op"), zero_dates("after", columns, names).cast("string"),
        copy_escape(F.to_json(unchanged_columns("after", columns, placeholder, names, dests))),
        F.col("seq").cast("string"),
        F.when(F.col("op") == "d", copy_line("before", columns, only={column.dest_name for column in key_columns},
                                             keys=names))
        .otherwise(copy_line("after", columns, placeholder, keys=names)))


def staging_table_sql(staging: sql.Identifier, target: sql.Identifier, columns: list[str],
                      text_columns: Collection[str] = ()) -> sql.Composed:
    """A temporary table (dropped at commit) with the target's columns; `text_columns` (those with a transform)
    hold text."""
    return sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
        staging, sql.SQL(", ").join(
            sql.SQL("CAST(NULL AS pg_catalog.text) AS {}").format(sql.Identifier(name)) if name in text_columns
            else sql.Identifier(name) for name in columns), target)


def spark_failure(error: BaseException) -> tuple[str, int | None]:
    """What a failed Spark job says in one line (the message an expression raised, if one did), and the seq of the
    event it names, if any."""
    if isinstance(error, Py4JJavaError):
        text = str(error.java_exception.getMessage() or error.java_exception.toString())
    else:
        text = str(error)
    raised = _RAISED_IN_SPARK.search(text)
    message = raised.group(1) if raised else text.strip().splitlines()[0] if text.strip() else repr(error)
    seq = _SEQ_IN_MESSAGE.search(message)
    return message, int(seq.group(1)) if seq else None


def param_identifier(*names: str) -> sql.Identifier:
    """An identifier for a statement executed with parameters: psycopg reads `%` there as a placeholder's start
    (also inside a quoted name), and `%%` as one `%`."""
    return sql.Identifier(*(name.replace("%", "%%") for name in names))


def _on_conflict(written: list[str], key_names: list[str]) -> sql.Composable:
    """An upsert's action on an existing key: every written column that is not the key takes the new value."""
    updates = [name for name in written if name not in key_names]
    if not updates:
        return sql.SQL("DO NOTHING")
    return sql.SQL("DO UPDATE SET {}").format(
        sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(name)) for name in updates))


def _key_update_pairs(refs: list[EventRef]) -> dict[int, int]:
    """The key updates among one table's changes in source order, as {create seq: delete seq}: Debezium sends one as
    a delete of the old key and a create of the new one, both with the update's offset."""
    return {create.seq: delete.seq for delete, create in zip(refs, refs[1:])
            if delete.op == "d" and create.op == "c" and delete.offset and delete.offset == create.offset}


def _staged_keys(key_columns: list[ColumnPlan], columns: list[ColumnPlan]) -> list[sql.Identifier]:
    """The staging table's columns that hold a step's key (`ExecutorStaging.value_column`)."""
    staged = ExecutorStaging.value_columns([column.dest_name for column in columns])
    return [sql.Identifier(staged[column.dest_name]) for column in key_columns]


def _match_columns(names: list[str], left: str, values: dict[str, sql.Composable]) -> sql.Composed:
    return sql.SQL(" AND ").join(
        sql.SQL("{}.{} = {}").format(sql.Identifier(left), sql.Identifier(name), values[name]) for name in names)

