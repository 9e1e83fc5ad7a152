"""Transforms as SQL: a rule's expression run by the destination, set-wise, on the staged converted values (`%d` a
reference to the value, never the value spliced into SQL text), the cast each staged text value takes into its
column, and, when a merge fails, the bisection that finds the value and the event the destination refused."""

from __future__ import annotations

import logging
import re
from typing import Mapping, Sequence

import psycopg
from psycopg import sql
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_pipeline.convert.dml import ColumnPlan, RejectedValue, copy_line, events_with_value, parse_copy_line
from cdc_pipeline.errors import ConversionError
from cdc_pipeline.decode.events import EventRef
from cdc_pipeline.mapping.objmap import Placeholder, Transform, quote_literal

log = logging.getLogger(__name__)


_SRID_PREFIX = r"^SRID=[0-9]+;"


def _placeholder_sql(letter: str, value: sql.Composable, pg_type: str, *, as_text: bool) -> sql.Composable:
    if letter == "d":
        return value if as_text else sql.SQL("CAST({} AS {})").format(value, sql.SQL(pg_type))
    if letter == "w":
        hex_wkb = sql.SQL("regexp_replace({}, {}, '')").format(value, sql.Literal(_SRID_PREFIX))
        return hex_wkb if as_text else sql.SQL("decode({}, 'hex')").format(hex_wkb)
    srid = sql.SQL("substring({} from {})").format(value, sql.Literal("^SRID=([0-9]+);"))
    return (sql.SQL("coalesce({}, '0')").format(srid) if as_text
            else sql.SQL("coalesce(CAST({} AS integer), 0)").format(srid))


def transform_sql(transform: Transform, value: sql.Composable, pg_type: str, *, with_parameters: bool) -> sql.Composed:
    """The transform over `value` (the staged text of a converted value), cast to the destination type.

    `with_parameters`: the statement also has parameters, so a percent sign of the expression is doubled.
    """
    def raw(text: str) -> sql.SQL:
        return sql.SQL(text.replace("%", "%%") if with_parameters else text)

    pieces: list[sql.Composable] = []
    for part in transform.parts:
        if isinstance(part, str):
            pieces.append(raw(part))
        elif isinstance(part, Placeholder):
            pieces.append(_placeholder_sql(part.letter, value, pg_type, as_text=False))
        else:
            texts = [raw(quote_literal(piece)) if isinstance(piece, str)
                     else _placeholder_sql(piece.letter, value, pg_type, as_text=True)
                     for piece in part.pieces]
            pieces.append(sql.SQL("({})").format(sql.SQL(" || ").join(texts)))
    return sql.SQL("CAST(({}) AS {})").format(sql.Composed(pieces), sql.SQL(_result_type(pg_type)))


_CHARACTER_TYPES = frozenset({"character varying", "character", "varchar", "char", "bpchar"})
_BIT_TYPES = frozenset({"bit", "bit varying", "varbit"})
# A numeric type modifier (`(64)`, `(12,2)`).
_NUMERIC_TYPMOD = re.compile(r"\(\s*\d+\s*(?:,\s*-?\d+\s*)?\)")


def _result_type(pg_type: str) -> str:
    """What a transform's result is cast to: the column's type, but text for a character type, so that a result
    too long for the column fails on assignment instead of being cut short by the explicit cast."""
    return "text" if pg_type.split("(", 1)[0].strip().lower() in _CHARACTER_TYPES else pg_type


def staged_cast_type(pg_type: str) -> str:
    """What a staged text value is cast to before it is written to (or compared with) a column of `pg_type`, so
    that it ends as COPY into the column would make it: the column's type (a numeric or time value rounded as
    COPY rounds it), but where an explicit cast would cut or pad a value silently (varchar(n), char(n), bit(n),
    the elements of an array) the type without its modifier, whose assignment to the column then fails as COPY
    does."""
    if pg_type.rstrip().endswith("]"):
        return _NUMERIC_TYPMOD.sub("", pg_type).strip()
    base = pg_type.split("(", 1)[0].strip().lower()
    if base in _CHARACTER_TYPES:
        return "text"
    return "bit varying" if base in _BIT_TYPES else pg_type


