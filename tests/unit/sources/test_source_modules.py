"""What every source type's module holds, so that adding a source type is adding one module (and its tests): the
stages ask `sources.module_for(type)` for these, never test the type themselves."""

from __future__ import annotations

import pytest

from cdc_pipeline import sources
from cdc_pipeline.config import CONNECTOR_TYPES
from cdc_pipeline.sources import mariadb, postgres
from cdc_pipeline.sources.offset_shape import OffsetShape
from cdc_pipeline.sources.type_choice import TypeChoice

# What a source module must have, and what it has when it does that part (the bulk snapshot's reads aside).
REQUIRED = ("OFFSET_SHAPE", "DDL_EVENTS", "debezium_properties", "replicates", "source_partition")
TYPE_MAP = ("TYPE_MAPS", "TYPE_MAP_NOTES", "IMPLICIT_DEFAULTS", "column_type", "always_nullable")


@pytest.mark.parametrize("connector_type", CONNECTOR_TYPES)
def test_each_connector_type_has_a_source_module_with_the_required_parts(connector_type):
    module = sources.module_for(connector_type)
    assert [name for name in REQUIRED if not hasattr(module, name)] == []
    assert isinstance(module.OFFSET_SHAPE, OffsetShape)
    if hasattr(module, "TYPE_MAPS"):
        assert [name for name in TYPE_MAP if not hasattr(module, name)] == []
        assert connector_type in module.TYPE_MAPS and connector_type in module.TYPE_MAP_NOTES


def test_a_mariadb_column_type_is_a_template_and_its_fractional_digits():
    assert mariadb.column_type("DATETIME", {"length": 3}, "mariadb") == TypeChoice(
        "timestamp(fsp) without time zone", 3)
    assert mariadb.column_type("INT", {"typeExpression": "INT UNSIGNED"}, "mysql").template == "bigint"
    assert mariadb.column_type("BIT", {"length": 1}, "mariadb") == TypeChoice("boolean")
    assert mariadb.column_type("VECTOR", {}, "mariadb") is None
    assert mariadb.always_nullable("TIMESTAMP(6)") and not mariadb.always_nullable("DATETIME")


def test_a_postgres_array_column_type_is_its_elements_as_an_array():
    assert postgres.column_type("_varchar", {"length": 20}, "postgres") == TypeChoice("character varying(n)[]", None)
    assert postgres.column_type("_mood", {}, "postgres") == TypeChoice("text[]")
    assert postgres.column_type("bpchar", {}, "postgres") == TypeChoice("bpchar")
    assert postgres.column_type("mood", {}, "postgres") is None
    assert postgres.array_element("integer[]") == "integer" and postgres.array_element("int4") is None
