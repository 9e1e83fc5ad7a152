"""The group's merge round, and the merge SQL of a staged step.

The steps the group staged (`StagedStep`, `group_stage`) are merged into their tables in rounds of consecutive steps,
each round's statements sent to the destination together (psycopg's pipeline mode, no round trip each), in a
savepoint of the group's transaction (`merge_round`). A step's statements (`staged_merge_statements`): the DELETE of
its staged changes a later change of the same key supersedes (`drop_superseded_sql`), then one DELETE ... USING for
its deletes and one INSERT ... ON CONFLICT per set of columns its upserts leave out (`merge_sql`), each value cast to
its column's type. A round the destination refuses is undone and its steps applied one by one on their own path,
which names the table, the value and the event.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Callable

import psycopg
from psycopg import sql

from cdc_pipeline.convert.dml import ColumnPlan
from cdc_pipeline.mapping import objmap, transform_sql
from cdc_pipeline.sink import stage_copy
from cdc_pipeline.sink.destination_tables import PreparedDml
from cdc_pipeline.sink.plan import BatchPlan, DmlStep
from cdc_pipeline.sink.stage_copy import ExecutorStaging
from cdc_pipeline.sink.table_writes import match_columns, on_conflict, report_zero_dates

log = logging.getLogger(__name__)


@dataclass
class StagedStep:
    """A keyed DML step whose net changes Spark's tasks staged with the rest of its group (`group_stage`): where,
    under which step number, and what the staged rows hold (checked by one query for the whole group)."""

    step: DmlStep
    prepared: PreparedDml
    key_columns: list[ColumnPlan]
    compacted_in_spark: bool
    staging: sql.Identifier
    number: int = 0
    zero_dates: int = 0
    unchanged_sets: list[str] = field(default_factory=list)


def merge_round(conn: psycopg.Connection, cur: psycopg.Cursor, plan: BatchPlan, staged_steps: list[StagedStep],
                connector: str, apply_alone: Callable[[DmlStep], None]) -> None:
    """Merges consecutive staged steps into their tables, their statements sent in one pipeline (no round trip
    each), in a savepoint. When the destination refuses one (a value, a lock or statement timeout), the round is
    undone and its steps applied one by one, each through its own path (`apply_alone`), which names the table, the
    value and its event (or, under `skip`, sets a refused event aside)."""
    if not staged_steps:
        return
    try:
        with conn.transaction(), conn.pipeline():
            for staged_step in staged_steps:
                for statement in staged_merge_statements(staged_step):
                    cur.execute(statement)
    except psycopg.Error as exc:
        if conn.broken:
            raise
        # A refused value, a lock or statement timeout: the steps' own path names the table (and the value).
        log.info("%s: the merge of %d staged steps failed (%s); applying them one by one to name the table",
                 connector, len(staged_steps), exc.diag.message_primary or exc)
        for staged_step in staged_steps:
            apply_alone(staged_step.step)
        return
    for staged_step in staged_steps:
        plan.counts.zero_dates += report_zero_dates(connector, staged_step.step, staged_step.zero_dates)


def staged_merge_statements(s: StagedStep) -> list[sql.Composed]:
    """The statements that merge a staged step into its table (its superseded changes dropped first, if any)."""
    statements = []
    if drops_superseded(s):
        statements.append(drop_superseded_sql(s.staging, s.number, s.key_columns, s.prepared.columns))
    return statements + merge_sql(s.prepared.schema, s.prepared.table, s.step, s.staging, s.number,
                                  s.prepared.columns, s.key_columns, s.prepared.transforms, s.unchanged_sets)


def drops_superseded(staged_step: StagedStep) -> bool:
    """Whether the step's merge drops changes a later change of their key supersedes (`drop_superseded_sql`)."""
    return not staged_step.compacted_in_spark and not set(staged_step.step.ops) <= {"c", "r"}


def is_last_change(number: int, key_columns: list[ColumnPlan], columns: list[ColumnPlan]) -> sql.Composed:
    """Whether a staged row of step `number` is its key's last change of the step (what `drop_superseded_sql`
    keeps)."""
    return sql.SQL("{seq} = max({seq}) OVER (PARTITION BY {keys})").format(
        seq=sql.Identifier(stage_copy.SEQ), keys=sql.SQL(", ").join(_staged_keys(key_columns, columns)))


def drop_superseded_sql(staging: sql.Identifier, number: int, key_columns: list[ColumnPlan],
                        columns: list[ColumnPlan]) -> sql.Composed:
    """The statement that deletes the staged changes of step `number` that a later change of the same key
    supersedes, leaving each key's last change in source order, as `compact_by_key` leaves it. A delete's row holds
    its key (from the row's `before`), any other change's its new key: a key update, sent as a delete and a create,
    ends as both.

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


def merge_sql(schema: str, table: str, step: DmlStep, staging: sql.Identifier, number: int,
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
            t=target, s=staging, step=this_step, op=op, match=match_columns(key_names, "t", values)))
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
            key=sql.SQL(", ").join(map(sql.Identifier, key_names)), action=on_conflict(written, key_names)))
    return statements


def _staged_keys(key_columns: list[ColumnPlan], columns: list[ColumnPlan]) -> list[sql.Identifier]:
    """The staging table's columns that hold a step's key (`ExecutorStaging.value_column`)."""
    staged = ExecutorStaging.value_columns([column.dest_name for column in columns])
    return [sql.Identifier(staged[column.dest_name]) for column in key_columns]
