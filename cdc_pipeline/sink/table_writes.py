"""What the driver writes into destination tables itself, on a step's own path: the rows it holds, COPYed in chunks
(`copy_lines`) into the target or into a temporary staging table (`TemporaryStaging`, dropped at commit), the SQL
pieces its merges share (`match_columns`, `on_conflict`), identifiers for statements with parameters
(`param_identifier`), and the warning of the zero dates a write turned to NULL (`report_zero_dates`).
"""

from __future__ import annotations

import logging
from typing import Collection, Iterable

import psycopg
from psycopg import sql

from cdc_pipeline.sink.plan import DmlStep

log = logging.getLogger(__name__)

_COPY_CHUNK = 1 << 20


def staging_table_sql(staging: sql.Identifier, target: sql.Identifier, columns: list[str],
                      text_columns: Collection[str] = ()) -> sql.Composed:
    """A temporary table (dropped at commit) with the target's columns; `text_columns` (those with a transform)
    hold text."""
    return sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
        staging, sql.SQL(", ").join(
            sql.SQL("CAST(NULL AS pg_catalog.text) AS {}").format(sql.Identifier(name)) if name in text_columns
            else sql.Identifier(name) for name in columns), target)


class TemporaryStaging:
    """The temporary staging tables of an applier's transactions, each named anew (`_cdc_staging_<n>`)."""

    def __init__(self) -> None:
        self._staging_seq = 0

    def create(self, cur: psycopg.Cursor, target: sql.Identifier, columns: list[str],
               text_columns: Collection[str] = ()) -> sql.Identifier:
        """A temporary table with the target's columns; `text_columns` (those with a transform) hold text."""
        self._staging_seq += 1
        staging = sql.Identifier("pg_temp", f"_cdc_staging_{self._staging_seq}")
        cur.execute(staging_table_sql(staging, target, columns, text_columns))
        return staging


def copy_lines(cur: psycopg.Cursor, table: sql.Identifier, columns: list[str], lines: Iterable[str]) -> None:
    """COPYs lines of COPY text into the table's `columns`, a chunk of about a megabyte at a time."""
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


def param_identifier(*names: str) -> sql.Identifier:
    """An identifier for a statement executed with parameters: psycopg reads `%` there as a placeholder's start
    (also inside a quoted name), and `%%` as one `%`."""
    return sql.Identifier(*(name.replace("%", "%%") for name in names))


def on_conflict(written: list[str], key_names: list[str]) -> sql.Composable:
    """An upsert's action on an existing key: every written column that is not the key takes the new value."""
    updates = [name for name in written if name not in key_names]
    if not updates:
        return sql.SQL("DO NOTHING")
    return sql.SQL("DO UPDATE SET {}").format(
        sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(name)) for name in updates))


def match_columns(names: list[str], left: str, values: dict[str, sql.Composable]) -> sql.Composed:
    """`left`'s columns `names` equal to their `values`, joined by AND (a merge's match on the key)."""
    return sql.SQL(" AND ").join(
        sql.SQL("{}.{} = {}").format(sql.Identifier(left), sql.Identifier(name), values[name]) for name in names)


def report_zero_dates(connector: str, step: DmlStep, count: int) -> int:
    """Warns of the zero dates a write of the step turned to NULL, if any; returns their count."""
    if count:
        log.warning("%s: %d zero dates of %s written as NULL (up to %s)", connector, count,
                    step.source_table, step.last_ref.position if step.last_ref else None)
    return count
