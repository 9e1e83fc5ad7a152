"""Converting row images into PostgreSQL COPY text, in Spark, and compacting changes per key.

For each column the driver picks one Spark expression from the Debezium representation (Connect type and
logical name): the "function matrix". The expression turns the JSON text of a value into PostgreSQL's text
input form, and the row becomes one line of COPY text format. No Python runs per value.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping, Sequence

import psycopg
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from cdc_pipeline import sources
from cdc_pipeline.catalog import ColumnType
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.copy_text import NULL_TEXT, copy_escape, ewkb_hex
from cdc_pipeline.errors import ConversionError
from cdc_pipeline.decode.events import EventRef, FieldSpec
from cdc_pipeline.convert.schema_infer import SOURCE_SCALE_PARAMETER, SOURCE_TYPE_PARAMETER

log = logging.getLogger(__name__)

Converter = Callable[[Column, FieldSpec, str], Column]


def _identity(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    return value


def _bytes_hex(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    return F.concat(F.lit("\\x"), F.lower(F.hex(F.unbase64(value))))


def _bits_text(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    """Debezium sends BIT(n) as little-endian bytes; PostgreSQL's bit(n) reads the digits, most significant first."""
    little_endian = F.regexp_extract_all(F.hex(F.unbase64(value)), F.lit("(..)"), 1)
    big_endian_hex = F.array_join(F.reverse(little_endian), "")
    # PostgreSQL's connector sends all-zero bits as no bytes at all.
    digits = F.when(big_endian_hex == "", F.lit("0")).otherwise(F.conv(big_endian_hex, 16, 2))
    length = int(spec.parameters.get("length") or 0)
    return F.lpad(digits, length, "0") if length else digits


_YEAR_ONE_DAYS = -719_162  # 0001-01-01, in days since 1970-01-01
_YEAR_ONE_MICROS = _YEAR_ONE_DAYS * 86_400_000_000
# PostgreSQL's timestamp 'infinity' and '-infinity' reach the events as pgjdbc's sentinel numbers, in any unit.
_POSITIVE_INFINITY = 9_223_372_036_825_200_000
_NEGATIVE_INFINITY = -9_223_372_036_832_400_000


def _format_with_era(moment: Column, pattern: str, before_year_one: Column) -> Column:
    """PostgreSQL reads years before 1 as the year of the era with a BC suffix (year 0 is 0001 BC)."""
    return F.when(before_year_one, F.date_format(moment, pattern + " G")).otherwise(F.date_format(moment, pattern))


