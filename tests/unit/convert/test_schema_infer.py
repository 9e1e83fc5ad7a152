"""Unit tests for cdc_pipeline.convert.schema_infer: destination tables from the value schemas of change events."""

from __future__ import annotations

import logging
from types import MappingProxyType

import pytest

from cdc_pipeline.config import ConnectorConfig, Secret
from cdc_pipeline.errors import ConversionError
from cdc_pipeline.decode.events import FieldSpec
from cdc_pipeline.convert.schema_infer import (
    KEY_POSITION_PARAMETER,
    column_def_from_field,
    key_fields_of,
    pg_type_from_connect,
    table_def_from_event_schema,
)


def connector(**overrides) -> ConnectorConfig:
    fields = dict(
        name="pg", type="postgres", hostname="localhost", port=5432, user="u", password=Secret("p"),
        database="shop", tables=(), snapshot_mode="initial", batch_size=100, apply_batch_events=20_000, error_strategy="exit",
        schedule="* * * * *", max_events_per_run=1000, max_seconds_per_run=60.0, idle_timeout_seconds=5.0,
        letter_casing="lowercase", destination_schema=None, debezium=MappingProxyType({}),
    )
    fields.update(overrides)
    return ConnectorConfig(**fields)


def propagated(name: str, connect_type: str, source_type: str, length: int | None = None, scale: int | None = None,
               *, logical: str | None = None, optional: bool = True,
               parameters: dict[str, str] | None = None) -> FieldSpec:
    """A row-image field as Debezium describes it with column.propagate.source.type."""
    params = {"__debezium.source.column.type": source_type, "__debezium.source.column.name": name,
              **(parameters or {})}
    if length is not None:
        params["__debezium.source.column.length"] = str(length)
    if scale is not None:
        params["__debezium.source.column.scale"] = str(scale)
    return FieldSpec(name=name, type=connect_type, logical=logical, parameters=params, optional=optional)


def plain(connect_type: str, logical: str | None = None, **parameters: str) -> FieldSpec:
    return FieldSpec(name="c", type=connect_type, logical=logical, parameters=parameters, optional=True)


def pg_type(spec: FieldSpec) -> str:
    return column_def_from_field(spec, connector_type="postgres", letter_casing="lowercase").pg_type


@pytest.mark.parametrize(("spec", "expected"), [
    (propagated("id", "int32", "INT4", 10, 0), "integer"),
    (propagated("n", "int64", "BIGSERIAL", 19, 0), "bigint"),
    (propagated("price", "bytes", "NUMERIC", 12, 2, logical="org.apache.kafka.connect.data.Decimal",
                parameters={"scale": "2", "connect.decimal.precision": "12"}), "numeric(12,2)"),
    (propagated("ratio", "struct", "NUMERIC", 131089, 0, logical="io.debezium.data.VariableScaleDecimal"), "numeric"),
    (propagated("ratio", "struct", "NUMERIC", 0, logical="io.debezium.data.VariableScaleDecimal"), "numeric"),
    (propagated("code", "string", "VARCHAR", 20, 0), "character varying(20)"),
    (propagated("flag", "string", "BPCHAR", 3, 0), "character(3)"),
    (propagated("body", "string", "TEXT", 2147483647, 0), "text"),
    (propagated("at", "string", "TIMESTAMPTZ", 35, 6, logical="io.debezium.time.ZonedTimestamp"),
     "timestamp(6) with time zone"),
    (propagated("seen", "int64", "TIMESTAMP", 29, 3, logical="io.debezium.time.MicroTimestamp"),
     "timestamp(3) without time zone"),
    (propagated("born", "int32", "DATE", 13, 0, logical="io.debezium.time.Date"), "date"),
    (propagated("active", "boolean", "BOOL", 1, 0), "boolean"),
    (propagated("doc", "string", "JSONB", 2147483647, 0, logical="io.debezium.data.Json"), "jsonb"),
    (propagated("payload", "bytes", "BYTEA", 2147483647, 0), "bytea"),
    (propagated("guid", "string", "UUID", 2147483647, 0, logical="io.debezium.data.Uuid"), "uuid"),
    (propagated("ids", "array", "_INT4", 10, 0), "integer[]"),
    (propagated("names", "array", "_VARCHAR", 20, 0), "character varying(20)[]"),
    (propagated("moods", "array", "_MOOD", 2147483647, 0), "text[]"),
    (propagated("span", "string", "INTERVAL", 49, 6, logical="io.debezium.time.Interval"), "interval"),
    (propagated("cost", "bytes", "MONEY", 2147483647, 0, logical="org.apache.kafka.connect.data.Decimal",
                parameters={"scale": "2"}), "numeric(19,2)"),
    (propagated("mood", "string", "MOOD", 2147483647, 0, logical="io.debezium.data.Enum",
                parameters={"allowed": "sad,ok"}), "text"),
    (propagated("addr", "string", "INET", 2147483647, 0), "inet"),
    (propagated("net", "string", "CIDR", 2147483647, 0), "cidr"),
    (propagated("at", "string", "TIMETZ", 21, 6, logical="io.debezium.time.ZonedTime"), "time(6) with time zone"),
])
def test_propagated_source_type_maps_through_the_postgres_type_map(spec, expected):
    assert pg_type(spec) == expected


