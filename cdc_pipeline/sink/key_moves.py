"""Key moves: key updates whose new row leaves unchanged TOASTed values out (`KeyMove`).

Debezium sends a key update as a delete of the old key and a create of the new one, both with the update's offset
(`key_update_pairs`); a create never carries the placeholder of an unchanged TOASTed value otherwise. Such a value is
nowhere in the batch: the destination's row of the old key holds it. So a step holding a key move leaves its group's
staging (`steps_moving_toasted_keys`, one Spark job for the whole group) and its own path applies each key move to
the old key's row (`key_moves` finds them, `move_key` applies one).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import psycopg
from psycopg import sql
from pyspark.sql import functions as F

from cdc_pipeline.convert.dml import (
    ColumnPlan,
    copy_line,
    parse_copy_line,
    placeholder_forms,
    unchanged_columns,
    zero_dates,
)
from cdc_pipeline.decode.events import DATA_CHANGE, EventRef
from cdc_pipeline.mapping import objmap, transform_sql
from cdc_pipeline.sink.plan import BatchPlan, DmlStep, with_frame
from cdc_pipeline.sink.table_writes import param_identifier, report_zero_dates

log = logging.getLogger(__name__)


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


def key_update_pairs(refs: list[EventRef]) -> dict[int, int]:
    """The key updates among one table's changes in source order, as {create seq: delete seq}: Debezium sends one as
    a delete of the old key and a create of the new one, both with the update's offset."""
    return {create.seq: delete.seq for delete, create in zip(refs, refs[1:])
            if delete.op == "d" and create.op == "c" and delete.offset and delete.offset == create.offset}


def steps_moving_toasted_keys(plan: BatchPlan, steps: list[DmlStep], placeholder: str | None) -> set[int]:
    """The steps (their `id`) holding a key update whose new row may leave a TOASTed value out: their own path
    applies it to the old key's row (`key_moves`). Found from the index, then with one Spark job for the whole
    group: a create of a key update that carries a placeholder in any column (a superset of those `key_moves`
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
        creates.update((create, id(step)) for create in key_update_pairs(refs))
    if not creates:
        return set()
    forms = sorted({form for connect_type in ("string", "bytes", "array")
                    for form in placeholder_forms(placeholder, connect_type)})
    found = plan.parsed.events.where(F.col("seq").isin(sorted(creates))).where(
        F.exists(F.map_values("after"), lambda value: value.isin(*forms))).select("seq").collect()
    return {creates[row.seq] for row in found}


def key_moves(step: DmlStep, step_refs: Callable[[DmlStep], list[EventRef]], columns: list[ColumnPlan],
              key: list[str], placeholder: str | None) -> list[KeyMove]:
    """The step's key updates whose new row leaves unchanged TOASTed values out, in source order (`step_refs`
    gives a step's data changes in source order, those set aside left out).

    Debezium sends a key update as a delete of the old key and a create of the new one, both with the update's
    offset; a create never carries the placeholder otherwise. Found from the index first (one Spark job only
    for a step that holds such a pair)."""
    if placeholder is None or not {"c", "d"} <= set(step.ops):
        return []
    pairs = key_update_pairs(step_refs(step))
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


def move_key(cur: psycopg.Cursor, connector: str, schema: str, table: str, step: DmlStep, move: KeyMove,
             columns: list[ColumnPlan], key: list[str], transforms: dict[str, objmap.Transform]) -> int:
    """Applies one key update to the old key's row: its key and written columns take the new values, its
    unchanged TOASTed columns keep theirs. Without that row (never copied), the new row is upserted without
    them, as a create is. Returns how many zero dates were written as NULL."""
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
                    "its unchanged TOASTed columns %s stay empty", connector, schema, table,
                    move.create_seq, sorted(move.unchanged))
        updates = [names[i] for i in written if names[i] not in key]
        action = sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
            sql.SQL("{0} = EXCLUDED.{0}").format(param_identifier(name)) for name in updates)) if updates \
            else sql.SQL("DO NOTHING")
        cur.execute(sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) {}").format(
            target, sql.SQL(", ").join(param_identifier(names[i]) for i in written),
            sql.SQL(", ").join(values[names[i]] for i in written),
            sql.SQL(", ").join(map(param_identifier, key)), action), new_values)
    return report_zero_dates(connector, step, move.zero_dates)
