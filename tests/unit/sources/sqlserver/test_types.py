"""SQL Server's type map (columns as mssql-jdbc's getColumns reports them, as Debezium's tableChanges carry them), its
default expressions and its rows in the docs."""

from __future__ import annotations

import re
from typing import Any

import pytest

from cdc_pipeline.convert.typemap import column_def_from_source, pg_type_for, type_map_rows
from cdc_pipeline.sources import sqlserver


def column(name: str, type_name: str, position: int = 1, **fields: Any) -> dict[str, Any]:
    return {"name": name, "typeName": type_name, "typeExpression": type_name, "position": position,
            "optional": True, "autoIncremented": False, "defaultValueExpression": None, **fields}


# (typeName, jdbcType, length, scale) as mssql-jdbc 12 reports them, and the destination type.
TYPES = [
    ("bit", -7, 1, None, "boolean"),
    ("tinyint", -6, 3, 0, "smallint"),
    ("smallint", 5, 5, 0, "smallint"),
    ("int", 4, 10, 0, "integer"),
    ("int identity", 4, 10, 0, "integer"),
    ("bigint identity", -5, 19, 0, "bigint"),
    ("bigint", -5, 19, 0, "bigint"),
    ("decimal", 3, 38, 10, "numeric(38,10)"),
    ("numeric", 2, 18, 0, "numeric(18,0)"),
    ("numeric() identity", 2, 18, 0, "numeric(18,0)"),
    ("smallmoney", 3, 10, 4, "numeric(10,4)"),
    ("money", 3, 19, 4, "numeric(19,4)"),
    ("real", 7, 24, None, "real"),
    ("float", 8, 53, None, "double precision"),
    ("date", 91, 10, None, "date"),
    ("time", 92, 16, 7, "time(6) without time zone"),
    ("time", 92, 11, 2, "time(2) without time zone"),
    ("datetime", 93, 23, 3, "timestamp(3) without time zone"),
    ("smalldatetime", 93, 16, 0, "timestamp(0) without time zone"),
    ("datetime2", 93, 27, 7, "timestamp(6) without time zone"),
    ("datetime2", 93, 19, 0, "timestamp(0) without time zone"),
    ("datetimeoffset", -155, 34, 7, "timestamp(6) with time zone"),
    ("char", 1, 10, None, "character(10)"),
    ("nchar", -15, 10, None, "character(10)"),
    ("varchar", 12, 8000, None, "character varying(8000)"),
    ("varchar", 12, 2147483647, None, "text"),
    ("nvarchar", -9, 4000, None, "character varying(4000)"),
    ("nvarchar", -9, 1073741823, None, "text"),
    ("sysname", -9, 128, None, "character varying(128)"),
    ("text", -1, 2147483647, None, "text"),
    ("ntext", -16, 1073741823, None, "text"),
    ("binary", -2, 16, None, "bytea"),
    ("varbinary", -3, 2147483647, None, "bytea"),
    ("image", -4, 2147483647, None, "bytea"),
    ("timestamp", -2, 8, None, "bytea"),
    ("uniqueidentifier", 1, 36, None, "uuid"),
    ("xml", -16, 2147483647, None, "xml"),
    ("json", -16, 2147483647, None, "json"),
    ("hierarchyid", -3, 892, None, "bytea"),
    ("geometry", -4, 2147483647, None, "bytea"),
    ("geography", -4, 2147483647, None, "bytea"),
    ("sql_variant", -156, 8000, None, "text"),
]


@pytest.mark.parametrize("type_name, jdbc_type, length, scale, expected", TYPES)
def test_each_sqlserver_type_has_its_exact_destination_type(type_name, jdbc_type, length, scale, expected):
    description = column("c", type_name, jdbcType=jdbc_type, length=length, scale=scale)
    assert pg_type_for(type_name, description, "sqlserver") == expected


def test_every_row_of_the_map_is_tested_and_printed_for_the_docs():
    assert {row[0].split()[0] for row in TYPES} >= set(sqlserver.SQLSERVER_TYPE_MAP) - {"rowversion"}
    assert ("money", "numeric(19,4)") in type_map_rows("sqlserver")


def test_an_identity_column_is_an_identity_and_defaults_lose_their_parentheses():
    identity = column_def_from_source(column("id", "int identity", autoIncremented=True, optional=False),
                                      connector_type="sqlserver", letter_casing="lowercase")
    assert (identity.pg_type, identity.identity, identity.nullable) == ("integer", True, False)
    defaults = {expression: column_def_from_source(
        column("c", type_name, length=length, scale=scale, defaultValueExpression=expression),
        connector_type="sqlserver", letter_casing="lowercase").default_sql
        for type_name, length, scale, expression in [
            ("int", 10, 0, "((0))"), ("decimal", 9, 2, "((-1.50))"), ("nvarchar", 20, None, "(N'caf\u00e9')"),
            ("varchar", 20, None, "('it''s')"), ("datetime2", 27, 7, "(getdate())"),
            ("uniqueidentifier", 36, None, "(newid())"), ("bit", 1, None, "((1))"), ("int", 10, 0, "(NULL)")]}
    assert defaults == {"((0))": "0", "((-1.50))": "-1.50", "(N'caf\u00e9')": "'caf\u00e9'", "('it''s')": "'it''s'",
                        "(getdate())": "CURRENT_TIMESTAMP", "(newid())": None, "((1))": "true", "(NULL)": None}


def test_every_type_of_the_map_has_a_row_in_the_docs():
    from pathlib import Path

    docs = Path(__file__).resolve().parents[4] / "docs" / "types.md"
    section = docs.read_text().split("## SQL Server source -> PostgreSQL", 1)[1].split("\n## ", 1)[0]
    words = {word for line in section.splitlines() if line.startswith("| ")
             for word in re.findall(r"[a-z_0-9]+", line.split("|")[1].lower())}
    missing = [name for name in sqlserver.SQLSERVER_TYPE_MAP if name not in words]
    assert missing == []
