"""The PostgreSQL type map as a column reads by it: an array of a known type is an array of its destination type."""

from __future__ import annotations

from cdc_pipeline.sources import postgres
from cdc_pipeline.sources.type_choice import TypeChoice


def test_a_postgres_array_column_type_is_its_elements_as_an_array():
    assert postgres.column_type("_varchar", {"length": 20}, "postgres") == TypeChoice("character varying(n)[]", None)
    assert postgres.column_type("_mood", {}, "postgres") == TypeChoice("text[]")
    assert postgres.column_type("bpchar", {}, "postgres") == TypeChoice("bpchar")
    assert postgres.column_type("mood", {}, "postgres") is None
    assert postgres.array_element("integer[]") == "integer" and postgres.array_element("int4") is None
