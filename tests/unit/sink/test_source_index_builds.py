"""The source's secondary indexes planned on a real destination (`deferred_keys.plan_source_indexes`): recorded for
a large table and made by `key_builds.Builds` exactly once, made at once for a small one, a name the destination has
left alone, a column it lacks or an operator class its type lacks logged and left out."""

from __future__ import annotations

import logging

import pytest

from cdc_pipeline import control
from cdc_pipeline.config import DestinationConfig
from cdc_pipeline.sink import deferred_keys
from cdc_pipeline.sink.key_builds import Builds
from cdc_pipeline.sources.source_index import IndexColumn, SourceIndex
from tests.unit.sink.test_deferred_keys import destination as keys_destination  # noqa: F401  (a fixture)

CONNECTOR = "shop"
AB = SourceIndex("items", "ab", "btree", (IndexColumn("a"), IndexColumn("b", descending=True)))


@pytest.fixture
def destination(keys_destination: DestinationConfig) -> DestinationConfig:
    with keys_destination.connect() as conn:
        conn.execute("CREATE TABLE app.items (id int PRIMARY KEY, a int, b text)")
        conn.execute("INSERT INTO app.items SELECT g, g % 7, 'b' || g FROM generate_series(1, 100) AS g")
    return keys_destination


def _plan(destination: DestinationConfig, indexes: list[tuple[str, SourceIndex]], build_now: bool) -> list[str]:
    with destination.connect() as conn, conn.transaction(), conn.cursor() as cur:
        return deferred_keys.plan_source_indexes(cur, "cdc", CONNECTOR, "app", "items", indexes, build_now)


def _indexes(destination: DestinationConfig) -> dict[str, str]:
    with destination.connect() as conn:
        rows = conn.execute("SELECT i.relname, pg_get_indexdef(x.indexrelid) FROM pg_index x JOIN pg_class i "
                            "ON i.oid = x.indexrelid WHERE x.indrelid = 'app.items'::regclass "
                            "AND NOT x.indisprimary").fetchall()
    return {name: definition.partition(" USING ")[2] for name, definition in rows}


def _recorded(destination: DestinationConfig) -> list[tuple[str, str]]:
    with destination.connect() as conn:
        return conn.execute("SELECT name, kind FROM cdc.deferred_constraints ORDER BY 1").fetchall()


def _build(destination: DestinationConfig) -> list[str]:
    builds = Builds(destination, CONNECTOR)
    try:
        with destination.connect() as conn:
            builds.submit(deferred_keys.waiting(conn, "cdc", CONNECTOR, deferred_keys.AFTER_ROWS, [("app", "items")]))
        return builds.wait()
    finally:
        builds.close()


def test_a_large_tables_indexes_are_recorded_then_made_once(destination):
    assert _plan(destination, [("items_ab_idx", AB)], build_now=False) == ["items_ab_idx"]
    assert _indexes(destination) == {}
    assert _recorded(destination) == [("items_ab_idx", "source index")]

    assert _build(destination) == ["app.items.items_ab_idx"]
    assert _indexes(destination) == {"items_ab_idx": "btree (a, b DESC)"}
    assert _recorded(destination) == []
    assert _build(destination) == []  # a record gone is made by no later run


def test_a_small_tables_indexes_are_made_at_once_and_a_name_taken_is_left_alone(destination):
    with destination.connect() as conn:
        conn.execute("CREATE INDEX items_ab_idx ON app.items (b)")
    by_b = SourceIndex("items", "by_b", "hash", (IndexColumn("b"),))
    assert _plan(destination, [("items_ab_idx", AB), ("items_by_b_idx", by_b)], build_now=True) == ["items_by_b_idx"]
    assert _indexes(destination) == {"items_ab_idx": "btree (b)", "items_by_b_idx": "hash (b)"}
    assert _recorded(destination) == []


def test_an_index_the_destination_cannot_have_is_logged_and_left_out(destination, caplog):
    lacking = SourceIndex("items", "by_c", "btree", (IndexColumn("c"),))
    no_class = SourceIndex("items", "a_gin", "gin", (IndexColumn("a"),))  # int has no default GIN operator class
    with caplog.at_level(logging.INFO):
        assert _plan(destination, [("items_by_c_idx", lacking), ("items_a_gin_idx", no_class)],
                     build_now=False) == ["items_a_gin_idx"]
        assert _build(destination) == []
    assert _indexes(destination) == {} and _recorded(destination) == []
    messages = [record.getMessage() for record in caplog.records]
    assert f"{CONNECTOR}: the source's index by_c of items is not built on app.items: it lacks the column c" in messages
    assert any(message.startswith(f"{CONNECTOR}: the source's index app.items.items_a_gin_idx is left out: ")
               and "operator class" in message for message in messages)


def test_a_control_schema_of_before_takes_the_source_index_kind(destination):
    with destination.connect() as conn:
        conn.execute("ALTER TABLE cdc.deferred_constraints DROP CONSTRAINT deferred_constraints_kind_check, "
                     "ADD CONSTRAINT deferred_constraints_kind_check "
                     "CHECK (kind IN ('constraint', 'index', 'primary key'))")
        conn.execute("DROP TABLE cdc.control_version")  # made by a version that did not record itself
        control.ensure_control_schema(conn, "cdc")
    assert _plan(destination, [("items_ab_idx", AB)], build_now=False) == ["items_ab_idx"]
