"""Keyless tables (`apply_keyless`): their steps always take their own path, through the driver, which collects the
row images and applies their net effect as a multiset, set-wise, or one event at a time where an image leaves
columns out.
"""

from __future__ import annotations

from collections import Counter

import psycopg
from psycopg import sql

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.convert.dml import (
    ColumnPlan,
    copy_line,
    parse_copy_line,
    unavailable_placeholder,
    unchanged_columns,
    zero_dates,
)
from cdc_pipeline.mapping import objmap, transform_sql
from cdc_pipeline.sink.plan import DmlStep
from cdc_pipeline.sink.table_writes import TemporaryStaging, copy_lines, param_identifier, report_zero_dates


def apply_keyless(cur: psycopg.Cursor, connector: ConnectorConfig, temporary: TemporaryStaging, schema: str,
                  table: str, step: DmlStep, columns: list[ColumnPlan], transforms: dict[str, objmap.Transform]) -> int:
    """Without a key, an insert adds a row and an update or delete takes away one row equal to its before image
    (adding its after image). Returns how many zero dates were written as NULL. Values of transformed columns
    are matched and written transformed.

    The source made every change on the rows as they were then, so the table's rows as a multiset end up as
    they were, plus the images added, minus those taken away, in whatever order that is done: set-wise
    (`_apply_keyless_net`). Images with columns left out (unchanged TOASTed values, which the before row must
    supply) are applied one event at a time, in source order, neither matching nor writing those columns.
    """
    placeholder = unavailable_placeholder(connector)
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
        _apply_keyless_net(cur, temporary, target, columns, rows, transforms)
        return report_zero_dates(connector.name, step, zero_dates_written)
    names = [column.dest_name for column in columns]
    values = [transform_sql.parameter_value(column, transforms.get(column.dest_name)) for column in columns]
    pending_inserts: list[str] = []
    for row in rows:
        if row.op in ("c", "r"):
            pending_inserts.append(row.after_line)
            continue
        if pending_inserts:
            _insert_lines(cur, temporary, target, columns, pending_inserts, transforms)
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
        _insert_lines(cur, temporary, target, columns, pending_inserts, transforms)
    return report_zero_dates(connector.name, step, zero_dates_written)


def _apply_keyless_net(cur: psycopg.Cursor, temporary: TemporaryStaging, target: sql.Identifier,
                       columns: list[ColumnPlan], rows: list, transforms: dict[str, objmap.Transform]) -> None:
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
        staging = temporary.create(cur, target, names, transforms)
        cur.execute(sql.SQL("ALTER TABLE {} ADD COLUMN _cdc_copies integer").format(staging))
        copy_lines(cur, staging, [*names, "_cdc_copies"], removed)
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
        _insert_lines(cur, temporary, target, columns, added, transforms)


def _insert_lines(cur: psycopg.Cursor, temporary: TemporaryStaging, target: sql.Identifier, columns: list[ColumnPlan],
                  lines: list[str], transforms: dict[str, objmap.Transform]) -> None:
    """COPYs rows into the target; with transforms through a staging table, transformed in the INSERT."""
    names = [column.dest_name for column in columns]
    if not transforms:
        copy_lines(cur, target, names, lines)
        return
    staging = temporary.create(cur, target, names, transforms)
    copy_lines(cur, staging, names, lines)
    values = transform_sql.staged_values(columns, transforms, "s")
    cur.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} AS s").format(
        target, sql.SQL(", ").join(map(sql.Identifier, names)), sql.SQL(", ").join(values[name] for name in names),
        staging))
