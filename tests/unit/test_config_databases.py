"""A MariaDB/MySQL connector of several databases (`databases`: names and shell-style patterns), each into its own
destination schema."""

from __future__ import annotations

import re
from typing import Any

import pytest

from cdc_pipeline.config import default_table_name, parse_config
from cdc_pipeline.errors import ConfigError
from cdc_pipeline.mapping.objmap import MappingRuleError, normalized_source
from cdc_pipeline.sources import captures, mariadb, select_tables
from tests.unit.test_config import CONFIG_PATH, config_error, valid_data


def tenants(**fields: Any) -> dict[str, Any]:
    data = valid_data()
    connector = data["connectors"]["inventory"]
    del connector["database"]
    connector.update({"databases": ["tenant_*", "shop"], **fields})
    return data


def connector_of(data: dict[str, Any]):
    return parse_config(data, CONFIG_PATH).connector("inventory")


def test_patterns_and_names_match_whole_database_names_without_case() -> None:
    connector = connector_of(tenants())

    assert [name for name in ("tenant_1", "TENANT_22", "tenant_", "shop", "Shop", "shops", "my_tenant_1", "mysql")
            if connector.captures_database(name)] == ["tenant_1", "TENANT_22", "tenant_", "shop", "Shop"]
    assert captures(connector, "tenant_7.orders") and captures(connector, "shop.items")
    assert not captures(connector, "other.items") and not captures(connector, "my_tenant_1.orders")
    assert not captures(connector_of(tenants(databases=["*"])), "mysql.user"), "the server's own schemas"


def test_the_engine_reads_every_database_of_the_list_from_one_binlog() -> None:
    include = mariadb.debezium_properties(connector_of(tenants()))["database.include.list"]

    assert include == r"tenant_.*,shop"
    java_alike = [re.compile(part, re.IGNORECASE) for part in include.split(",")]
    assert any(pattern.fullmatch("tenant_3") for pattern in java_alike)
    assert mariadb.debezium_properties(connector_of(valid_data()))["database.include.list"] == "inventory"


@pytest.mark.parametrize("pattern, matches, misses", [
    ("t?_db", ["t1_db", "tx_db"], ["t12_db", "t_db"]),
    ("[ab]*", ["alpha", "beta"], ["gamma"]),
    ("[!ab]*", ["gamma"], ["alpha"]),
    ("shop.eu", ["shop.eu"], ["shopxeu"]),
])
def test_shell_patterns(pattern: str, matches: list[str], misses: list[str]) -> None:
    connector = connector_of(tenants(databases=[pattern]))
    assert all(connector.captures_database(name) for name in matches)
    assert not any(connector.captures_database(name) for name in misses)


def test_each_database_lands_in_its_own_schema_by_default_or_by_the_template() -> None:
    assert default_table_name(connector_of(tenants()), "tenant_7.Orders") == ("tenant_7", "orders")
    templated = connector_of(tenants(destination_schema="raw_{database}"))
    assert default_table_name(templated, "Tenant_7.orders") == ("raw_tenant_7", "orders")
    single = connector_of(valid_data() | {"connectors": {"inventory": {
        **valid_data()["connectors"]["inventory"], "destination_schema": "copy_{database}"}}})
    assert default_table_name(single, "inventory.items") == ("copy_inventory", "items")


def test_a_table_id_splits_after_the_database_it_names() -> None:
    connector = connector_of(tenants(databases=["shop.eu", "tenant_*"]))
    assert connector.split_table("shop.eu.items") == ("shop.eu", "items")
    assert connector.split_table("tenant_1.a.b") == ("tenant_1", "a.b")


@pytest.mark.parametrize("fields, message", [
    ({"database": "inventory"}, "takes `database` or `databases`, not both"),
    ({"destination_schema": "all_tenants"}, "write {database} in it"),
    ({"databases": ["a,b"]}, "holds a comma"),
])
def test_refused_shapes_say_why(fields: dict[str, Any], message: str) -> None:
    error = config_error(tenants(**fields))
    assert message in str(error) and error.connector == "inventory"


def test_databases_is_for_binlog_sources_and_the_placeholder_too() -> None:
    data = tenants(type="postgres")
    assert "is for mariadb, mysql sources" in str(config_error(data))
    data = valid_data()
    data["connectors"]["inventory"].update(type="postgres", destination_schema="x_{database}")
    assert "holds {database}" in str(config_error(data))


def test_one_fixed_schema_is_allowed_for_one_named_database() -> None:
    connector = connector_of(tenants(databases=["shop"], destination_schema="copy"))
    assert default_table_name(connector, "shop.items") == ("copy", "items")


def test_two_connectors_whose_named_databases_share_a_schema_are_refused() -> None:
    data = tenants(databases=["shop", "tenant_1"])
    data["connectors"]["other"] = {**valid_data()["connectors"]["inventory"], "database": "shop"}
    with pytest.raises(ConfigError, match="both write every table of schema shop"):
        parse_config(data, CONFIG_PATH)


def test_rules_name_tables_of_any_of_the_databases() -> None:
    connector = connector_of(tenants())
    assert normalized_source(connector, "table", "tenant_4.orders") == "tenant_4.orders"
    with pytest.raises(MappingRuleError, match="not one of the connector's"):
        normalized_source(connector, "table", "other.orders")


def test_a_database_star_selects_every_table_of_that_database() -> None:
    connector = connector_of(tenants())
    listed = ["tenant_1.orders", "tenant_1.items", "tenant_2.orders", "shop.items"]
    assert select_tables(connector, ["tenant_1.*", "shop.items"], listed) == (
        ["tenant_1.orders", "tenant_1.items", "shop.items"], [])
    assert select_tables(connector, ["tenant_9.*", "tenant_2.gone", "tenant_2.orders"], listed) == (
        ["tenant_2.orders"], ["tenant_2.gone", "tenant_9.*"])
    assert select_tables(connector, None, listed) == (listed, [])
