"""End to end from a PostgreSQL source: pgoutput -> Debezium runner -> Spark -> PostgreSQL.

PostgreSQL emits no DDL events, so the destination table is created, and later altered, from the value
schemas of the data changes; the tests compare full table contents read through each side's driver.
"""

from __future__ import annotations

import psycopg
import pytest

pytestmark = pytest.mark.integration

ITEMS = """CREATE TABLE items (
    id integer PRIMARY KEY,
    name text NOT NULL,
    price numeric(12,2),
    ratio numeric,
    happened timestamptz,
    born date,
    active boolean,
    doc jsonb,
    payload bytea,
    code varchar(20),
    seen timestamp(3))"""
ITEMS_TYPES = {
    "id": "integer",
    "name": "text",
    "price": "numeric(12,2)",
    "ratio": "numeric",
    "happened": "timestamp(6) with time zone",
    "born": "date",
    "active": "boolean",
    "doc": "jsonb",
    "payload": "bytea",
    "code": "character varying(20)",
    "seen": "timestamp(3) without time zone",
}


def _item(i: int) -> str:
    return (f"({i}, 'item {i} ✓', {i * 10}.{i % 100:02d}, {i}.{'0' * (i % 5)}{i}123456789012345678901234567890, "
            f"'2024-03-{1 + i % 28:02d} 10:{i % 60:02d}:00.{i:06d}+0{i % 9}', "
            f"'19{50 + i % 50}-0{1 + i % 9}-1{i % 10}', "
            f"{'true' if i % 2 else 'false'}, '{{\"n\": {i}, \"tags\": [\"a\", \"b\"], \"nested\": {{\"x\": null}}}}', "
            f"'\\x{i:02x}00ff', 'C-{i:03d}', '2023-0{1 + i % 9}-02 03:04:05.{i % 1000:03d}')")


def test_snapshot_streaming_and_columns_added_and_dropped_in_the_source(pg_pipeline):
    pg_pipeline.source([ITEMS, "INSERT INTO items VALUES " + ", ".join(_item(i) for i in range(1, 31))])

    summary = pg_pipeline.sync()

    assert summary["snapshot_rows"] == 30
    assert pg_pipeline.dest_columns("items") == ITEMS_TYPES
    assert pg_pipeline.dest_primary_key("items") == ["id"]
    pg_pipeline.assert_same("items")

    pg_pipeline.source([
        "INSERT INTO items VALUES " + ", ".join(_item(i) for i in range(31, 36)),
        "INSERT INTO items (id, name) VALUES (100, 'nulls everywhere')",
        "UPDATE items SET price = -0.01, ratio = 0.000000000000000000001, doc = '[]', payload = NULL, "
        "happened = '1999-12-31 23:59:59.999999+00', active = NULL WHERE id <= 5",
        "DELETE FROM items WHERE id BETWEEN 10 AND 14",
        "UPDATE items SET name = 'renamed' WHERE id = 31",
    ])

    summary = pg_pipeline.sync()

    assert (summary["inserts"], summary["updates"], summary["deletes"]) == (6, 6, 5)
    pg_pipeline.assert_same("items")

    pg_pipeline.source([
        "ALTER TABLE items ADD COLUMN extra text",
        "INSERT INTO items (id, name, extra) VALUES (200, 'with extra', 'extra value')",
        "UPDATE items SET extra = 'set later' WHERE id IN (1, 2)",
    ])

    pg_pipeline.sync()

    assert pg_pipeline.dest_columns("items") == {**ITEMS_TYPES, "extra": "text"}
    pg_pipeline.assert_same("items")

    pg_pipeline.source([
        "ALTER TABLE items DROP COLUMN extra",
        "INSERT INTO items (id, name, price) VALUES (300, 'after the drop', 3.00)",
    ])

    pg_pipeline.sync()

    assert pg_pipeline.dest_columns("items") == ITEMS_TYPES
    pg_pipeline.assert_same("items")


def test_a_destination_column_retyped_by_its_owner_keeps_its_type(pg_pipeline):
    pg_pipeline.source([ITEMS, "INSERT INTO items VALUES " + ", ".join(_item(i) for i in range(1, 6))])
    pg_pipeline.sync()
    with psycopg.connect(pg_pipeline.dest_dsn, autocommit=True) as conn:
        conn.execute("CREATE DOMAIN public.item_code AS varchar(40) CHECK (VALUE LIKE 'C-%')")
        conn.execute("ALTER TABLE public.items ALTER COLUMN code TYPE public.item_code")

    pg_pipeline.source([
        "INSERT INTO items VALUES " + ", ".join(_item(i) for i in range(6, 9)),
        "UPDATE items SET code = 'C-new', name = 'changed' WHERE id = 2",
        "ALTER TABLE items ADD COLUMN extra text",
        "INSERT INTO items (id, name, code, extra) VALUES (50, 'with extra', 'C-050', 'x')",
    ])

    pg_pipeline.sync()

    columns = pg_pipeline.dest_columns("items")
    assert columns["code"] == "item_code", "the column keeps the type its owner chose"
    assert columns["extra"] == "text", "other columns still follow the source"
    pg_pipeline.assert_same("items")


def test_a_query_on_a_locked_source_table_ends_after_the_source_lock_timeout(pg_pipeline):
    import time

    from cdc_pipeline.config import load_config
    from cdc_pipeline.ops.row_counts import compare_row_counts

    pg_pipeline.write_config(source_lock_timeout_seconds=1)
    pg_pipeline.source(["CREATE TABLE items (id integer PRIMARY KEY)", "INSERT INTO items VALUES (1)"])
    config = load_config(pg_pipeline.config_path)
    with psycopg.connect(pg_pipeline.source_dsn) as locker:
        locker.execute("LOCK TABLE items IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        with pytest.raises(psycopg.errors.LockNotAvailable, match="lock timeout"):
            compare_row_counts(config.connector(pg_pipeline.name), config.destination)
        waited = time.monotonic() - started
    assert waited < 30, f"the count waited {waited:.0f} s on the lock"
