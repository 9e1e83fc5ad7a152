"""Unit tests for cdc_pipeline.convert.dml: the function matrix, COPY text lines, and compaction per key, in local Spark."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from cdc_pipeline.convert.dml import (
    may_leave_values_out,
    ColumnPlan,
    compact_by_key,
    converter_for,
    copy_line,
    parse_copy_line,
    plan_columns,
    unchanged_columns,
    zero_dates,
)
from cdc_pipeline.errors import ConversionError
from cdc_pipeline.decode.events import FieldSpec
from cdc_pipeline.convert.schema_infer import SOURCE_SCALE_PARAMETER as SOURCE_SCALE
from cdc_pipeline.convert.schema_infer import SOURCE_TYPE_PARAMETER as SOURCE_TYPE
from tests.helpers.spark import fixture_records, get_spark, parse_records

_STRING_MAP = T.MapType(T.StringType(), T.StringType())
PLACEHOLDER = "__debezium_unavailable_value"


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return get_spark()


def spec(connect_type: str, logical: str | None = None, name: str = "v", **parameters: str) -> FieldSpec:
    return FieldSpec(name=name, type=connect_type, logical=logical, parameters=parameters, optional=True)


def column_plan(field_spec: FieldSpec, pg_type: str, source_name: str | None = None) -> ColumnPlan:
    convert = converter_for(field_spec)
    assert convert is not None, f"no converter for {field_spec}"
    name = source_name or field_spec.name
    return ColumnPlan(name, name, pg_type, field_spec, convert)


# (case id, column spec, destination type, raw JSON text of the value, expected text in the COPY line)
CASES: list[tuple[str, FieldSpec, str, str | None, str]] = [
    ("int32", spec("int32"), "integer", "42", "42"),
    ("int64_min", spec("int64"), "bigint", "-9223372036854775808", "-9223372036854775808"),
    ("double", spec("double"), "double precision", "3.14", "3.14"),
    ("boolean", spec("boolean"), "boolean", "true", "true"),
    ("string_tricky", spec("string"), "text", "a\tb\nc\\d\re 😀", "a\\tb\\nc\\\\d\\re 😀"),
    ("string_null", spec("string"), "text", None, "\\N"),
    ("string_empty", spec("string"), "text", "", ""),
    ("string_backslash_n", spec("string"), "text", "\\N", "\\\\N"),
    ("enum", spec("string", "io.debezium.data.Enum", allowed="a,b"), "text", "b", "b"),
    ("json_backslash", spec("string", "io.debezium.data.Json"), "jsonb", '{"k":"a\\"b"}', '{"k":"a\\\\"b"}'),
    ("bytes", spec("bytes"), "bytea", "AP8A", "\\\\x00ff00"),
    ("bytes_empty", spec("bytes"), "bytea", "", "\\\\x"),
    ("bits_8", spec("bytes", "io.debezium.data.Bits", length="8"), "bit(8)", "pQ==", "10100101"),
    ("bits_16_little_endian", spec("bytes", "io.debezium.data.Bits", length="16"), "bit(16)", "AQI=",
     "0000001000000001"),
    ("bits_3", spec("bytes", "io.debezium.data.Bits", length="3"), "bit(3)", "BQ==", "101"),
    ("date", spec("int32", "io.debezium.time.Date"), "date", "19724", "2024-01-02"),
    ("date_connect", spec("int32", "org.apache.kafka.connect.data.Date"), "date", "19724", "2024-01-02"),
    ("date_day_before_epoch", spec("int32", "io.debezium.time.Date"), "date", "-1", "1969-12-31"),
    ("date_year_1000", spec("int32", "io.debezium.time.Date"), "date", "-354285", "1000-01-01"),
    ("timestamp_ms", spec("int64", "io.debezium.time.Timestamp"), "timestamp(3) without time zone",
     "1704164645678", "2024-01-02 03:04:05.678000"),
    ("timestamp_ms_before_epoch", spec("int64", "io.debezium.time.Timestamp"), "timestamp(3) without time zone",
     "-1", "1969-12-31 23:59:59.999000"),
    ("timestamp_micros", spec("int64", "io.debezium.time.MicroTimestamp"), "timestamp(6) without time zone",
     "1704164645678901", "2024-01-02 03:04:05.678901"),
    ("timestamp_nanos", spec("int64", "io.debezium.time.NanoTimestamp"), "timestamp(6) without time zone",
     "1704164645678901234", "2024-01-02 03:04:05.678901"),
    ("timestamp_nanos_before_epoch", spec("int64", "io.debezium.time.NanoTimestamp"),
     "timestamp(6) without time zone", "-1", "1969-12-31 23:59:59.999999"),
    ("zoned_timestamp", spec("string", "io.debezium.time.ZonedTimestamp"), "timestamp(6) with time zone",
     "2024-01-02T03:04:05.678901Z", "2024-01-02T03:04:05.678901Z"),
    ("micro_time", spec("int64", "io.debezium.time.MicroTime"), "time(6) without time zone",
     "45296789012", "12:34:56.789012"),
    ("micro_time_midnight", spec("int64", "io.debezium.time.MicroTime"), "time(6) without time zone", "0",
     "00:00:00.000000"),
    ("millis_time", spec("int32", "io.debezium.time.Time"), "time(3) without time zone", "45296789",
     "12:34:56.789000"),
    ("nano_time", spec("int64", "io.debezium.time.NanoTime"), "time(6) without time zone", "45296789012345",
     "12:34:56.789012"),
    ("micro_time_interval_min", spec("int64", "io.debezium.time.MicroTime"), "interval", "-3020399000000",
     "-3020399000000 microseconds"),
    ("micro_time_interval_max", spec("int64", "io.debezium.time.MicroTime"), "interval", "3020399000000",
     "3020399000000 microseconds"),
    ("micro_time_interval_over_a_day", spec("int64", "io.debezium.time.MicroTime"), "interval", "90000000001",
     "90000000001 microseconds"),
    ("decimal_30_fraction_digits", spec("string", "org.apache.kafka.connect.data.Decimal", scale="30"),
     "numeric(65,30)", "12345.123456789012345678901234567890", "12345.123456789012345678901234567890"),
    ("decimal_negative_tiny", spec("bytes", "org.apache.kafka.connect.data.Decimal", scale="30"),
     "numeric(65,30)", "-0.000000000000000000000000000001", "-0.000000000000000000000000000001"),
    ("bits_all_zero_sent_as_no_bytes", spec("bytes", "io.debezium.data.Bits", length="5"), "bit(5)", "", "00000"),
    ("date_year_one", spec("int32", "io.debezium.time.Date"), "date", "-719162", "0001-01-01"),
    ("date_1_bc", spec("int32", "io.debezium.time.Date"), "date", "-719163", "0001-12-31 BC"),
    ("date_julian_day_zero", spec("int32", "io.debezium.time.Date"), "date", "-2440588", "4714-11-24 BC"),
    ("timestamp_micros_1_bc", spec("int64", "io.debezium.time.MicroTimestamp"), "timestamp(6) without time zone",
     "-62135596800000001", "0001-12-31 23:59:59.999999 BC"),
    ("timestamp_micros_infinity", spec("int64", "io.debezium.time.MicroTimestamp"), "timestamp(6) without time zone",
     "9223372036825200000", "infinity"),
    ("timestamp_millis_minus_infinity", spec("int64", "io.debezium.time.Timestamp"), "timestamp(3) without time zone",
     "-9223372036832400000", "-infinity"),
    ("int_array", spec("array", **{SOURCE_TYPE: "_INT4"}), "integer[]", "[1,null,-3]", '{"1",NULL,"-3"}'),
    ("text_array_quotes_backslashes_nulls", spec("array", **{SOURCE_TYPE: "_TEXT"}), "text[]",
     '["a b","c\\"d",null,"NULL","","\\\\",",{}"]', '{"a b","c\\\\"d",NULL,"NULL","","\\\\\\\\",",{}"}'),
    ("timestamp3_array_in_millis", spec("array", **{SOURCE_TYPE: "_TIMESTAMP", SOURCE_SCALE: "3"}),
     "timestamp(3) without time zone[]", "[1577840523456,null]", '{"2020-01-01 01:02:03.456000",NULL}'),
    ("timestamp_array_in_micros", spec("array", **{SOURCE_TYPE: "_TIMESTAMP", SOURCE_SCALE: "6"}),
     "timestamp(6) without time zone[]", "[1577840523456789]", '{"2020-01-01 01:02:03.456789"}'),
    ("date_array", spec("array", **{SOURCE_TYPE: "_DATE"}), "date[]", "[18262,null]", '{"2020-01-01",NULL}'),
    ("bytea_array", spec("array", **{SOURCE_TYPE: "_BYTEA"}), "bytea[]", '["AP8=",null]',
     '{"\\\\\\\\x00ff",NULL}'),
    ("empty_array", spec("array", **{SOURCE_TYPE: "_INT4"}), "integer[]", "[]", "{}"),
    ("array_into_jsonb", spec("array", **{SOURCE_TYPE: "_INT4"}), "jsonb", "[1,2]", "[1,2]"),
    ("geometry_ewkb_little_endian", spec("struct", "io.debezium.data.geometry.Geometry"), "bytea",
     '{"wkb":"AQEAAAAAAAAAAADwPwAAAAAAAABA","srid":4326}',
     "\\\\x0101000020e6100000000000000000f03f0000000000000040"),
    ("geometry_ewkb_big_endian", spec("struct", "io.debezium.data.geometry.Geometry"), "bytea",
     '{"wkb":"AAAAAAE/8AAAAAAAAEAAAAAAAAAA","srid":2154}',
     "\\\\x00200000010000086a3ff00000000000004000000000000000"),
    ("geometry_without_srid_is_plain_wkb", spec("struct", "io.debezium.data.geometry.Point"), "bytea",
     '{"x":1.0,"y":2.0,"wkb":"AQEAAAAAAAAAAADwPwAAAAAAAABA","srid":null}',
     "\\\\x0101000000000000000000f03f0000000000000040"),
    ("mariadb_zero_timestamp_is_null", spec("string", "io.debezium.time.ZonedTimestamp", **{SOURCE_TYPE: "TIMESTAMP"}),
     "timestamp(0) with time zone", "1970-01-01T00:00:00Z", "\\N"),
    ("mariadb_zero_timestamp6_is_null", spec("string", "io.debezium.time.ZonedTimestamp", **{SOURCE_TYPE: "TIMESTAMP"}),
     "timestamp(6) with time zone", "1970-01-01T00:00:00.000000Z", "\\N"),
    ("mariadb_first_timestamp_second", spec("string", "io.debezium.time.ZonedTimestamp", **{SOURCE_TYPE: "TIMESTAMP"}),
     "timestamp(0) with time zone", "1970-01-01T00:00:01Z", "1970-01-01T00:00:01Z"),
    ("postgres_epoch_timestamptz_kept", spec("string", "io.debezium.time.ZonedTimestamp", **{SOURCE_TYPE: "TIMESTAMPTZ"}),
     "timestamp(6) with time zone", "1970-01-01T00:00:00Z", "1970-01-01T00:00:00Z"),
    ("interval_iso", spec("string", "io.debezium.time.Interval"), "interval", "P-178000000Y0M-3DT0H0M-0.000001S",
     "P-178000000Y0M-3DT0H0M-0.000001S"),
]


@pytest.fixture(scope="module")
def converted(spark: SparkSession) -> dict[str, str]:
    """Every case converted in one Spark job: one row whose `after` map holds each case under its id."""
    after = {case_id: raw for case_id, _, _, raw, _ in CASES}
    frame = spark.createDataFrame([(after,)], T.StructType([T.StructField("after", _STRING_MAP)]))
    plans = {case_id: column_plan(field_spec, pg_type, case_id) for case_id, field_spec, pg_type, _, _ in CASES}
    row = frame.select(*[copy_line("after", [plan]).alias(case_id) for case_id, plan in plans.items()]).first()
    return row.asDict()


@pytest.mark.parametrize(("case_id", "expected"), [(case[0], case[4]) for case in CASES], ids=[c[0] for c in CASES])
def test_converter_gives_postgres_text_input(converted: dict[str, str], case_id: str, expected: str) -> None:
    assert converted[case_id] == expected


def test_converter_prefers_logical_name_over_connect_type() -> None:
    assert converter_for(spec("int32", "io.debezium.time.Date")) is not converter_for(spec("int32"))
    assert converter_for(spec("int64", "io.debezium.unknown.Thing")) is None


def test_copy_line_joins_columns_in_plan_order_from_the_chosen_image(spark: SparkSession) -> None:
    columns = [column_plan(spec("int32", name="id"), "integer"), column_plan(spec("string", name="note"), "text"),
               column_plan(spec("bytes", name="blob"), "bytea")]
    frame = spark.createDataFrame(
        [({"id": "7", "note": "old"}, {"id": "7", "note": None, "blob": "AP8="})],
        T.StructType([T.StructField("before", _STRING_MAP), T.StructField("after", _STRING_MAP)]),
    )
    row = frame.select(copy_line("before", columns).alias("before"), copy_line("after", columns).alias("after")).first()
    assert row.before == "7\told\t\\N"
    assert row.after == "7\t\\N\t\\\\x00ff"


def test_copy_line_of_a_parsed_snapshot_row(spark: SparkSession) -> None:
    parsed = parse_records(fixture_records("mariadb_snapshot_r.json"))
    dest_types = {"id": "integer", "name": "character varying(255)", "price": "numeric(10,2)",
                  "created_at": "timestamp(3) without time zone", "release_date": "date", "attrs": "jsonb",
                  "image": "text", "status": "text", "flags": "bit(8)", "weight": "double precision"}
    fields = parsed.fields(parsed.refs[0].schema_id)
    columns = plan_columns(fields, dest_types, str, connector="mdb", table="inventory.products")
    line = parsed.events.select(copy_line("after", columns).alias("line")).first().line
    assert parse_copy_line(line) == [
        "1", "scooter", "19.99", "2024-01-02 03:04:05.678000", "2024-01-01", '{"color":"red","sizes":[1,2]}',
        "3q2+7w==", "active", "10100101", "3.14",
    ]


def test_plan_columns_rejects_a_column_without_destination() -> None:
    with pytest.raises(ConversionError, match="'note'"):
        plan_columns([spec("string", name="note")], {"id": "integer"}, str, connector="mdb", table="inventory.t")


TRICKY_STRINGS = [
    "", "\\N", "\\", "trailing\\", "\\\\", "tab\there", "new\nline", "cr\rlf\r\n", "\\t is not a tab",
    "emoji 😀 and 𝄞", "mixed\t\\n\n\\\r", "NULL", "N",
]


def test_parse_copy_line_inverts_copy_escape(spark: SparkSession) -> None:
    values: list[str | None] = [*TRICKY_STRINGS, None]
    after = {f"c{i}": value for i, value in enumerate(values)}
    columns = [column_plan(spec("string", name=f"c{i}"), "text") for i in range(len(values))]
    frame = spark.createDataFrame([(after,)], T.StructType([T.StructField("after", _STRING_MAP)]))
    line = frame.select(copy_line("after", columns).alias("line")).first().line
    assert "\n" not in line and "\r" not in line
    assert line.count("\t") == len(values) - 1
    assert parse_copy_line(line) == values


def test_parse_copy_line_reads_null_and_empty_fields() -> None:
    assert parse_copy_line("a\t\\N\t\t\\\\N") == ["a", None, "", "\\N"]


def changes_frame(spark: SparkSession, events: list[tuple[int, str, dict[str, Any] | None, dict[str, Any] | None]]
                  ) -> DataFrame:
    schema = T.StructType([
        T.StructField("seq", T.LongType()), T.StructField("op", T.StringType()),
        T.StructField("before", _STRING_MAP), T.StructField("after", _STRING_MAP),
    ])
    return spark.createDataFrame(events, schema)


def net_changes(frame: DataFrame, key: list[str]) -> dict[tuple[str, ...], tuple[int, str, dict | None]]:
    rows = compact_by_key(frame, key).collect()
    result = {}
    for row in rows:
        image = row.before if row.op == "d" else row.after
        result[tuple(image[name] for name in key)] = (row.seq, row.op, row.after)
    assert len(result) == len(rows)
    return result


def test_compact_by_key_keeps_each_keys_last_change(spark: SparkSession) -> None:
    frame = changes_frame(spark, [
        (12, "u", {"id": "1", "v": "a"}, {"id": "1", "v": "b"}),
        (10, "c", None, {"id": "1", "v": "a"}),
        (20, "u", {"id": "2", "v": "x"}, {"id": "2", "v": "y"}),
        (21, "d", {"id": "2", "v": "y"}, None),
        (30, "d", {"id": "3", "v": "old"}, None),
        (31, "c", None, {"id": "3", "v": "new"}),
        (40, "r", None, {"id": "4", "v": "only"}),
    ])
    assert net_changes(frame, ["id"]) == {
        ("1",): (12, "u", {"id": "1", "v": "b"}),
        ("2",): (21, "d", None),
        ("3",): (31, "c", {"id": "3", "v": "new"}),
        ("4",): (40, "r", {"id": "4", "v": "only"}),
    }


def test_compact_by_key_keeps_keys_independent(spark: SparkSession) -> None:
    frame = changes_frame(spark, [
        (1, "c", None, {"id": "1", "v": "a"}),
        (2, "c", None, {"id": "2", "v": "b"}),
        (3, "d", {"id": "1", "v": "a"}, None),
        (4, "u", {"id": "2", "v": "b"}, {"id": "2", "v": "c"}),
    ])
    assert net_changes(frame, ["id"]) == {("1",): (3, "d", None), ("2",): (4, "u", {"id": "2", "v": "c"})}


def test_compact_by_key_with_composite_key(spark: SparkSession) -> None:
    frame = changes_frame(spark, [
        (1, "c", None, {"a": "1", "b": "x", "v": "first"}),
        (2, "c", None, {"a": "1", "b": "y", "v": "other"}),
        (3, "c", None, {"a": "2", "b": "x", "v": "third"}),
        (4, "u", {"a": "1", "b": "x", "v": "first"}, {"a": "1", "b": "x", "v": "changed"}),
        (5, "d", {"a": "2", "b": "x", "v": "third"}, None),
    ])
    assert net_changes(frame, ["a", "b"]) == {
        ("1", "x"): (4, "u", {"a": "1", "b": "x", "v": "changed"}),
        ("1", "y"): (2, "c", {"a": "1", "b": "y", "v": "other"}),
        ("2", "x"): (5, "d", None),
    }


def test_compact_by_key_follows_a_primary_key_change(spark: SparkSession) -> None:
    frame = changes_frame(spark, [
        (1, "c", None, {"id": "1", "v": "a"}),
        (2, "d", {"id": "1", "v": "a"}, None),
        (3, "c", None, {"id": "5", "v": "a"}),
    ])
    assert net_changes(frame, ["id"]) == {("1",): (2, "d", None), ("5",): (3, "c", {"id": "5", "v": "a"})}


def test_zero_dates_counts_mariadb_zero_timestamps_of_an_image(spark: SparkSession) -> None:
    zoned = "io.debezium.time.ZonedTimestamp"
    columns = [column_plan(spec("string", zoned, name="a", **{SOURCE_TYPE: "TIMESTAMP"}), "timestamp(0) with time zone"),
               column_plan(spec("string", zoned, name="b", **{SOURCE_TYPE: "TIMESTAMP"}), "timestamp(6) with time zone"),
               column_plan(spec("string", zoned, name="c", **{SOURCE_TYPE: "TIMESTAMPTZ"}), "timestamp with time zone")]
    frame = spark.createDataFrame(
        [({"a": "1970-01-01T00:00:00Z", "b": "1970-01-01T00:00:00.000000Z", "c": "1970-01-01T00:00:00Z"},),
         ({"a": "2024-01-01T00:00:00Z", "b": None, "c": None},), (None,)],
        T.StructType([T.StructField("after", _STRING_MAP)]))
    counts = [row.n for row in frame.select(zero_dates("after", columns).alias("n")).collect()]
    assert counts == [2, 0, 0]
    assert frame.select(zero_dates("after", columns[2:]).alias("n")).first().n == 0


TOASTABLE = [
    column_plan(spec("int32", name="id"), "integer"),
    column_plan(spec("string", name="big"), "text"),
    column_plan(spec("bytes", name="blob"), "bytea"),
    column_plan(spec("array", name="tags", **{SOURCE_TYPE: "_TEXT"}), "text[]"),
    column_plan(spec("array", name="numbers", **{SOURCE_TYPE: "_INT4"}), "integer[]"),
    column_plan(spec("string", "io.debezium.data.Json", name="doc"), "jsonb"),
]
OCTETS = "[" + ",".join(str(octet) for octet in PLACEHOLDER.encode()) + "]"
UNCHANGED_IMAGE = {"id": "1", "big": PLACEHOLDER, "blob": "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==",
                   "tags": f'["{PLACEHOLDER}"]', "numbers": OCTETS, "doc": PLACEHOLDER}


def test_unchanged_toasted_values_are_named_and_written_as_null(spark: SparkSession) -> None:
    changed = {"id": "2", "big": "x", "blob": "AA==", "tags": '["a"]', "numbers": "[1]", "doc": "{}"}
    frame = spark.createDataFrame([(UNCHANGED_IMAGE,), (changed,)], T.StructType([T.StructField("after", _STRING_MAP)]))
    rows = frame.select(unchanged_columns("after", TOASTABLE, PLACEHOLDER).alias("unchanged"),
                        copy_line("after", TOASTABLE, PLACEHOLDER).alias("line"),
                        unchanged_columns("after", TOASTABLE, None).alias("without")).collect()
    assert rows[0].unchanged == ["big", "blob", "tags", "numbers", "doc"]
    assert parse_copy_line(rows[0].line) == ["1", None, None, None, None, None]
    assert rows[1].unchanged == []
    assert parse_copy_line(rows[1].line) == ["2", "x", "\\x00", '{"a"}', '{"1"}', "{}"]
    assert rows[0].without == []


def test_compaction_resolves_an_unchanged_toasted_value_from_an_earlier_change_of_the_key(spark: SparkSession) -> None:
    frame = changes_frame(spark, [
        (1, "u", None, {"id": "1", "big": "first", "doc": PLACEHOLDER, "numbers": OCTETS}),
        (2, "u", None, {"id": "1", "big": PLACEHOLDER, "doc": PLACEHOLDER, "numbers": "[5]"}),
        (3, "u", None, {"id": "1", "big": PLACEHOLDER, "doc": PLACEHOLDER, "numbers": OCTETS}),
        (4, "u", None, {"id": "2", "big": PLACEHOLDER, "doc": PLACEHOLDER, "numbers": OCTETS}),
        (5, "c", None, {"id": "3", "big": "inserted", "doc": "{}", "numbers": "[]"}),
        (6, "d", {"id": "3"}, None),
        (7, "c", None, {"id": "3", "big": "again", "doc": None, "numbers": "[]"}),
        (8, "u", None, {"id": "3", "big": PLACEHOLDER, "doc": None, "numbers": "[]"}),
    ])
    columns = [TOASTABLE[0], TOASTABLE[1], TOASTABLE[4], TOASTABLE[5]]
    compacted = compact_by_key(frame, ["id"], columns, PLACEHOLDER)
    after = {row.after["id"]: row.after for row in compacted.collect()}
    assert after["1"] == {"id": "1", "big": "first", "doc": PLACEHOLDER, "numbers": "[5]"}
    assert after["2"] == {"id": "2", "big": PLACEHOLDER, "doc": PLACEHOLDER, "numbers": OCTETS}
    assert after["3"] == {"id": "3", "big": "again", "doc": None, "numbers": "[]"}
    untouched = {row.after["id"]: row.after for row in compact_by_key(frame, ["id"]).collect()}
    assert untouched["1"]["big"] == PLACEHOLDER


def test_only_columns_that_can_hold_the_placeholder_leave_values_out():
    """Spark compacts a keyed step only where an unchanged TOASTed value must come from an earlier change (the
    destination keeps each key's last change otherwise)."""
    numbers = [column_plan(spec("int32", name="id"), "integer"),
               column_plan(spec("double", name="x"), "double precision")]
    text = column_plan(spec("string", name="t"), "text")
    placeholder = "__debezium_unavailable_value"
    assert not may_leave_values_out(numbers, placeholder)
    assert may_leave_values_out([*numbers, text], placeholder)
    assert may_leave_values_out([column_plan(spec("bytes", name="b"), "bytea")], placeholder)
    assert not may_leave_values_out([*numbers, text], None)  # MariaDB/MySQL and SQL Server: no placeholder
