"""Representations the scripted SQL Server and Oracle sources do not make (tests/integration/test_sqlserver_types.py
and test_oracle_types.py make every type of both maps with the connectors' own classes), through the function matrix.

Each case is a hand-written column of a change event: its Connect schema as Debezium describes it and its value's
JSON text as the runner's `EventSerializer` writes it (decimals of both kinds as plain decimal strings, bytes as
base64, structs as JSON objects, NaN and infinities as strings). They are the forms of other connector settings
(`time.precision.mode` adaptive: `Timestamp`, `NanoTimestamp`, `Time`, `NanoTime`; `interval.handling.mode=numeric`:
`MicroDuration`, `NanoDuration`), Debezium's struct form of `VariableScaleDecimal`, BINARY_FLOAT/BINARY_DOUBLE
subnormals, NaN and infinities, and Debezium's other logical types. The event goes through the pipeline's own parse and conversion in Spark; each COPY field is checked,
then the line is loaded into a real PostgreSQL table of the destination types and every value read back.
Expected values are written as Python values; the JSON inputs are encoded from them.
"""

from __future__ import annotations

import base64
import json
import math
import struct
import uuid
from dataclasses import dataclass
from datetime import datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, Iterator

import psycopg
import pytest
from psycopg import sql
from pyspark.sql import SparkSession

from cdc_pipeline.convert.dml import copy_line, parse_copy_line, plan_columns
from cdc_pipeline.decode.events import parse_events
from cdc_pipeline.capture.runner import FetchedBatch
from tests.helpers.spark import get_spark, index_entry

EPOCH = datetime(1970, 1, 1)
ONE_MICRO = timedelta(microseconds=1)


def micros(value: datetime | timedelta) -> int:
    return (value - EPOCH if isinstance(value, datetime) else value) // ONE_MICRO


def millis(value: datetime) -> int:
    return (value - EPOCH) // timedelta(milliseconds=1)


