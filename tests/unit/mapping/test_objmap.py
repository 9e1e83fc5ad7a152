"""Unit tests for cdc_pipeline.mapping.objmap: rules parsed or refused, names and types mapped in DDL changes, transforms
rendered as SQL over a reference to the staged value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from cdc_pipeline.config import ConnectorConfig, parse_config
from cdc_pipeline.convert.ddl import changes_from_schema_event, create_table_sql
from cdc_pipeline.errors import MappingRuleError
from cdc_pipeline.mapping.objmap import ObjectMap, Rule, parse_rule, parse_transform
from cdc_pipeline.mapping.transform_sql import transform_sql


def connector_of(connector_type: str = "mariadb", **fields: Any) -> ConnectorConfig:
    config = parse_config({
        "destination": {"dsn": "postgresql://cdc@localhost/warehouse"},
        "connectors": {"c": {"type": connector_type, "hostname": "localhost", "user": "cdc", "password": "secret",
                             "database": "inv", **fields}},
    }, Path("x.yaml"))
    return config.connector("c")


def column(name: str, type_name: str, position: int, **fields: Any) -> dict[str, Any]:
    return {"name": name, "typeName": type_name, "typeExpression": type_name, "position": position, "optional": True,
            "autoIncremented": False, "defaultValueExpression": None, **fields}


EMPLOYEE = [
    column("id", "INT", 1, optional=False, autoIncremented=True, length=11),
    column("nm", "VARCHAR", 2, length=20),
    column("loc", "POINT", 3),
    column("salary", "DECIMAL", 4, length=8, scale=2),
]


def schema_change(ddl: str, kind: str, table_id: str, columns: list[dict[str, Any]], **extra: Any) -> list:
    payload = {"ddl": ddl, "source": {"file": "bin.000001", "pos": 4, "snapshot": "false"}, "tableChanges": [
        {"type": kind, "id": table_id, "table": {"primaryKeyColumnNames": ["id"], "columns": columns}, **extra}]}
    return changes_from_schema_event(payload, connector="c", connector_type="mariadb", letter_casing="lowercase",
                                     destination_schema=None)


def object_map(*rules: tuple[str, str, str], connector: ConnectorConfig | None = None) -> ObjectMap:
    connector = connector or connector_of()
    return ObjectMap(connector, [parse_rule(connector, *rule) for rule in rules])


def test_rules_are_stored_normalized() -> None:
    connector = connector_of()
    assert parse_rule(connector, "TABLE", "inv.employee", "hr.staff") == Rule("table", "inv.employee", "hr.staff")
    assert parse_rule(connector, "datatype", "point|False", "text") == Rule("datatype", "POINT|false", "text|0")
    assert parse_rule(connector, "datatype", "inv.t.c", "varchar|-1") == Rule("datatype", "inv.t.c", "varchar|-1")
    assert parse_rule(connector, "column", '"inv"."my table"."a b"', '"c d"') == Rule(
        "column", "inv.my table.a b", "c d")
    postgres = connector_of("postgres", port=5432)
    assert parse_rule(postgres, "table", "inv.public.orders", "sales.orders").source == "public.orders"
    assert parse_rule(postgres, "column", "public.orders.id", "order_id").source == "public.orders.id"


@pytest.mark.parametrize(("kind", "source", "destination", "reason"), [
    ("view", "inv.t", "x", "unknown rule kind 'view'"),
    ("table", "t", "x", "is not a table"),
    ("table", "other.t", "x", "names database 'other'"),
    ("table", "inv.public.t", "x", "a mariadb table is db.table"),
    ("table", "inv.t", "a.b.c", "is not a destination table"),
    ("column", "inv.t", "x", "is not a column"),
    ("column", "inv.t.c", "a.b", "is not a column name"),
    ("datatype", "point|maybe", "text", "auto-increment flag"),
    ("datatype", "inv.t.c", "text; drop table x", "is not a PostgreSQL type name"),
    ("datatype", "inv.t.c", "integer default current_user", "is not a PostgreSQL type name"),
    ("datatype", "inv.t.c", "text check (false)", "is not a PostgreSQL type name"),
    ("datatype", "inv.t.c", "text collate \"C\"", "is not a PostgreSQL type name"),
    ("datatype", "inv.t.c", "numeric(10,2)|4", "modifiers already"),
    ("datatype", "inv.t.c", "text|-3", "must be -1, 0 or positive"),
    ("transform", "inv.t.c", "%d; drop table x", "without ';'"),
    ("transform", "inv.t.c", "upper(%d", "unbalanced parentheses"),
    ("transform", "inv.t.c", "'%d", "unterminated string literal"),
    ("transform", "inv.t.c", "%x + 1", "unknown placeholder %x"),
    ("transform", "inv.t.c", "$$%d$$", "dollar quotes"),
    # PostgreSQL's parser and the allow-list: the value and pure functions of it, nothing else.
    ("transform", "inv.t.c", "(SELECT passwd FROM pg_shadow LIMIT 1)", "a sub-query is not allowed"),
    ("transform", "inv.t.c", "%d || (SELECT count(*) FROM hr.salaries)", "a sub-query is not allowed"),
    ("transform", "inv.t.c", "pg_read_file('/etc/passwd')", "function pg_read_file is not allowed"),
    ("transform", "inv.t.c", "current_setting('is_superuser')", "function current_setting is not allowed"),
    ("transform", "inv.t.c", "set_config('role', 'x', false)", "function set_config is not allowed"),
    ("transform", "inv.t.c", "nextval('s') + %d", "function nextval is not allowed"),
    ("transform", "inv.t.c", "public.mask(%d)", "function public.mask is not allowed"),
    ("transform", "inv.t.c", "%d || current_user", "a session value"),
    ("transform", "inv.t.c", "other_column || %d", "a column or table reference"),
    ("transform", "inv.t.c", "count(*)", "function count is not allowed"),
    ("transform", "inv.t.c", "upper(%d) OVER ()", "not allowed"),
    ("transform", "inv.t.c", "'pg_authid'::regclass::text", "catalog lookup types"),
    ("transform", "inv.t.c", "%d AS x", "without a FROM, a WHERE or a name"),
    ("transform", "inv.t.c", "%d FROM pg_shadow", "without a FROM, a WHERE or a name"),
    ("transform", "inv.t.c", "%d +", "PostgreSQL cannot parse it"),
])
def test_malformed_rules_are_refused_with_the_reason(kind: str, source: str, destination: str, reason: str) -> None:
    with pytest.raises(MappingRuleError) as raised:
        parse_rule(connector_of(), kind, source, destination)
    assert reason in str(raised.value) and "connector 'c'" in str(raised.value)


def test_create_uses_mapped_table_column_names_and_types() -> None:
    rules = object_map(("table", "inv.employee", "hr.staff"), ("column", "inv.employee.nm", "full_name"),
                       ("datatype", "point|false", "text"), ("datatype", "inv.employee.salary", "numeric|-1"),
                       ("datatype", "inv.employee.id", "bigint|-1"))
    [change] = schema_change("CREATE TABLE employee (...)", "CREATE", "inv.employee", EMPLOYEE)

    mapped = rules.map_change(change)

    assert (mapped.schema, mapped.name) == ("hr", "staff")
    assert [(c.name, c.pg_type) for c in mapped.table.columns] == [
        ("id", "bigint"), ("full_name", "character varying(20)"), ("loc", "text"), ("salary", "numeric(8,2)")]
    assert mapped.table.primary_key == ("id",)
    assert mapped.table.columns[2].type_map_type == "bytea"
    statement = create_table_sql(mapped.table)[1].as_string(None)
    assert statement.startswith('CREATE TABLE IF NOT EXISTS "hr"."staff" (')
    assert '"full_name" character varying(20)' in statement


def test_a_generic_type_rule_matches_the_auto_increment_flag_and_a_column_rule_wins() -> None:
    rules = object_map(("datatype", "int|true", "bigint"), ("datatype", "decimal|false", "double precision"),
                       ("datatype", "inv.employee.salary", "text"))
    [change] = schema_change("CREATE TABLE employee (...)", "CREATE", "inv.employee", EMPLOYEE)

    types = {c.name: c.pg_type for c in rules.map_change(change).table.columns}

    assert types == {"id": "bigint", "nm": "character varying(20)", "loc": "bytea", "salary": "text"}


def test_source_renames_follow_the_mapped_names() -> None:
    rules = object_map(("table", "inv.staff", "hr.people"), ("table", "inv.employee", "hr.employees"),
                       ("column", "inv.employee.nm", "full_name"), ("column", "inv.staff.nm", "given_name"))
    renamed = [column("id", "INT", 1, optional=False), column("name", "VARCHAR", 2, length=20)]
    [change] = schema_change("ALTER TABLE employee RENAME COLUMN nm TO name", "ALTER", "inv.employee", renamed)
    [table_renamed] = schema_change("RENAME TABLE employee TO staff", "ALTER", "inv.staff", EMPLOYEE,
                                    previousId="inv.employee")

    mapped = rules.map_change(change)
    moved = rules.map_change(table_renamed)

    assert mapped.column_renames == (("full_name", "name"),)
    assert moved.renamed_from == ("hr", "employees") and (moved.schema, moved.name) == ("hr", "people")
    assert moved.column_renames == (("full_name", "given_name"),)


def test_columns_mapped_onto_one_name_are_refused() -> None:
    rules = object_map(("column", "inv.employee.nm", "id"))
    [change] = schema_change("CREATE TABLE employee (...)", "CREATE", "inv.employee", EMPLOYEE)
    with pytest.raises(MappingRuleError, match="several columns the name"):
        rules.map_change(change)


def test_without_rules_names_follow_the_connector() -> None:
    rules = ObjectMap(connector_of(destination_schema="landing", letter_casing="asis"))
    assert rules.table_name("inv.Employee") == ("landing", "Employee")
    assert rules.column_name("inv.Employee", "Nm") == "Nm"
    assert not rules


def render(expression: str, pg_type: str = "integer", *, with_parameters: bool = False) -> str:
    return transform_sql(parse_transform(expression), sql.Identifier("s", "v"), pg_type,
                         with_parameters=with_parameters).as_string(None)


def test_transforms_reference_the_staged_value_typed_or_as_text() -> None:
    assert render("round(%d * 1.1, 2)", "numeric(10,2)") == \
        'CAST((round(CAST("s"."v" AS numeric(10,2)) * 1.1, 2)) AS numeric(10,2))'
    assert render("'%d' || '-suffix'", "character varying(20)") == """CAST((("s"."v") || '-suffix') AS text)"""
    assert render("'<%d>'") == """CAST((('<' || "s"."v" || '>')) AS integer)"""
    assert render("upper('%d')", "my_type") == """CAST((upper(("s"."v"))) AS my_type)"""


def test_percent_signs_are_doubled_only_when_the_statement_has_parameters() -> None:
    assert render("%d %% 7 + length('100%%')") == \
        """CAST((CAST("s"."v" AS integer) % 7 + length('100%')) AS integer)"""
    assert render("%d %% 7 + length('100%%')", with_parameters=True) == \
        """CAST((CAST("s"."v" AS integer) %% 7 + length('100%%')) AS integer)"""


def test_geometry_placeholders_read_the_staged_text_form() -> None:
    rendered = render("ST_GeomFromWKB(%w, %s)", "geometry")
    assert "decode(regexp_replace(\"s\".\"v\", '^SRID=[0-9]+;', ''), 'hex')" in rendered
    assert "coalesce(CAST(substring(\"s\".\"v\" from '^SRID=([0-9]+);') AS integer), 0)" in rendered
    assert parse_transform("ST_GeomFromWKB(%w, %s)").uses_geometry and not parse_transform("%d").uses_geometry