def _days_to_date(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    days = value.cast("int")
    return _format_with_era(F.date_add(F.lit("1970-01-01").cast("date"), days), "yyyy-MM-dd", days < _YEAR_ONE_DAYS)


def _instant_text(micros: Column) -> Column:
    return _format_with_era(F.timestamp_micros(micros), "yyyy-MM-dd HH:mm:ss.SSSSSS", micros < _YEAR_ONE_MICROS)


def _finite_or_infinity(value: Column, finite: Column) -> Column:
    number = value.cast("long")
    return (F.when(number == _POSITIVE_INFINITY, F.lit("infinity"))
            .when(number == _NEGATIVE_INFINITY, F.lit("-infinity"))
            .otherwise(finite))


def _millis_timestamp(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    return _finite_or_infinity(value, _instant_text(value.cast("long") * 1000))


def _micros_timestamp(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    return _finite_or_infinity(value, _instant_text(value.cast("long")))


def _nanos_timestamp(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    return _finite_or_infinity(value, _instant_text(F.floor(value.cast("decimal(38,0)") / 1000).cast("long")))


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
        return F.when(micros.isNotNull(), F.format_string(
            "%s%02d:%02d:%02d.%06d",
            F.when(micros < 0, F.lit("-")).otherwise(F.lit("")),
            (magnitude / 3_600_000_000).cast("long"),
            ((magnitude / 60_000_000) % 60).cast("long"),
            ((magnitude / 1_000_000) % 60).cast("long"),
            magnitude % 1_000_000,
        ))
    return convert


_NUMBER_TYPES = frozenset({"smallint", "integer", "bigint", "numeric", "real", "double precision"})


def _boolean(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    """Connect booleans: `true`/`false`, or 1/0 for a numeric column (a numeric domain, say)."""
    if pg_type.split("(")[0].strip() in _NUMBER_TYPES:
        return F.when(value == "true", F.lit("1")).when(value == "false", F.lit("0")).otherwise(value)
    return value


def _zoned_text(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    """ISO-8601 text with an offset (ZonedTimestamp, ZonedTime) as PostgreSQL reads it; fractions finer than
    microseconds (SQL Server's 100 ns) are truncated, as the Nano* converters truncate, never rounded into the
    next second or day."""
    return F.regexp_replace(value, r"(\.\d{6})\d+", "$1")


def _micro_duration(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    return F.concat(value, F.lit(" microseconds"))


def _nano_duration(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    return F.concat(F.floor(value.cast("decimal(38,0)") / 1000).cast("long").cast("string"), F.lit(" microseconds"))


def _variable_scale_decimal(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    """Oracle NUMBER, PostgreSQL numeric without precision: the runner writes these as plain decimal text.

    Debezium's own struct form, `{"scale": s, "value": base64 of the big-endian two's complement unscaled
    value}`, is decoded as well, up to 38 unscaled digits: a longer one fails the Spark job rather than lose digits.
    """
    return F.when(value.startswith("{"), _decimal_from_struct(value)).otherwise(value)


def _decimal_from_struct(value: Column) -> Column:
    scale = F.get_json_object(value, "$.scale").cast("int")
    hex_digits = F.hex(F.unbase64(F.get_json_object(value, "$.value")))
    negative = F.coalesce(F.substring(hex_digits, 1, 1).isin(*"89ABCDEF"), F.lit(False))
    octets = F.transform(F.regexp_extract_all(hex_digits, F.lit("(..)"), 1),
                         lambda pair: F.conv(pair, 16, 10).cast("int"))
    # A negative two's complement number is -(~x + 1): accumulate the inverted bytes, so no sum exceeds 38 digits.
    magnitude_octets = F.when(negative, F.transform(octets, lambda octet: 255 - octet)).otherwise(octets)
    unsigned = F.aggregate(magnitude_octets, F.lit(0).cast("decimal(38,0)"),
                           lambda total, octet: (total * 256 + octet).cast("decimal(38,0)"))
    digits = F.when(negative, unsigned + 1).otherwise(unsigned).cast("decimal(38,0)").cast("string")
    padded = F.lpad(digits, F.greatest(F.length(digits), scale + 1), "0")
    point = F.length(padded) - scale
    scaled = (
        F.when(scale > 0, F.concat(F.substring(padded, F.lit(1), point), F.lit("."),
                                   F.substring(padded, point + 1, scale)))
        .when(scale < 0, F.concat(digits, F.repeat(F.lit("0"), -scale)))
        .otherwise(digits)
    )
    return F.concat(F.when(negative, F.lit("-")).otherwise(F.lit("")), scaled)


def _enum_set(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    """A SET's members as Debezium sends them (`a,b`), or an array literal for an array column (of an enum, say)."""
    if not pg_type.endswith("[]"):
        return value
    members = _array_literal(F.to_json(F.split(value, ",")), spec, pg_type)
    return F.when(value == "", F.lit("{}")).otherwise(members)


def _geometry(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    """Debezium geometry structs (`{"wkb": base64, "srid": n}`; a Point also has `x`, `y`).

    Into bytea: EWKB, PostGIS's extended WKB, which is the WKB with the source SRID inside it (`ST_GeomFromEWKB`
    reads it; without a source SRID it is the plain WKB). Into PostgreSQL's `point`: `(x,y)` of a Point. Into
    anything else (text, PostGIS geometry, a user type): `SRID=n;` and the WKB in hex, the form PostGIS's geometry
    input reads; without a source SRID just the hex WKB.
    """
    wkb = F.unbase64(F.get_json_object(value, "$.wkb"))
    match pg_type:
        case "bytea":
            return F.concat(F.lit("\\x"),
                            ewkb_hex(F.lower(F.hex(wkb)), F.get_json_object(value, "$.srid").cast("long")))
        case "point":
            return F.when(value.isNotNull(), F.format_string("(%s,%s)", F.get_json_object(value, "$.x"),
                                                             F.get_json_object(value, "$.y")))
    srid = F.get_json_object(value, "$.srid")
    return F.concat(F.when(srid.isNotNull(), F.concat(F.lit("SRID="), srid, F.lit(";"))).otherwise(F.lit("")),
                    F.hex(wkb))


# How Debezium represents the elements of PostgreSQL arrays under the runner's settings (adaptive_time_microseconds,
# bytes as base64), by element type; others are text as they are (numbers, booleans, strings, uuid, inet, ...).
_ARRAY_ELEMENTS: dict[str, tuple[str, str | None]] = {
    "DATE": ("int32", "io.debezium.time.Date"),
    "TIME": ("int64", "io.debezium.time.MicroTime"),
    "TIMETZ": ("string", "io.debezium.time.ZonedTime"),
    "TIMESTAMPTZ": ("string", "io.debezium.time.ZonedTimestamp"),
    "INTERVAL": ("string", "io.debezium.time.Interval"),
    "BYTEA": ("bytes", None),
}


def _array_element_spec(spec: FieldSpec) -> FieldSpec:
    """The representation of an array column's elements.

    The row-image fields carry no `items` schema, so it follows from the propagated source type (PostgreSQL
    names an array type `_element`): a timestamp(0..3) element is milliseconds, a finer one microseconds.
    """
    element = spec.parameters.get(SOURCE_TYPE_PARAMETER, "").strip('"').upper().removeprefix("_")
    if element == "TIMESTAMP":
        scale = int(spec.parameters.get(SOURCE_SCALE_PARAMETER) or 6)
        connect_type, logical = "int64", "io.debezium.time.Timestamp" if scale <= 3 else "io.debezium.time.MicroTimestamp"
    else:
        connect_type, logical = _ARRAY_ELEMENTS.get(element, ("string", None))
    return FieldSpec(name=spec.name, type=connect_type, logical=logical, parameters={}, optional=True)


def _array_literal(value: Column, spec: FieldSpec, pg_type: str) -> Column:
    """A JSON array as PostgreSQL's array literal (`{"a","b",NULL}`), each element converted as its type is.

    Into json or jsonb the JSON text itself. Multidimensional arrays are not representable in Debezium's events.
    """
    if pg_type in ("json", "jsonb"):
        return value
    element_spec = _array_element_spec(spec)
    convert = converter_for(element_spec) or _identity
    element_type = pg_type.removesuffix("[]") if pg_type.endswith("[]") else "text"

    def quoted(element: Column) -> Column:
        text = convert(element, element_spec, element_type)
        return F.coalesce(F.concat(F.lit('"'), F.regexp_replace(text, r'(["\\])', r"\\$1"), F.lit('"')), F.lit("NULL"))

    elements = F.transform(F.from_json(value, "array<string>"), quoted)
    return F.concat(F.lit("{"), F.array_join(elements, ","), F.lit("}"))


# (Connect type or None for any, logical name or None) -> converter. Looked up most specific first.
CONVERTERS: dict[tuple[str | None, str | None], Converter] = {
    (None, "io.debezium.time.Date"): _days_to_date,
    (None, "org.apache.kafka.connect.data.Date"): _days_to_date,
    (None, "io.debezium.time.Timestamp"): _millis_timestamp,
    (None, "org.apache.kafka.connect.data.Timestamp"): _millis_timestamp,
    (None, "io.debezium.time.MicroTimestamp"): _micros_timestamp,
    (None, "io.debezium.time.NanoTimestamp"): _nanos_timestamp,
    (None, "io.debezium.time.ZonedTimestamp"): _zoned_text,
    (None, "io.debezium.time.ZonedTime"): _zoned_text,
    (None, "io.debezium.time.Time"): _time_of_day("millis"),
    (None, "org.apache.kafka.connect.data.Time"): _time_of_day("millis"),
    (None, "io.debezium.time.MicroTime"): _time_of_day("micros"),
    (None, "io.debezium.time.NanoTime"): _time_of_day("nanos"),
    (None, "io.debezium.time.Year"): _identity,
    (None, "io.debezium.time.MicroDuration"): _micro_duration,
    (None, "io.debezium.time.NanoDuration"): _nano_duration,
    (None, "io.debezium.time.Interval"): _identity,
    (None, "org.apache.kafka.connect.data.Decimal"): _identity,
    (None, "io.debezium.data.VariableScaleDecimal"): _variable_scale_decimal,
    (None, "io.debezium.data.Json"): _identity,
    (None, "io.debezium.data.Enum"): _identity,
    (None, "io.debezium.data.EnumSet"): _enum_set,
    (None, "io.debezium.data.Uuid"): _identity,
    (None, "io.debezium.data.Bits"): _bits_text,
    (None, "io.debezium.data.Xml"): _identity,
    (None, "io.debezium.data.geometry.Geometry"): _geometry,
    (None, "io.debezium.data.geometry.Geography"): _geometry,
    (None, "io.debezium.data.geometry.Point"): _geometry,
    ("bytes", None): _bytes_hex,
    ("array", None): _array_literal,
    ("boolean", None): _boolean,
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


@dataclass(frozen=True)
class ColumnPlan:
    """How one destination column is filled from a row image.

    `dest_type` is what the catalog says of the column's type, when known. A column whose type the pipeline did
    not create (a domain, an enum, citext, hstore, ...) receives the text input form of its `input_type`: the
    base type of a domain over a built-in type, else a stand-in for the type's category (`CATEGORY_INPUT_TYPES`).
    """

    source_name: str
    dest_name: str
    pg_type: str
    spec: FieldSpec
    convert: Converter
    dest_type: ColumnType | None = None

    @property
    def input_type(self) -> str:
        """The built-in type whose text input form the converter writes for this column."""
        dest_type = self.dest_type
        if dest_type is None or not dest_type.user_defined:
            return self.pg_type
        if dest_type.builtin:
            return dest_type.base
        return CATEGORY_INPUT_TYPES.get(dest_type.category, dest_type.base)

    @property
    def source_type(self) -> str:
        """The source column as the events describe it: its source type if propagated, its Debezium representation."""
        representation = " ".join(part for part in (self.spec.type, self.spec.logical) if part)
        source = self.spec.parameters.get(SOURCE_TYPE_PARAMETER)
        return f"{source} ({representation})" if source else representation

    @property
    def destination_type(self) -> str:
        """The destination column's type, with what it is when the pipeline did not create it."""
        dest_type = self.dest_type
        if dest_type is None or not dest_type.user_defined:
            return self.pg_type
        if dest_type.base != dest_type.name:
            return f"{self.pg_type} (a domain over {dest_type.base})"
        return f"{self.pg_type} ({CATEGORY_NAMES.get(dest_type.category, 'user-defined type')})"


# The text form a type the pipeline did not create receives, by pg_type.typcategory (domains resolved first):
# a string, enum, composite or user type (citext, hstore, PostGIS geometry, ...) takes the value's text, a
# numeric type numeric text, a boolean type true/false. Datetime and geometric types take their own name's form.
CATEGORY_INPUT_TYPES: dict[str, str] = {
    "A": "text[]",
    "B": "boolean",
    "C": "text",
    "E": "text",
    "I": "inet",
    "N": "numeric",
    "R": "text",
    "S": "text",
    "T": "interval",
    "U": "text",
    "V": "bit varying",
    "X": "text",
}

CATEGORY_NAMES: dict[str, str] = {
    "A": "an array", "B": "a boolean type", "C": "a composite type", "D": "a datetime type", "E": "an enum",
    "G": "a geometric type", "I": "a network address type", "N": "a numeric type", "R": "a range type",
    "S": "a string type", "T": "a timespan type", "U": "a user-defined type", "V": "a bit-string type",
}


def plan_columns(fields: list[FieldSpec], dest_columns: dict[str, str], name_of: Callable[[str], str], *,
                 connector: str, table: str, dest_types: Mapping[str, ColumnType] | None = None,
                 position: Any = None) -> list[ColumnPlan]:
    """Matches each event column with its destination column and picks its converter.

    `dest_types` (from `catalog.destination_table`) lets columns of types the pipeline did not create
    receive the form their type's category reads (see `ColumnPlan`).
    """
    plans = []
    for spec in fields:
        dest_name = name_of(spec.name)
        if dest_name not in dest_columns:
            raise ConversionError(
                f"column {spec.name!r} of the change events has no destination column {dest_name!r} "
                f"(destination columns: {', '.join(dest_columns)})", connector=connector, table=table,
                position=position)
        convert = converter_for(spec)
        if convert is None:
            log.warning("No converter for %s.%s (%s, %s): passing its text through", table, spec.name, spec.type,
                        spec.logical)
            convert = _identity
        plans.append(ColumnPlan(spec.name, dest_name, dest_columns[dest_name], spec, convert,
                                (dest_types or {}).get(dest_name)))
    return plans


_ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
# The source column types whose zero value Debezium sends as the epoch: MariaDB/MySQL's TIMESTAMP.
_ZERO_AS_EPOCH_TYPES = frozenset({"TIMESTAMP"})
_ZERO_TIMESTAMP = r"^1970-01-01T00:00:00(\.0+)?Z$"


def zero_date(raw: Column, spec: FieldSpec) -> Column | None:
    """Where a value is a MariaDB/MySQL zero date that Debezium turned into a real date; None if it never is.

    A zero TIMESTAMP ('0000-00-00 00:00:00') reaches the events as the epoch, which a TIMESTAMP cannot hold
    otherwise (its range starts at 1970-01-01 00:00:01 UTC). Zero DATE and DATETIME values Debezium already
    sends as NULL (or, in a NOT NULL column, as 1970-01-01, which cannot be told from that real date).
    """
    source_type = spec.parameters.get(SOURCE_TYPE_PARAMETER, "").split("(")[0].strip().upper()
    if spec.logical == _ZONED_TIMESTAMP and source_type in _ZERO_AS_EPOCH_TYPES:
        return raw.rlike(_ZERO_TIMESTAMP)
    return None


ColumnKeys = Sequence[Column]
"""Where each column's value is found in a row image, in the order of the columns: by default its source name; a
group's shared line (`dml_lines.py`) reads the names from the row instead, so that tables of one shape share one
expression."""


def _raw(image: str, columns: Sequence[ColumnPlan], index: int, keys: ColumnKeys | None) -> Column:
    """The value of column `index` in the row image `image`."""
    return F.col(image)[keys[index] if keys is not None else columns[index].source_name]


def may_hold_zero_dates(columns: Sequence[ColumnPlan]) -> bool:
    """Whether a row of these columns can carry a zero date (`zero_date`)."""
    return any(zero_date(F.lit(None), column.spec) is not None for column in columns)


def zero_dates(image: str, columns: list[ColumnPlan], keys: ColumnKeys | None = None) -> Column:
    """How many values of the row image are zero dates (written as NULL by `copy_line`)."""
    flags = [F.when(zero, 1).otherwise(0) for index, column in enumerate(columns)
             if (zero := zero_date(_raw(image, columns, index, keys), column.spec)) is not None]
    return sum(flags[1:], flags[0]) if flags else F.lit(0)


DEFAULT_UNAVAILABLE_PLACEHOLDER = "__debezium_unavailable_value"
UNAVAILABLE_PLACEHOLDER_PROPERTY = "unavailable.value.placeholder"


def unavailable_placeholder(connector: ConnectorConfig) -> str | None:
    """The placeholder the connector's events put for a value they leave out, or None for sources without one."""
    if not sources.module_for(connector.type).LEAVES_VALUES_OUT:
        return None
    return connector.debezium.get(UNAVAILABLE_PLACEHOLDER_PROPERTY, DEFAULT_UNAVAILABLE_PLACEHOLDER)


def placeholder_forms(placeholder: str, connect_type: str) -> tuple[str, ...]:
    """The JSON text of Debezium's placeholder for an unchanged TOASTed value, in a column of `connect_type`.

    Strings carry it as is, bytes as its base64, string arrays as a one-element array, integer arrays as
    the array of its octets. Debezium's `hex:` prefix gives the placeholder as hex octets.
    """
    octets = bytes.fromhex(placeholder[4:]) if placeholder.startswith("hex:") else placeholder.encode()
    match connect_type:
        case "string":
            return (octets.decode("utf-8", "replace"),)
        case "bytes":
            return (base64.b64encode(octets).decode(),)
        case "array":
            return (json.dumps([octets.decode("utf-8", "replace")], separators=(",", ":")),
                    "[" + ",".join(str(octet) for octet in octets) + "]")
    return ()


def _is_placeholder(raw: Column, spec: FieldSpec, placeholder: str | None) -> Column | None:
    forms = placeholder_forms(placeholder, spec.type) if placeholder else ()
    return raw.isin(*forms) if forms else None


def may_leave_values_out(columns: Sequence[ColumnPlan], placeholder: str | None) -> bool:
    """Whether a change of these columns can carry the placeholder of an unchanged TOASTed value (the source has
    one, and a column is of a type that can hold it): its value must then come from an earlier change of the key
    in the batch, which `compact_by_key` finds."""
    return bool(placeholder) and any(placeholder_forms(placeholder, column.spec.type) for column in columns)


def unchanged_columns(image: str, columns: list[ColumnPlan], placeholder: str | None, keys: ColumnKeys | None = None,
                      dest_names: ColumnKeys | None = None) -> Column:
    """The destination names of the columns whose value is the placeholder of an unchanged TOASTed value (with
    `dest_names`, each column's name is read from the row, as its value is with `keys`)."""
    flags = [F.when(flag, dest_names[index] if dest_names is not None else F.lit(column.dest_name))
             for index, column in enumerate(columns)
             if (flag := _is_placeholder(_raw(image, columns, index, keys), column.spec, placeholder)) is not None]
    return F.array_compact(F.array(*flags)) if flags else F.array().cast("array<string>")


# Representations whose text never holds a backslash, newline, carriage return or tab: COPY needs no escaping.
_PLAIN_TYPES = frozenset({"int8", "int16", "int32", "int64", "float", "double", "float32", "float64", "boolean"})
_PLAIN_LOGICAL = frozenset({
    "io.debezium.time.Date", "io.debezium.time.Time", "io.debezium.time.MicroTime", "io.debezium.time.NanoTime",
    "io.debezium.time.Timestamp", "io.debezium.time.MicroTimestamp", "io.debezium.time.NanoTimestamp",
    "io.debezium.time.Year", "io.debezium.data.Bits", "io.debezium.data.VariableScaleDecimal",
    "org.apache.kafka.connect.data.Decimal", "org.apache.kafka.connect.data.Date",
    "org.apache.kafka.connect.data.Time", "org.apache.kafka.connect.data.Timestamp",
})


def _needs_copy_escape(spec: FieldSpec) -> bool:
    if spec.logical is not None:
        return spec.logical not in _PLAIN_LOGICAL
    return spec.type not in _PLAIN_TYPES


def copy_line(image: str, columns: list[ColumnPlan], placeholder: str | None = None,
              only: Collection[str] | None = None, keys: ColumnKeys | None = None) -> Column:
    """One COPY text line from the `before` or `after` map, in the order of `columns` (read by `keys`, if given).

    Zero dates become NULL, and so do placeholders of unchanged TOASTed values when `placeholder` is given:
    those columns are left out of the write (see `unchanged_columns`). With `only` (destination names), the other
    columns are NULL (a deleted key's line).
    """
    values = []
    for index, column in enumerate(columns):
        if only is not None and column.dest_name not in only:
            values.append(F.lit(NULL_TEXT))
            continue
        raw = _raw(image, columns, index, keys)
        value = column.convert(raw, column.spec, column.input_type)
        for nulled in (zero_date(raw, column.spec), _is_placeholder(raw, column.spec, placeholder)):
            if nulled is not None:
                value = F.when(nulled, F.lit(None)).otherwise(value)
        values.append(F.coalesce(copy_escape(value) if _needs_copy_escape(column.spec) else value, F.lit(NULL_TEXT)))
    return F.concat_ws("\t", *values)


def compact_by_key(changes: DataFrame, key_columns: list[str], columns: Sequence[ColumnPlan] = (),
                   placeholder: str | None = None, *, name_of: Callable[[str], Column | str] | None = None,
                   within: Column | None = None) -> DataFrame:
    """Keeps each key's last change in source order: its net effect (an upsert of the last image, or a delete).

    A key is read from `after`, or from `before` for deletes; a primary-key change arrives from Debezium as a
    delete of the old key and a create of the new one, so each key's last event is still its final state.
    With `placeholder`, a column of `columns` the last change left unchanged (TOASTed) takes the last value an
    earlier change of the key in the batch wrote; with none, it stays the placeholder (the stored value stands).
    `name_of` gives the map key a source column is read by (its name, or a column holding it: a group's shared
    line); `within` sets rows apart whose keys are never compared (each row's step in a group's frame).
    """
    def key_of(name: str) -> Column | str:
        return name_of(name) if name_of is not None else name

    key_exprs = [
        F.when(F.col("op") == "d", F.col("before")[key_of(name)]).otherwise(F.col("after")[key_of(name)])
        .alias(f"_key_{i}") for i, name in enumerate(key_columns)
    ]
    keyed = changes.select("*", *key_exprs)
    partition = Window.partitionBy(*([within] if within is not None else []),
                                   *[f"_key_{i}" for i in range(len(key_columns))])
    toastable = [(column.source_name, flag) for column in columns
                 if (flag := _is_placeholder(F.col("after")[key_of(column.source_name)], column.spec,
                                             placeholder)) is not None]
    if toastable:
        so_far = partition.orderBy("seq").rowsBetween(Window.unboundedPreceding, Window.currentRow)
        for i, (name, flag) in enumerate(toastable):
            written = F.when(~flag & (F.col("op") != "d"), F.col("after")[key_of(name)])
            keyed = keyed.withColumn(f"_written_{i}", F.last(written, ignorenulls=True).over(so_far))

        def resolved(name_in_map: Column, value: Column) -> Column:
            result = value
            for i, (name, flag) in enumerate(toastable):
                result = F.when((name_in_map == key_of(name)) & flag, F.coalesce(F.col(f"_written_{i}"), value)
                                ).otherwise(result)
            return result

        keyed = keyed.withColumn("after", F.transform_values("after", resolved))
    order = partition.orderBy(F.col("seq").desc())
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


_COPY_CONTEXT = re.compile(r"COPY [^,]+, line (?P<line>\d+), column (?P<rest>.*)", re.S)
_NOT_NULL_VIOLATION = "23502"


@dataclass(frozen=True)
class RejectedValue:
    """A value PostgreSQL refused, as its error tells it: the column, the value (None for NULL) and the COPY line.

    PostgreSQL shows at most about 100 bytes of a value, ending a cut one with `...`: `truncated` says so.
    """

    column: ColumnPlan
    value: str | None
    truncated: bool = False
    line: int | None = None


def rejected_value(error: psycopg.Error, columns: Sequence[ColumnPlan]) -> RejectedValue | None:
    """The column and value an error of COPY (`COPY t, line 3, column x: "..."`) or of a NOT NULL constraint
    names; None when it names no column of `columns`."""
    by_name = {column.dest_name: column for column in columns}
    for context in (error.diag.context or "").splitlines():
        match = _COPY_CONTEXT.fullmatch(context.strip())
        if match is None:
            continue
        rest = match["rest"]
        name = next((name for name in sorted(by_name, key=len, reverse=True)
                     if rest == name or rest.startswith(f"{name}: ")), None)
        if name is None:
            continue
        detail = rest[len(name) + 2:]
        if not detail.startswith('"'):
            return RejectedValue(by_name[name], None, line=int(match["line"]))
        value = detail[1:-1] if detail.endswith('"') else detail[1:]
        truncated = value.endswith("...")
        return RejectedValue(by_name[name], value[:-3] if truncated else value, truncated, int(match["line"]))
    if error.diag.sqlstate == _NOT_NULL_VIOLATION and error.diag.column_name in by_name:
        return RejectedValue(by_name[error.diag.column_name], None)
    return None


def events_with_value(frame: DataFrame, rejected: RejectedValue, limit: int = 3) -> list[int]:
    """The seqs of the first events (in source order) whose COPY text of the rejected column is the rejected value.

    A delete is looked at in its `before` image (its key is loaded from there), any other change in `after`.
    """
    column = rejected.column
    wanted = F.lit(NULL_TEXT) if rejected.value is None else copy_escape(F.lit(rejected.value))

    def matches(image: str) -> Column:
        text = copy_line(image, [column])
        return text.startswith(wanted) if rejected.truncated else text == wanted

    rows = (frame.where(F.when(F.col("op") == "d", matches("before")).otherwise(matches("after")))
            .orderBy("seq").select("seq").limit(limit).collect())
    return [row.seq for row in rows]


def apply_error(error: psycopg.Error, frame: DataFrame, columns: Sequence[ColumnPlan], *, connector: str, table: str,
                target: str, seqs: tuple[int, int], position: object,
                refs: Mapping[int, EventRef]) -> ConversionError:
    """The error of a DML segment PostgreSQL refused, naming what it can: the column with its source and
    destination types, the value, and the first event carrying it with its source position.

    Without a column in PostgreSQL's error, the segment's events (`seqs`, first and last) and `position`
    (its last event's) say where; finding the event runs one Spark job, only on this failure path, and `refs`
    (the batch's events by seq) gives its position.
    """
    events_text = f"events {seqs[0]}..{seqs[1]} of the batch"
    rejected = rejected_value(error, columns)
    if rejected is None:
        return ConversionError(f"cannot apply changes to {target} ({events_text}): {error}", connector=connector,
                               table=table, position=position)
    column = rejected.column
    value = "NULL" if rejected.value is None else repr(rejected.value) + (" (cut short)" if rejected.truncated else "")
    events = [refs[seq] for seq in events_with_value(frame, rejected) if seq in refs]
    if events:
        first = events[0]
        where = f"event {first.seq} of the batch (op {first.op})" + (" and later ones" if len(events) > 1 else "")
        position = first.position
    else:
        where = events_text
    return ConversionError(
        f"cannot apply changes to {target}: column {column.dest_name!r} (source type {column.source_type}, "
        f"destination type {column.destination_type}) refused the value {value} of {where}: "
        f"{error.diag.message_primary or error}", connector=connector, table=table, position=position)