def since_midnight(value: time) -> timedelta:
    return timedelta(hours=value.hour, minutes=value.minute, seconds=value.second, microseconds=value.microsecond)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unscaled_struct(number: Decimal) -> str:
    """Debezium's VariableScaleDecimal struct: the scale and the unscaled value as big-endian two's complement."""
    sign, digits, exponent = number.as_tuple()
    unscaled = int("".join(map(str, digits))) * (-1 if sign else 1)
    size = max(1, (unscaled.bit_length() + 8) // 8)
    return compact_json({"scale": -exponent, "value": b64(unscaled.to_bytes(size, "big", signed=True))})


def compact_json(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


def float32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


def wkb_point(x: float, y: float) -> bytes:
    return struct.pack("<BIdd", 1, 1, x, y)


def ewkb_point(x: float, y: float, srid: int) -> bytes:
    """PostGIS's extended WKB: the SRID flag in the type word, then the SRID."""
    return struct.pack("<BIIdd", 1, 1 | 0x20000000, srid, x, y)


def connect(connect_type: str, logical: str | None = None, **parameters: str) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": connect_type, "optional": True}
    if logical:
        schema.update(name=logical, version=1)
    if parameters:
        schema["parameters"] = parameters
    return schema


VARIABLE_SCALE_DECIMAL = {
    "type": "struct", "optional": True, "name": "io.debezium.data.VariableScaleDecimal", "version": 1,
    "doc": "Variable scaled decimal",
    "fields": [{"type": "int32", "optional": False, "field": "scale"},
               {"type": "bytes", "optional": False, "field": "value"}],
}


def geometry(logical: str = "io.debezium.data.geometry.Geometry") -> dict[str, Any]:
    fields = [{"type": "bytes", "optional": False, "field": "wkb"},
              {"type": "int32", "optional": True, "field": "srid"}]
    if logical.endswith("Point"):
        fields = [{"type": "double", "optional": False, "field": "x"},
                  {"type": "double", "optional": False, "field": "y"}, *fields]
    return {"type": "struct", "optional": True, "name": logical, "version": 1, "fields": fields}


def decimal_schema(scale: int, precision: int) -> dict[str, Any]:
    return connect("bytes", "org.apache.kafka.connect.data.Decimal", scale=str(scale),
                   **{"connect.decimal.precision": str(precision)})


@dataclass(frozen=True)
class Case:
    """One column: schema and JSON text in, the COPY field and the value PostgreSQL gives back out."""

    id: str
    schema: dict[str, Any]
    json_text: str
    pg_type: str
    copy_text: str
    expected: Any
    read_as: str = "{}"  # the SQL that reads the column back, around its name


PLUS_0530 = timezone(timedelta(hours=5, minutes=30))

ORACLE_DATE = datetime(2024, 2, 29, 23, 59, 59)
ORACLE_TS9 = datetime(2262, 4, 11, 23, 47, 16, 854775)
DAY_TO_SECOND = timedelta(days=3, hours=4, minutes=5, seconds=6, microseconds=789012)
DATETIME2_7 = datetime(2038, 1, 19, 3, 14, 7, 999999)

CASES: list[Case] = [
    # Oracle: NUMBER without precision as Debezium's VariableScaleDecimal struct
    Case("oracle_number_struct", VARIABLE_SCALE_DECIMAL, unscaled_struct(Decimal("-123.4567890123")), "numeric",
         "-123.4567890123", Decimal("-123.4567890123")),
    Case("oracle_number_struct_small_fraction", VARIABLE_SCALE_DECIMAL, unscaled_struct(Decimal("-0.05")), "numeric",
         "-0.05", Decimal("-0.05")),
    Case("oracle_number_struct_negative_scale", VARIABLE_SCALE_DECIMAL, unscaled_struct(Decimal("42E+3")), "numeric",
         "42000", Decimal("42000")),
    Case("oracle_number_struct_minus_one", VARIABLE_SCALE_DECIMAL, unscaled_struct(Decimal("-1")), "numeric", "-1",
         Decimal("-1")),
    Case("oracle_number_struct_byte_boundary", VARIABLE_SCALE_DECIMAL, unscaled_struct(Decimal("-32768")), "numeric",
         "-32768", Decimal("-32768")),
    Case("oracle_number_struct_zero", VARIABLE_SCALE_DECIMAL, unscaled_struct(Decimal("0.00")), "numeric", "0.00",
         Decimal("0.00")),
    Case("oracle_number_struct_38_digits", VARIABLE_SCALE_DECIMAL, unscaled_struct(Decimal(-(10**38 - 1))),
         "numeric", str(-(10**38 - 1)), Decimal(-(10**38 - 1))),
    Case("oracle_number_struct_38_digits_positive", VARIABLE_SCALE_DECIMAL,
         unscaled_struct(Decimal(10**38 - 1).scaleb(-38)), "numeric", str(Decimal(10**38 - 1).scaleb(-38)),
         Decimal(10**38 - 1).scaleb(-38)),
    # Oracle DATE and TIMESTAMP(9) under time.precision.mode adaptive
    Case("oracle_date", connect("int64", "io.debezium.time.Timestamp"), str(millis(ORACLE_DATE)),
         "timestamp(0) without time zone", "2024-02-29 23:59:59.000000", ORACLE_DATE),
    Case("oracle_timestamp_9", connect("int64", "io.debezium.time.NanoTimestamp"), str(micros(ORACLE_TS9) * 1000 + 807),
         "timestamp(6) without time zone", "2262-04-11 23:47:16.854775", ORACLE_TS9),
    # Oracle INTERVAL under interval.handling.mode numeric (MicroDuration)
    Case("oracle_interval_day_to_second", connect("int64", "io.debezium.time.MicroDuration"),
         str(micros(DAY_TO_SECOND)), "interval", f"{micros(DAY_TO_SECOND)} microseconds", DAY_TO_SECOND),
    Case("oracle_interval_negative", connect("int64", "io.debezium.time.MicroDuration"),
         str(micros(-DAY_TO_SECOND)), "interval", f"{micros(-DAY_TO_SECOND)} microseconds", -DAY_TO_SECOND),
    Case("oracle_interval_nanos", connect("int64", "io.debezium.time.NanoDuration"),
         str(micros(DAY_TO_SECOND) * 1000 + 999), "interval", f"{micros(DAY_TO_SECOND)} microseconds", DAY_TO_SECOND),
    # Oracle BINARY_FLOAT/BINARY_DOUBLE (Java's Float/Double.toString, NaN and infinities as strings)
    Case("oracle_binary_float_min_subnormal", connect("float"), "1.4E-45", "real", "1.4E-45", float32(1.4e-45),
         "{}::float8"),
    Case("oracle_binary_float_nan", connect("float"), '"NaN"', "real", "NaN", "NaN", "{}::text"),
    Case("oracle_binary_double_min_subnormal", connect("double"), "4.9E-324", "double precision", "4.9E-324",
         5e-324),
    Case("oracle_binary_double_negative_infinity", connect("double"), '"-Infinity"', "double precision", "-Infinity",
         -math.inf),
    # SQL Server under time.precision.mode adaptive
    Case("sqlserver_datetime2_7", connect("int64", "io.debezium.time.NanoTimestamp"),
         str(micros(DATETIME2_7) * 1000 + 900), "timestamp(6) without time zone", "2038-01-19 03:14:07.999999",
         DATETIME2_7),
    Case("sqlserver_time_7", connect("int64", "io.debezium.time.NanoTime"),
         str(micros(since_midnight(time(23, 59, 59, 999999))) * 1000 + 900), "time(6) without time zone",
         "23:59:59.999999", time(23, 59, 59, 999999)),
    Case("sqlserver_time_3", connect("int32", "io.debezium.time.Time"),
         str(micros(since_midnight(time(0, 0, 0, 1000))) // 1000), "time(3) without time zone", "00:00:00.001000",
         time(0, 0, 0, 1000)),
    # Debezium's other logical types and plain Connect types
    Case("zoned_time", connect("string", "io.debezium.time.ZonedTime"), json.dumps("12:34:56.7890123+05:30"),
         "time(6) with time zone", "12:34:56.789012+05:30", time(12, 34, 56, 789012, PLUS_0530)),
    Case("year", connect("int32", "io.debezium.time.Year"), "2155", "integer", "2155", 2155),
    Case("uuid", connect("string", "io.debezium.data.Uuid"), json.dumps("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
         "uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
    Case("enum_set_text", connect("string", "io.debezium.data.EnumSet", allowed="a,b,c"), json.dumps("a,c"), "text",
         "a,c", "a,c"),
    Case("enum_set_array", connect("string", "io.debezium.data.EnumSet", allowed='a,b\\c,d"e'),
         json.dumps('a,b\\c,d"e'), "text[]", '{"a","b\\\\\\\\c","d\\\\"e"}', ["a", "b\\c", 'd"e']),
    Case("enum_set_array_empty", connect("string", "io.debezium.data.EnumSet", allowed="a"), json.dumps(""), "text[]",
         "{}", []),
    Case("geometry_bytea_with_srid_is_ewkb", geometry(),
         compact_json({"wkb": b64(wkb_point(1.5, -2.25)), "srid": 4326}), "bytea",
         "\\\\x" + ewkb_point(1.5, -2.25, 4326).hex(), ewkb_point(1.5, -2.25, 4326)),
    Case("geometry_bytea_without_srid_is_wkb", geometry(), compact_json({"wkb": b64(wkb_point(-1, 0.5)), "srid": None}),
         "bytea", "\\\\x" + wkb_point(-1, 0.5).hex(), wkb_point(-1, 0.5)),
    Case("geometry_text_with_srid", geometry(), compact_json({"wkb": b64(wkb_point(1, 2)), "srid": 4326}), "text",
         "SRID=4326;" + wkb_point(1, 2).hex().upper(), "SRID=4326;" + wkb_point(1, 2).hex().upper()),
    Case("geometry_text_without_srid", geometry(), compact_json({"wkb": b64(wkb_point(1, 2)), "srid": None}), "text",
         wkb_point(1, 2).hex().upper(), wkb_point(1, 2).hex().upper()),
    Case("point_to_point", geometry("io.debezium.data.geometry.Point"),
         json.dumps({"x": 1.5, "y": -2.25, "wkb": b64(wkb_point(1.5, -2.25)), "srid": None}), "point",
         "(1.5,-2.25)", [1.5, -2.25], "ARRAY[{0}[0], {0}[1]]"),
    Case("int8_min", connect("int8"), "-128", "smallint", "-128", -128),
    Case("int16_min", connect("int16"), "-32768", "smallint", "-32768", -32768),
    Case("int32_min", connect("int32"), "-2147483648", "integer", "-2147483648", -2147483648),
    Case("int64_max", connect("int64"), "9223372036854775807", "bigint", "9223372036854775807", 2**63 - 1),
    Case("float32", connect("float32"), "0.1", "real", "0.1", float32(0.1), "{}::float8"),
    Case("float64", connect("float64"), "-0.1", "double precision", "-0.1", -0.1),
    Case("boolean_into_numeric", connect("boolean"), "true", "numeric", "1", Decimal(1)),
]


def value_schema(cases: list[Case]) -> dict[str, Any]:
    columns = [{**case.schema, "field": case.id} for case in cases]
    image = {"type": "struct", "optional": True, "name": "srv.dbo.t.Value", "fields": columns}
    return {
        "type": "struct", "optional": False, "name": "srv.dbo.t.Envelope",
        "fields": [{**image, "field": "before"}, {**image, "field": "after"},
                   {"type": "struct", "optional": False, "field": "source", "fields": []},
                   {"type": "string", "optional": False, "field": "op"}],
    }


def event_line(seq: int, after: dict[str, str]) -> str:
    """One line as the runner writes it; `after` maps column names to their values' JSON text, verbatim."""
    image = "{" + ",".join(f"{json.dumps(name)}:{text}" for name, text in after.items()) + "}"
    return (f'{{"seq":{seq},"topic":"srv.dbo.t","schema":"s1","key":null,"value":{{"before":null,"after":{image},'
            f'"source":{{"db":"shop","schema":"dbo","table":"t","scn":"{seq}"}},"op":"r","ts_ms":1}},'
            f'"partition":{{"server":"srv"}},"offset":{{"scn":"{seq}"}}}}')


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return get_spark()


def convert(spark: SparkSession, cases: list[Case], images: list[dict[str, str]]) -> list[str]:
    """The COPY lines of one event per image, through the pipeline's parse, column plan and conversion."""
    lines = [event_line(seq, image) for seq, image in enumerate(images, start=1)]
    batch = FetchedBatch(batch_id=1, size=len(lines), java_batch=None, schemas={"s1": value_schema(cases)},
                         last_offset=None, last_partition=None, index=[index_entry(line) for line in lines])
    parsed = parse_events(spark.createDataFrame([(line,) for line in lines], "line string"), batch)
    columns = plan_columns(parsed.fields("s1"), {case.id: case.pg_type for case in cases}, str,
                           connector="hand-written", table="dbo.t")
    rows = parsed.events.orderBy("seq").select(copy_line("after", columns).alias("line")).collect()
    return [row.line for row in rows]


@pytest.fixture(scope="module")
def copy_lines(spark: SparkSession) -> list[str]:
    """Two events: every case's value, then every column NULL."""
    return convert(spark, CASES, [{case.id: case.json_text for case in CASES}, {case.id: "null" for case in CASES}])


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_copy_text_of_each_representation(copy_lines: list[str], case: Case) -> None:
    fields = copy_lines[0].split("\t")
    assert len(fields) == len(CASES)
    assert fields[CASES.index(case)] == case.copy_text


def test_every_column_null_gives_copy_nulls(copy_lines: list[str]) -> None:
    assert parse_copy_line(copy_lines[1]) == [None] * len(CASES)


@pytest.fixture(scope="module")
def loaded(copy_lines: list[str], destination_pg) -> Iterator[list[tuple]]:
    """The COPY lines loaded into a table of the cases' destination types, read back (one row per line)."""
    database = "dml_sqlserver_oracle"
    destination_pg.create_database(database)
    table = sql.Identifier("converted")
    with psycopg.connect(destination_pg.dsn(database), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
        conn.execute(sql.SQL("CREATE TABLE {} (ord serial, {})").format(table, sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(case.id), sql.SQL(case.pg_type)) for case in CASES)))
        with conn.cursor() as cur:
            with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(
                    table, sql.SQL(", ").join(sql.Identifier(case.id) for case in CASES))) as copy:
                copy.write("".join(line + "\n" for line in copy_lines))
            cur.execute(sql.SQL("SELECT {} FROM {} ORDER BY ord").format(sql.SQL(", ").join(
                sql.SQL("CASE WHEN {0} IS NOT NULL THEN {1} END").format(
                    sql.Identifier(case.id), sql.SQL(case.read_as).format(sql.Identifier(case.id)))
                for case in CASES), table))
            yield cur.fetchall()


@pytest.mark.integration
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_postgresql_reads_back_the_exact_value(loaded: list[tuple], case: Case) -> None:
    value, null = loaded[0][CASES.index(case)], loaded[1][CASES.index(case)]
    assert null is None
    assert value == case.expected
    assert type(value) is type(case.expected)


def test_a_variable_scale_struct_beyond_38_digits_fails_rather_than_losing_digits(spark: SparkSession) -> None:
    case = Case("n", VARIABLE_SCALE_DECIMAL, unscaled_struct(Decimal(10**38)), "numeric", "", None)
    with pytest.raises(Exception, match="NUMERIC_VALUE_OUT_OF_RANGE|overflow"):
        convert(spark, [case], [{case.id: case.json_text}])
