"""The DML lines the apply writes, as Spark expressions over a step's row images (the `convert_dml` stage's output):
the line Spark's tasks stage per change (`stage_line`; a group's shared line reads each column's names from its
row's step, so tables of one shape share one expression), the line the driver collects per change for its own merge,
a group's rows of one shape compacted per key (`compact_shared_rows`), and the cache that builds each line once per
table version (`DmlLines`: building one costs many calls into the JVM).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_pipeline.copy_text import copy_escape
from cdc_pipeline.convert.dml import ColumnKeys, ColumnPlan, compact_by_key, copy_line, unchanged_columns, zero_dates

# Line expressions kept per applier, the least recently used dropped first: two per table version, for schemas of a
# few thousand tables.
_EXPRESSION_CACHE_SIZE = 8192
# The column of a group's staged rows holding their step's entry in the group's lookup (`sink/group_stage.py`): its
# target, the shape of its table, its seq range, and its columns' source (`names`) and destination names (`dests`).
STAGE_STEP = "_cdc_step"


class DmlLines:
    """An applier's line expressions: the stage, merge and shared stage lines, each kept once built (`_cached_line`)."""

    def __init__(self) -> None:
        self._lines = _Kept(_EXPRESSION_CACHE_SIZE)

    def stage(self, columns: list[ColumnPlan], key_columns: list[ColumnPlan], placeholder: str | None) -> Column:
        """The line Spark's tasks stage per change (`stage_copy.LINE_HEADER`, then every column's value; a delete's
        line has its key's values only). Built once per table version, as `merge` is."""
        return self._cached_line("stage", columns, key_columns, placeholder,
                                 lambda: stage_line(columns, key_columns, placeholder))

    def merge(self, columns: list[ColumnPlan], key_columns: list[ColumnPlan], placeholder: str | None) -> Column:
        """The line the driver's merge collects per change: a header "op zero_dates unchanged" (the unchanged columns
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

    def shared_stage(self, columns: list[ColumnPlan], key_columns: list[ColumnPlan], placeholder: str | None
                     ) -> tuple[Column, str]:
        """`stage` with each column's source and destination name read from the row's step in the group's lookup
        (`STAGE_STEP`), and the expression's text: tables whose lines read the same share one projection."""
        def build() -> tuple[Column, str]:
            line = stage_line(columns, key_columns, placeholder,
                              names=[F.col(f"{STAGE_STEP}.names")[index] for index in range(len(columns))],
                              dests=[F.col(f"{STAGE_STEP}.dests")[index] for index in range(len(columns))])
            return line, str(line._jc.toString())

        return self._lines.get(("shared", *_line_key(columns, key_columns, placeholder)), build)

    def _cached_line(self, kind: str, columns: list[ColumnPlan], key_columns: list[ColumnPlan],
                     placeholder: str | None, build: Callable[[], Column]) -> Column:
        """A line expression, built once per kind and table version and reused by every later batch: it depends only
        on the columns, and building it costs many calls into the JVM. The least recently used is dropped past the
        cache's size."""
        return self._lines.get((kind, *_line_key(columns, key_columns, placeholder)), build)


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


def compact_shared_rows(rows: DataFrame, columns: list[ColumnPlan], key_columns: list[ColumnPlan],
                        placeholder: str | None) -> DataFrame:
    """A group's rows of one shape of table, each key's last change kept in Spark (where a change may leave a TOASTed
    value out: `compact_by_key`, per step, so keys of two tables are never compared); each row's columns are named by
    its step in the group's lookup (`STAGE_STEP`)."""
    position = {column.source_name: index for index, column in enumerate(columns)}
    return compact_by_key(rows, [column.source_name for column in key_columns], columns, placeholder,
                          name_of=lambda name: F.col(f"{STAGE_STEP}.names")[position[name]],
                          within=F.col(f"{STAGE_STEP}.target"))
