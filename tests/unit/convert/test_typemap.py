"""Unit tests for cdc_pipeline.convert.typemap: source types to PostgreSQL types, defaults and letter casing."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from cdc_pipeline.errors import ConfigError, ConversionError
from cdc_pipeline.convert.typemap import (
    canonical_pg_type,
    column_def_from_source,
    dest_identifier,
    pg_type_for,
    type_map_rows,
)


def column(type_name: str, **fields: Any) -> dict[str, Any]:
    """A Debezium column description with the given typeName and overrides."""
    description = {
        "name": "c",
        "typeName": type_name,
        "typeExpression": type_name,
        "length": None,
        "scale": None,
        "position": 1,
        "optional": True,
        "autoIncremented": False,
        "defaultValueExpression": None,
        "enumValues": None,
    }
    description.update(fields)
    return description


def mariadb_type(type_name: str, **fields: Any) -> str:
    return pg_type_for(type_name, column(type_name, **fields), "mariadb")


@pytest.mark.parametrize(
    ("type_name", "expected"),
    [
        ("TINYINT", "smallint"),
        ("TINYINT UNSIGNED", "smallint"),
        ("SMALLINT", "smallint"),
        ("SMALLINT UNSIGNED", "integer"),
        ("MEDIUMINT", "integer"),
        ("MEDIUMINT UNSIGNED", "integer"),
        ("INT", "integer"),
        ("INTEGER", "integer"),
        ("INT UNSIGNED", "bigint"),
        ("INT UNSIGNED ZEROFILL", "bigint"),
        ("BIGINT", "bigint"),
        ("BIGINT UNSIGNED", "numeric(20,0)"),
        ("BOOL", "smallint"),
        ("BOOLEAN", "smallint"),
        ("FLOAT", "real"),
        ("DOUBLE", "double precision"),
        ("REAL", "double precision"),
        ("TINYTEXT", "text"),
        ("TEXT", "text"),
        ("MEDIUMTEXT", "text"),
        ("LONGTEXT", "text"),
        ("BINARY", "bytea"),
        ("VARBINARY", "bytea"),
        ("BLOB", "bytea"),
        ("LONGBLOB", "bytea"),
        ("DATE", "date"),
        ("TIME", "interval"),
        ("YEAR", "integer"),
        ("ENUM", "text"),
        ("SET", "text"),
        ("GEOMETRY", "bytea"),
        ("POINT", "bytea"),
        ("MULTIPOLYGON", "bytea"),
        ("int", "integer"),
    ],
)
def test_mariadb_simple_types(type_name: str, expected: str) -> None:
    assert mariadb_type(type_name) == expected


def test_unsigned_given_only_in_type_expression_widens() -> None:
    assert pg_type_for("INT", column("INT", typeExpression="INT UNSIGNED"), "mysql") == "bigint"
    assert pg_type_for("BIGINT", column("BIGINT", typeExpression="BIGINT UNSIGNED"), "mysql") == "numeric(20,0)"


def test_tinyint_1_stays_smallint() -> None:
    assert mariadb_type("TINYINT", length=1) == "smallint"


def test_decimal_takes_precision_and_scale() -> None:
    assert mariadb_type("DECIMAL", length=10, scale=2) == "numeric(10,2)"
    assert mariadb_type("NUMERIC", length=6) == "numeric(6,0)"
    assert mariadb_type("DECIMAL UNSIGNED", length=8, scale=3) == "numeric(8,3)"
    assert mariadb_type("DECIMAL") == "numeric"


def test_datetime_fractional_digits() -> None:
    assert mariadb_type("DATETIME", length=3) == "timestamp(3) without time zone"
    assert mariadb_type("DATETIME") == "timestamp(0) without time zone"
    assert mariadb_type("DATETIME", length=6) == "timestamp(6) without time zone"
    assert mariadb_type("TIMESTAMP", length=3) == "timestamp(3) with time zone"
    assert mariadb_type("TIMESTAMP") == "timestamp(0) with time zone"


def test_bit_one_is_boolean_and_wider_bits_keep_their_width() -> None:
    assert mariadb_type("BIT", length=1) == "boolean"
    assert mariadb_type("BIT") == "boolean"
    assert mariadb_type("BIT", length=8) == "bit(8)"


def test_character_types_keep_their_length() -> None:
    assert mariadb_type("CHAR", length=10) == "character(10)"
    assert mariadb_type("CHAR") == "character(1)"
    assert mariadb_type("VARCHAR", length=100) == "character varying(100)"
    assert mariadb_type("NVARCHAR", length=20) == "character varying(20)"


def test_json_is_jsonb_for_mysql_and_text_for_mariadb() -> None:
    assert pg_type_for("JSON", column("JSON"), "mysql") == "jsonb"
    assert pg_type_for("JSON", column("JSON"), "mariadb") == "text"


def test_unknown_type_becomes_text_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="cdc_pipeline.convert.typemap"):
        assert mariadb_type("VECTOR", length=3) == "text"
    assert "VECTOR" in caplog.text


def test_unknown_connector_type_is_a_conversion_error() -> None:
    with pytest.raises(ConversionError):
        pg_type_for("INT", column("INT"), "db2")


@pytest.mark.parametrize(
    ("type_name", "fields", "expected"),
    [
        ("int2", {}, "smallint"),
        ("int4", {}, "integer"),
        ("serial", {}, "integer"),
        ("int8", {}, "bigint"),
        ("numeric", {"length": 12, "scale": 4}, "numeric(12,4)"),
        ("numeric", {}, "numeric"),
        ("varchar", {"length": 50}, "character varying(50)"),
        ("varchar", {"length": 2147483647}, "character varying"),
        ("bpchar", {"length": 3}, "character(3)"),
        ("bool", {}, "boolean"),
        ("float4", {}, "real"),
        ("float8", {}, "double precision"),
        ("date", {}, "date"),
        ("time", {}, "time without time zone"),
        ("timetz", {"scale": 3}, "time(3) with time zone"),
        ("timestamp", {"scale": 6}, "timestamp(6) without time zone"),
        ("timestamptz", {}, "timestamp with time zone"),
        ("bytea", {}, "bytea"),
        ("json", {}, "json"),
        ("jsonb", {}, "jsonb"),
        ("uuid", {}, "uuid"),
        ("interval", {}, "interval"),
        ("text", {}, "text"),
        ("inet", {}, "inet"),
        ("cidr", {}, "cidr"),
        ("macaddr", {}, "macaddr"),
        ("money", {"length": 2147483647}, "numeric(19,2)"),
        ("bit", {"length": 5}, "bit(5)"),
        ("varbit", {"length": 8}, "bit varying(8)"),
        ("xml", {}, "xml"),
        ("point", {}, "point"),
        ("numrange", {}, "numrange"),
        ("tstzrange", {}, "tstzrange"),
        ("_INT4", {"length": 10}, "integer[]"),
        ("_TEXT", {}, "text[]"),
        ("_VARCHAR", {"length": 20}, "character varying(20)[]"),
        ("_TIMESTAMP", {"scale": 3}, "timestamp(3) without time zone[]"),
        ("_NUMERIC", {"length": 0}, "numeric[]"),
        ("_MOOD", {}, "text[]"),
    ],
)
def test_postgres_passthrough(type_name: str, fields: dict[str, Any], expected: str) -> None:
    assert pg_type_for(type_name, column(type_name, **fields), "postgres") == expected


def test_type_map_rows_describe_the_map() -> None:
    rows = dict(type_map_rows("mariadb"))
    assert rows["INT UNSIGNED"] == "bigint"
    assert rows["DECIMAL(p,s)"] == "numeric(p,s)"
    assert rows["DATETIME(fsp)"] == "timestamp(fsp) without time zone"
    assert rows["BIT(1)"] == "boolean"
    assert dict(type_map_rows("postgres"))["int4"] == "integer"


def test_dest_identifier_follows_letter_casing() -> None:
    assert dest_identifier("Order Items", "lowercase") == "order items"
    assert dest_identifier("Order Items", "asis") == "Order Items"
    with pytest.raises(ConfigError):
        dest_identifier("x", "uppercase")


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("VARCHAR(100)", "character varying(100)"),
        ("character varying(100)", "character varying(100)"),
        ("int4", "integer"),
        ("INT", "integer"),
        ("numeric(10, 2)", "numeric(10,2)"),
        ("decimal(10,2)", "numeric(10,2)"),
        ("timestamp(3)", "timestamp(3) without time zone"),
        ("timestamp(3) without time zone", "timestamp(3) without time zone"),
        ("timestamptz", "timestamp with time zone"),
        ("TIMESTAMP  WITH TIME ZONE", "timestamp with time zone"),
        ("bool", "boolean"),
        ("float8", "double precision"),
        ("bpchar(4)", "character(4)"),
        ("int4[]", "integer[]"),
    ],
)
def test_canonical_pg_type(spelling: str, expected: str) -> None:
    assert canonical_pg_type(spelling) == expected


def mariadb_column(type_name: str, **fields: Any):
    return column_def_from_source(column(type_name, **fields), connector_type="mariadb", letter_casing="lowercase")


@pytest.mark.parametrize("connector_type", ["mariadb", "mysql"])
def test_a_not_null_mariadb_timestamp_stays_nullable_for_its_zero_dates(connector_type: str) -> None:
    timestamp = column_def_from_source(column("TIMESTAMP", length=6, optional=False), connector_type=connector_type,
                                       letter_casing="lowercase")
    datetime = column_def_from_source(column("DATETIME", optional=False), connector_type=connector_type,
                                      letter_casing="lowercase")
    postgres = column_def_from_source(column("timestamptz", optional=False), connector_type="postgres",
                                      letter_casing="lowercase")
    assert (timestamp.pg_type, timestamp.nullable) == ("timestamp(6) with time zone", True)
    assert (datetime.nullable, postgres.nullable) == (False, False)


def test_column_def_carries_name_type_nullability_and_identity() -> None:
    definition = column_def_from_source(
        column("INT", name="OrderId", optional=False, autoIncremented=True),
        connector_type="mariadb",
        letter_casing="lowercase",
    )
    assert definition.name == "orderid"
    assert definition.source_name == "OrderId"
    assert definition.pg_type == "integer"
    assert definition.nullable is False
    assert definition.identity is True
    assert definition.source_type == "INT"


@pytest.mark.parametrize(
    ("type_name", "fields", "expected"),
    [
        ("ENUM", {"defaultValueExpression": "draft"}, "'draft'"),
        ("VARCHAR", {"length": 10, "defaultValueExpression": "'it''s'"}, "'it''s'"),
        ("DECIMAL", {"length": 6, "scale": 2, "defaultValueExpression": "0"}, "0"),
        ("INT", {"defaultValueExpression": "-3"}, "-3"),
        ("DOUBLE", {"defaultValueExpression": "1.5"}, "1.5"),
        ("BIT", {"length": 1, "defaultValueExpression": "b'1'"}, "true"),
        ("BOOLEAN", {"defaultValueExpression": "1"}, "1"),
        ("BOOL", {"defaultValueExpression": "TRUE"}, "1"),
        ("BIT", {"length": 4, "defaultValueExpression": "b'101'"}, "B'0101'"),
        ("DATETIME", {"length": 3, "defaultValueExpression": "current_timestamp(3)"}, "CURRENT_TIMESTAMP"),
        ("TIMESTAMP", {"defaultValueExpression": "CURRENT_TIMESTAMP"}, "CURRENT_TIMESTAMP"),
        ("DATE", {"defaultValueExpression": "2020-01-31"}, "'2020-01-31'"),
        ("TIME", {"defaultValueExpression": "-12:30:00"}, "'-12:30:00'"),
        ("INT", {"defaultValueExpression": "NULL"}, None),
        ("INT", {"defaultValueExpression": None}, None),
    ],
)
def test_defaults_become_postgres_literals(type_name: str, fields: dict[str, Any], expected: str | None) -> None:
    assert mariadb_column(type_name, **fields).default_sql == expected


@pytest.mark.parametrize(
    ("type_name", "expression"),
    [
        ("DATETIME", "0000-00-00 00:00:00"),
        ("INT", "abc"),
        ("VARCHAR", "uuid()"),
        ("DATE", "current_timestamp()"),
    ],
)
def test_defaults_postgres_cannot_express_are_dropped_with_a_warning(
    type_name: str, expression: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="cdc_pipeline.convert.typemap"):
        assert mariadb_column(type_name, length=20, defaultValueExpression=expression).default_sql is None
    assert "no default set" in caplog.text


def test_implicit_defaults_match_what_mysql_gives_existing_rows() -> None:
    assert mariadb_column("INT").implicit_default_sql == "0"
    assert mariadb_column("VARCHAR", length=5).implicit_default_sql == "''"
    assert mariadb_column("ENUM", enumValues=["'on'", "'off'"]).implicit_default_sql == "'on'"
    assert mariadb_column("BIT", length=3).implicit_default_sql == "B'000'"
    assert mariadb_column("DATETIME").implicit_default_sql is None