@pytest.mark.parametrize(("spec", "expected"), [
    (plain("int8"), "smallint"),
    (plain("int16"), "smallint"),
    (plain("int32"), "integer"),
    (plain("int64"), "bigint"),
    (plain("float32"), "real"),
    (plain("float64"), "double precision"),
    (plain("boolean"), "boolean"),
    (plain("string"), "text"),
    (plain("bytes"), "bytea"),
    (plain("bytes", "org.apache.kafka.connect.data.Decimal", scale="4", **{"connect.decimal.precision": "20"}),
     "numeric(20,4)"),
    (plain("bytes", "org.apache.kafka.connect.data.Decimal", scale="4"), "numeric"),
    (plain("struct", "io.debezium.data.VariableScaleDecimal"), "numeric"),
    (plain("int32", "io.debezium.time.Date"), "date"),
    (plain("int64", "io.debezium.time.MicroTimestamp"), "timestamp(6) without time zone"),
    (plain("int64", "io.debezium.time.Timestamp"), "timestamp(3) without time zone"),
    (plain("string", "io.debezium.time.ZonedTimestamp"), "timestamp with time zone"),
    (plain("int64", "io.debezium.time.MicroTime"), "time(6) without time zone"),
    (plain("string", "io.debezium.data.Json"), "jsonb"),
    (plain("string", "io.debezium.data.Uuid"), "uuid"),
    (plain("bytes", "io.debezium.data.Bits", length="5"), "bit(5)"),
    (plain("array"), "text[]"),
    (plain("string", "io.debezium.time.Interval"), "interval"),
    (plain("int64", "io.debezium.time.MicroDuration"), "interval"),
    (plain("struct", "io.debezium.data.geometry.Geometry"), "bytea"),
])
def test_without_a_propagated_type_the_connect_type_decides(spec, expected):
    assert pg_type(spec) == expected


def test_unknown_source_type_falls_back_to_the_connect_type():
    spec = propagated("mood", "string", "MOOD_ENUM", 2147483647, 0)

    assert pg_type(spec) == "text"
    assert pg_type(propagated("attrs", "string", "HSTORE", logical="io.debezium.data.Json")) == "jsonb"


def test_unknown_connect_type_becomes_text_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="cdc_pipeline.convert.schema_infer"):
        assert pg_type_from_connect(plain("map")) == "text"

    assert "Unknown Connect type map" in caplog.text


def test_nullability_comes_from_optional_and_names_from_the_letter_casing():
    column = column_def_from_field(propagated("Name", "string", "TEXT", 2147483647, 0, optional=False),
                                   connector_type="postgres", letter_casing="lowercase")

    assert (column.name, column.source_name, column.nullable, column.identity) == ("name", "Name", False, False)


def test_key_fields_follow_the_positions_the_runner_marked():
    fields = [
        propagated("a", "int32", "INT4", 10, 0, parameters={KEY_POSITION_PARAMETER: "1"}),
        propagated("b", "string", "TEXT", 2147483647, 0),
        propagated("c", "int32", "INT4", 10, 0, parameters={KEY_POSITION_PARAMETER: "0"}),
    ]

    assert key_fields_of(fields) == ["c", "a"]
    assert key_fields_of(fields[1:2]) == []


def test_table_def_from_event_schema_names_columns_and_primary_key():
    fields = [
        propagated("ID", "int32", "INT4", 10, 0, optional=False),
        propagated("Price", "bytes", "NUMERIC", 12, 2, logical="org.apache.kafka.connect.data.Decimal"),
    ]

    table = table_def_from_event_schema(fields, ["ID"], connector=connector(), source_table="Sales.Orders")

    assert (table.schema, table.name, table.source_id) == ("sales", "orders", "Sales.Orders")
    assert [(column.name, column.pg_type, column.nullable) for column in table.columns] == [
        ("id", "integer", False), ("price", "numeric(12,2)", True)]
    assert table.primary_key == ("id",)
    assert table_def_from_event_schema(fields, [], connector=connector(destination_schema="replica"),
                                       source_table="Sales.Orders").schema == "replica"


def test_table_def_rejects_a_key_outside_the_columns_and_colliding_names():
    with pytest.raises(ConversionError, match="key columns not among the columns: missing"):
        table_def_from_event_schema([propagated("id", "int32", "INT4")], ["missing"], connector=connector(),
                                    source_table="public.t")
    with pytest.raises(ConversionError, match="collide"):
        table_def_from_event_schema([propagated("A", "int32", "INT4"), propagated("a", "int32", "INT4")], [],
                                    connector=connector(), source_table="public.t")
