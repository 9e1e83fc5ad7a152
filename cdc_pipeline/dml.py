"""Converting row images into PostgreSQL COPY text, in Spark, and compacting changes per key.

For each column the driver picks one Spark expression from the Debezium representation (Connect type and
logical name): the "function matrix". The expression turns the JSON text of a value into PostgreSQL's text
input form, and the row becomes one line of COPY text format. No Python runs per value.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from cdc_pipeline.errors import ConversionError
from cdc_pipeline.events import FieldSpec

log = logging.getLogger(__name__)

NULL_TEXT = "\\N"

Converter = Callable[[Column, FieldSpec, str], Column]


def _identity(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    return value


def _bytes_hex(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    return F.concat(F.lit("\\x"), F.lower(F.hex(F.unbase64(value))))


def _bits_text(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    """Debezium sends BIT(n) as little-endian bytes; PostgreSQL's bit(n) reads the digits, most significant first."""
    little_endian = F.regexp_extract_all(F.hex(F.unbase64(value)), F.lit("(..)"), 1)
    big_endian_hex = F.array_join(F.reverse(little_endian), "")
    digits = F.conv(big_endian_hex, 16, 2)
    length = int(spec.parameters.get("length") or 0)
    return F.lpad(digits, length, "0") if length else digits


def _days_to_date(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    return F.date_format(F.date_add(F.lit("1970-01-01").cast("date"), value.cast("int")), "yyyy-MM-dd")


def _instant_text(micros: Column) -> Column:
    return F.date_format(F.timestamp_micros(micros), "yyyy-MM-dd HH:mm:ss.SSSSSS")


def _millis_timestamp(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    return _instant_text(value.cast("long") * 1000)


def _micros_timestamp(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    return _instant_text(value.cast("long"))


def _nanos_timestamp(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    return _instant_text(F.floor(value.cast("decimal(38,0)") / 1000).cast("long"))


def _time_of_day(unit: str) -> Converter:
    """Time since midnight in `unit` (millis, micros, nanos): `time` text, or an interval for MariaDB TIME."""
    def convert(value: Column, spec: FieldSpec, pg_type: str) -> Column:
        if unit == "millis":
            micros = value.cast("long") * 1000
        elif unit == "nanos":
            micros = F.floor(value.cast("decimal(38,0)") / 1000).cast("long")
        else:
            micros = value.cast("long")
        if pg_type.startswith("interval"):
            return F.concat(micros.cast("string"), F.lit(" microseconds"))
        magnitude = F.abs(micros)
        return F.format_string(
            "%s%02d:%02d:%02d.%06d",
            F.when(micros < 0, F.lit("-")).otherwise(F.lit("")),
            (magnitude / 3_600_000_000).cast("long"),
            ((magnitude / 60_000_000) % 60).cast("long"),
            ((magnitude / 1_000_000) % 60).cast("long"),
            magnitude % 1_000_000,
        )
    return convert


# (Connect type or None for any, logical name or None) -> converter. Looked up most specific first.
CONVERTERS: dict[tuple[str | None, str | None], Converter] = {
    (None, "io.debezium.time.Date"): _days_to_date,
    (None, "org.apache.kafka.connect.data.Date"): _days_to_date,
    (None, "io.debezium.time.Timestamp"): _millis_timestamp,
    (None, "org.apache.kafka.connect.data.Timestamp"): _millis_timestamp,
    (None, "io.debezium.time.MicroTimestamp"): _micros_timestamp,
    (None, "io.debezium.time.NanoTimestamp"): _nanos_timestamp,
    (None, "io.debezium.time.ZonedTimestamp"): _identity,
    (None, "io.debezium.time.ZonedTime"): _identity,
    (None, "io.debezium.time.Time"): _time_of_day("millis"),
    (None, "org.apache.kafka.connect.data.Time"): _time_of_day("millis"),
    (None, "io.debezium.time.MicroTime"): _time_of_day("micros"),
    (None, "io.debezium.time.NanoTime"): _time_of_day("nanos"),
    (None, "io.debezium.time.Year"): _identity,
    (None, "org.apache.kafka.connect.data.Decimal"): _identity,
    (None, "io.debezium.data.VariableScaleDecimal"): _identity,
    (None, "io.debezium.data.Json"): _identity,
    (None, "io.debezium.data.Enum"): _identity,
    (None, "io.debezium.data.EnumSet"): _identity,
    (None, "io.debezium.data.Uuid"): _identity,
    (None, "io.debezium.data.Bits"): _bits_text,
    (None, "io.debezium.data.Xml"): _identity,
    ("bytes", None): _bytes_hex,
    ("boolean", None): _identity,
    ("string", None): _identity,
    ("int8", None): _identity,
    ("int16", None): _identity,
    ("int32", None): _identity,
    ("int64", None): _identity,
    ("float", None): _identity,
    ("double", None): _identity,
    ("float32", None): _identity,
    ("float64", None): _identity,
}


def converter_for(spec: FieldSpec) -> Converter | None:
    """The converter of a column's Debezium representation, or None when there is none."""
    if spec.logical is not None:
        return CONVERTERS.get((None, spec.logical)) or CONVERTERS.get((spec.type, spec.logical))
    return CONVERTERS.get((spec.type, None))


def copy_escape(text: Column) -> Column:
    """Escapes a text value for COPY text format (backslash, newline, carriage return, tab)."""
    escaped = F.replace(text, F.lit("\\"), F.lit("\\\\"))
    escaped = F.replace(escaped, F.lit("\n"), F.lit("\\n"))
    escaped = F.replace(escaped, F.lit("\r"), F.lit("\\r"))
    return F.replace(escaped, F.lit("\t"), F.lit("\\t"))


@dataclass(frozen=True)
class ColumnPlan:
    """How one destination column is filled from a row image."""

    source_name: str
    dest_name: str
    pg_type: str
    spec: FieldSpec
    convert: Converter


def plan_columns(fields: list[FieldSpec], dest_columns: dict[str, str], name_of: Callable[[str], str], *,
                 connector: str, table: str) -> list[ColumnPlan]:
    """Matches each event column with its destination column and picks its converter."""
    plans = []
    for spec in fields:
        dest_name = name_of(spec.name)
        if dest_name not in dest_columns:
            raise ConversionError(
                f"column {spec.name!r} of the change events has no destination column {dest_name!r} "
                f"(destination columns: {', '.join(dest_columns)})", connector=connector, table=table)
        convert = converter_for(spec)
        if convert is None:
            log.warning("No converter for %s.%s (%s, %s): passing its text through", table, spec.name, spec.type,
                        spec.logical)
            convert = _identity
        plans.append(ColumnPlan(spec.name, dest_name, dest_columns[dest_name], spec, convert))
    return plans


def copy_line(image: str, columns: list[ColumnPlan]) -> Column:
    """One COPY text line from the `before` or `after` map, in the order of `columns`."""
    values = []
    for column in columns:
        raw = F.col(image)[column.source_name]
        values.append(F.coalesce(copy_escape(column.convert(raw, column.spec, column.pg_type)), F.lit(NULL_TEXT)))
    return F.concat_ws("\t", *values)


def compact_by_key(changes: DataFrame, key_columns: list[str]) -> DataFrame:
    """Keeps each key's last change in source order: its net effect (an upsert of the last image, or a delete).

    A key is read from `after`, or from `before` for deletes; a primary-key change arrives from Debezium as a
    delete of the old key and a create of the new one, so each key's last event is still its final state.
    """
    key_exprs = [
        F.when(F.col("op") == "d", F.col("before")[name]).otherwise(F.col("after")[name]).alias(f"_key_{i}")
        for i, name in enumerate(key_columns)
    ]
    keyed = changes.select("*", *key_exprs)
    order = Window.partitionBy(*[f"_key_{i}" for i in range(len(key_columns))]).orderBy(F.col("seq").desc())
    return keyed.withColumn("_rank", F.row_number().over(order)).where(F.col("_rank") == 1)


def parse_copy_line(line: str) -> list[str | None]:
    """Splits a COPY text line back into values (None for NULL); used where rows apply one at a time."""
    values: list[str | None] = []
    for field in line.split("\t"):
        if field == NULL_TEXT:
            values.append(None)
            continue
        out, i = [], 0
        while i < len(field):
            char = field[i]
            if char == "\\" and i + 1 < len(field):
                nxt = field[i + 1]
                out.append({"n": "\n", "r": "\r", "t": "\t", "\\": "\\"}.get(nxt, nxt))
                i += 2
            else:
                out.append(char)
                i += 1
        values.append("".join(out))
    return values