def staged_values(columns: Sequence[ColumnPlan], transforms: Mapping[str, Transform], alias: str, *,
                  all_text: bool = False, staged_names: Mapping[str, str] | None = None) -> dict[str, sql.Composable]:
    """Each column's destination value read from a staging table: the staged column, or its transform.

    `all_text`: every staged column holds text (`stage_copy`), and is cast to its column's type. `staged_names`:
    the staging table's column of each destination column, where it is not the same name."""
    def value(column: ColumnPlan) -> sql.Composable:
        staged = sql.Identifier(alias, staged_names[column.dest_name] if staged_names else column.dest_name)
        if column.dest_name in transforms:
            return transform_sql(transforms[column.dest_name], staged, column.pg_type, with_parameters=False)
        if all_text:
            return sql.SQL("CAST({} AS {})").format(staged, sql.SQL(staged_cast_type(column.pg_type)))
        return staged

    return {column.dest_name: value(column) for column in columns}


def parameter_value(column: ColumnPlan, transform: Transform | None) -> sql.Composable:
    """A column's destination value from one bound parameter (`%s`, its converted text)."""
    if transform is None:
        return sql.SQL("CAST(%s AS {})").format(sql.SQL(column.pg_type))
    return sql.SQL("(SELECT {} FROM (SELECT CAST(%s AS text) AS v) AS _value)").format(
        transform_sql(transform, sql.Identifier("_value", "v"), column.pg_type, with_parameters=True))


def transform_error(cur: psycopg.Cursor, frame: DataFrame, columns: Sequence[ColumnPlan],
                    transforms: Mapping[str, Transform], *, connector: str, table: str, target: str,
                    refs: Mapping[int, EventRef]) -> ConversionError | None:
    """After a DML segment failed (its savepoint rolled back): the transform that fails on a value of the segment,
    with the first event carrying the value and its position; None when every transform takes every value.

    Runs on the failure path only: one Spark job per transformed column for its distinct values, then the
    transform over halves of them, a savepoint each, until one value is left.
    """
    for column in columns:
        transform = transforms.get(column.dest_name)
        if transform is None:
            continue
        # The values transformed: after images, and before images where rows are looked up by them.
        after = F.when(F.col("op") != "d", copy_line("after", [column]))
        before = F.when(F.col("op").isin("u", "d"), copy_line("before", [column]))
        texts = (frame.select(F.explode(F.array(after, before)).alias("text")).where(F.col("text").isNotNull())
                 .distinct().collect())
        values = [parse_copy_line(row.text)[0] for row in texts]
        query = sql.SQL("SELECT {} FROM unnest(CAST(%s AS text[])) AS _value(v)").format(
            transform_sql(transform, sql.Identifier("_value", "v"), column.pg_type, with_parameters=True))
        failure = _failure(cur, query, values)
        if failure is None:
            continue
        while len(values) > 1:
            half = values[:len(values) // 2]
            message = _failure(cur, query, half)
            if message is not None:
                values, failure = half, message
            else:
                values = values[len(values) // 2:]
        value = values[0]
        failure = _failure(cur, query, values) or failure
        events = [refs[seq] for seq in events_with_value(frame, RejectedValue(column, value)) if seq in refs]
        where = f"event {events[0].seq} of the batch (op {events[0].op})" if events else "an event of the batch"
        return ConversionError(
            f"cannot apply changes to {target}: the transform {transform.expression!r} of column "
            f"{column.dest_name!r} (source column {column.source_name!r}) failed on the value "
            f"{'NULL' if value is None else repr(value)} of {where}: {failure}",
            connector=connector, table=table, position=events[0].position if events else None)
    return None


def _failure(cur: psycopg.Cursor, query: sql.Composed, values: list[str | None]) -> str | None:
    try:
        with cur.connection.transaction():
            cur.execute(query, (values,))
    except psycopg.Error as exc:
        return exc.diag.message_primary or str(exc)
    return None
