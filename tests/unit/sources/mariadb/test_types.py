"""The MariaDB/MySQL type map as a column reads by it: a template and its fractional digits, unsigned integers
widened, BIT(1) as boolean, and TIMESTAMP always nullable."""

from __future__ import annotations

from cdc_pipeline.sources import mariadb
from cdc_pipeline.sources.type_choice import TypeChoice


def test_a_mariadb_column_type_is_a_template_and_its_fractional_digits():
    assert mariadb.column_type("DATETIME", {"length": 3}, "mariadb") == TypeChoice(
        "timestamp(fsp) without time zone", 3)
    assert mariadb.column_type("INT", {"typeExpression": "INT UNSIGNED"}, "mysql").template == "bigint"
    assert mariadb.column_type("BIT", {"length": 1}, "mariadb") == TypeChoice("boolean")
    assert mariadb.column_type("VECTOR", {}, "mariadb") is None
    assert mariadb.always_nullable("TIMESTAMP(6)") and not mariadb.always_nullable("DATETIME")
