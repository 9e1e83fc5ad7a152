"""Oracle's type map (columns as ojdbc's getColumns reports them in a snapshot and as Debezium's Oracle DDL parser
makes them while streaming), its default expressions, the datatype mapping rules on its type names, and its rows
in the docs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from cdc_pipeline.config import parse_config
from cdc_pipeline.convert.ddl import changes_from_schema_event
from cdc_pipeline.convert.typemap import column_def_from_source, pg_type_for
from cdc_pipeline.mapping.objmap import ObjectMap, parse_rule
from cdc_pipeline.sources import oracle


def column(name: str, type_name: str, position: int = 1, **fields: Any) -> dict[str, Any]:
    return {"name": name, "typeName": type_name, "typeExpression": type_name, "position": position,
            "optional": True, "autoIncremented": False, "defaultValueExpression": None, **fields}


# (typeName, length, scale) as ojdbc (JDBC) or the DDL parser (DDL) reports them, and the destination type.
TYPES = [
    ("NUMBER", 1, 0, "smallint"),  # NUMBER(1): int8
    ("NUMBER", 4, 0, "smallint"),
    ("NUMBER", 9, 0, "integer"),
    ("NUMBER", 18, 0, "bigint"),
    ("NUMBER", 19, 0, "numeric(19,0)"),
    ("NUMBER", 38, 0, "numeric(38,0)"),  # DDL: INTEGER
    ("NUMBER", 10, -2, "bigint"),  # rounded to hundreds: 12 digits
    ("NUMBER", 20, -5, "numeric"),
    ("NUMBER", 12, 4, "numeric(12,4)"),
    ("NUMBER", 2, 5, "numeric"),  # 0.000xx: a scale over the precision
    ("NUMBER", 0, None, "numeric"),  # JDBC: NUMBER without precision (scale -127 taken off by Debezium)
    ("NUMBER", 38, None, "numeric"),  # DDL: NUMBER without precision
    ("FLOAT", 126, None, "numeric"),
    ("FLOAT", 63, None, "numeric"),  # DDL: REAL
    ("BINARY_FLOAT", 4, None, "real"),
    ("BINARY_DOUBLE", 8, None, "double precision"),
    ("DATE", 7, None, "timestamp(0) without time zone"),
    ("TIMESTAMP(6)", 6, None, "timestamp(6) without time zone"),  # JDBC: length from the scale (overrideColumn)
    ("TIMESTAMP", 3, None, "timestamp(3) without time zone"),  # DDL: TIMESTAMP(3)
    ("TIMESTAMP(9)", 9, None, "timestamp(6) without time zone"),
    ("TIMESTAMP(0)", 0, None, "timestamp(0) without time zone"),
    ("TIMESTAMP(6) WITH TIME ZONE", 13, 6, "timestamp(6) with time zone"),
    ("TIMESTAMP WITH TIME ZONE", 9, None, "timestamp(6) with time zone"),
    ("TIMESTAMP(3) WITH LOCAL TIME ZONE", 11, 3, "timestamp(3) with time zone"),
    ("TIMESTAMP WITH LOCAL TIME ZONE", 6, None, "timestamp(6) with time zone"),
    ("INTERVAL DAY(2) TO SECOND(6)", 2, 6, "interval"),
    ("INTERVAL DAY TO SECOND", 9, 9, "interval"),
    ("INTERVAL YEAR(2) TO MONTH", 2, None, "interval"),
    ("INTERVAL YEAR TO MONTH", 4, None, "interval"),
    ("CHAR", 1, None, "character(1)"),
    ("NCHAR", 10, None, "character(10)"),
    ("VARCHAR2", 4000, None, "character varying(4000)"),
    ("VARCHAR2", 32767, None, "character varying(32767)"),
    ("NVARCHAR2", 2000, None, "character varying(2000)"),
    ("VARCHAR", 10, None, "character varying(10)"),
    ("CLOB", 4000, None, "text"),
    ("NCLOB", 4000, None, "text"),
    ("LONG", 0, None, "text"),
    ("RAW", 16, None, "bytea"),
    ("LONG RAW", 0, None, "bytea"),
    ("LONGRAW", 0, None, "bytea"),  # DDL: the parser's text of LONG RAW
    ("BLOB", 4000, None, "bytea"),
    ("ROWID", 10, None, "text"),
    ("UROWID", 4000, None, "text"),
    ("XMLTYPE", 2000, None, "text"),
    ("SYS.XMLTYPE", 2000, None, "text"),
    ("JSON", 0, None, "json"),
    ("BOOLEAN", 1, None, "boolean"),
    ("SDO_GEOMETRY", 1, None, "text"),  # unknown: text, with a warning
]


@pytest.mark.parametrize("type_name, length, scale, expected", TYPES)
def test_each_oracle_type_has_its_exact_destination_type(type_name, length, scale, expected):
    assert pg_type_for(type_name, column("C", type_name, length=length, scale=scale), "oracle") == expected


def test_every_row_of_the_map_is_tested():
    tested = {oracle.ORACLE_TYPE_MAP.get(t) and t.split("(")[0] for t, *_ in TYPES}
    bases = {" ".join(t.replace("(6)", "").replace("(9)", "").replace("(0)", "").replace("(3)", "")
                       .replace("(2)", "").split()) for t, *_ in TYPES}
    assert set(oracle.ORACLE_TYPE_MAP) <= bases | tested


def test_oracle_defaults_read_as_postgresql_defaults():
    def default(type_name: str, expression: str, **fields: Any) -> str | None:
        return column_def_from_source(column("C", type_name, defaultValueExpression=expression, **fields),
                                      connector_type="oracle", letter_casing="lowercase").default_sql

    assert default("NUMBER", "0 ", length=9, scale=0) == "0"
    assert default("VARCHAR2", "'it''s' ", length=10) == "'it''s'"
    assert default("NVARCHAR2", "N'caf\u00e9'", length=10) == "'caf\u00e9'"
    assert default("DATE", "SYSDATE") == "CURRENT_TIMESTAMP"
    assert default("TIMESTAMP(6)", "SYSTIMESTAMP", length=6) == "CURRENT_TIMESTAMP"
    assert default("RAW", "SYS_GUID()", length=16) is None
    assert default("NUMBER", "NULL", length=9, scale=0) is None


def oracle_change(kind: str, ddl: str, columns: list[dict[str, Any]], keys: list[str]) -> list:
    payload = {"ddl": ddl, "databaseName": "ORCLPDB1", "schemaName": "DEBEZIUM",
               "source": {"db": "ORCLPDB1", "schema": "DEBEZIUM", "table": "ITEMS", "scn": "2891044",
                          "snapshot": "false"},
               "tableChanges": [{"type": kind, "id": "ORCLPDB1.DEBEZIUM.ITEMS",
                                 "table": {"primaryKeyColumnNames": keys, "columns": columns}}]}
    return changes_from_schema_event(payload, connector="c", connector_type="oracle", letter_casing="lowercase",
                                     destination_schema=None)


def test_datatype_rules_match_oracle_and_sqlserver_type_names_without_precisions():
    config = parse_config({
        "destination": {"dsn": "postgresql://cdc@localhost/warehouse"},
        "connectors": {"o": {"type": "oracle", "hostname": "h", "user": "u", "password": "p", "database": "ORCLPDB1"},
                       "s": {"type": "sqlserver", "hostname": "h", "user": "u", "password": "p", "database": "shop"}},
    }, Path("x.yaml"))
    rules = ObjectMap(config.connector("o"), [
        parse_rule(config.connector("o"), "datatype", "timestamp with time zone|false", "text"),
        parse_rule(config.connector("o"), "datatype", "number|false", "numeric|-1")])
    [change] = oracle_change("CREATE", "", [column("ID", "NUMBER", 1, length=9, scale=0),
                                            column("AT", "TIMESTAMP(6) WITH TIME ZONE", 2, length=13, scale=6),
                                            column("PLAIN", "TIMESTAMP(6)", 3, length=6)], ["ID"])
    mapped = {c.name: c.pg_type for c in rules.map_change(change).table.columns}
    assert mapped == {"id": "numeric(9)", "at": "text", "plain": "timestamp(6) without time zone"}
    server = config.connector("s")
    rules = ObjectMap(server, [parse_rule(server, "datatype", "int|true", "bigint")])
    identity = column_def_from_source(column("ID", "int identity", autoIncremented=True, length=10, scale=0),
                                      connector_type="sqlserver", letter_casing="lowercase")
    assert rules.map_column("dbo.items", identity).pg_type == "bigint"


def test_every_type_of_the_map_has_a_row_in_the_docs():
    docs = Path(__file__).resolve().parents[4] / "docs" / "types.md"
    section = docs.read_text().split("## Oracle source -> PostgreSQL", 1)[1].split("\n## ", 1)[0]
    rows = [set(re.findall(r"[A-Z_0-9]+", line.split("|")[1].upper())) for line in section.splitlines()
            if line.startswith("| ")]
    missing = [name for name in oracle.ORACLE_TYPE_MAP if not any(set(name.split()) <= row for row in rows)]
    assert missing == []
