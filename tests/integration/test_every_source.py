"""Behaviour every source type must share, each test body run against a MariaDB and a PostgreSQL connector (the
`any_source` fixture), as Debezium's JDBC sink runs one schema-evolution test per database. The SQL is what both
sources read alike; where they differ (a keyless table's replica identity, LIMIT in an UPDATE) the connector says
how (`keyless`, `limited`)."""

from __future__ import annotations

from collections import Counter

import pytest

pytestmark = pytest.mark.integration

STATS = ("snapshot_rows", "inserts", "updates", "deletes")


def test_a_keyless_table_is_created_without_a_key_and_each_change_touches_one_matching_row(any_source):
    source = any_source
    source.write_config(tables=[source.table_id("events_log")])
    source.source(["CREATE TABLE events_log (kind VARCHAR(10), amount INT)", *source.keyless("events_log"),
                   "INSERT INTO events_log VALUES ('a', 1), ('a', 1), ('b', 2), ('b', 2)"])
    source.sync()

    assert source.dest_columns("events_log") == {"kind": "character varying(10)", "amount": "integer"}
    assert source.dest_primary_key("events_log") == []

    source.source([f"UPDATE events_log SET amount = 5 {source.limited('events_log', 'kind = ' + repr('a'), 1)}",
                   f"DELETE FROM events_log {source.limited('events_log', 'kind = ' + repr('b'), 1)}",
                   "INSERT INTO events_log VALUES ('c', 3), ('c', 3), (NULL, NULL)"])
    source.sync()

    assert Counter(source.dest_rows("events_log")) == Counter(source.source_rows("events_log")) == Counter(
        [("a", 5), ("a", 1), ("b", 2), ("c", 3), ("c", 3), (None, None)])


def test_changes_to_rows_inserted_in_the_same_backlog_keep_source_order(any_source):
    source = any_source
    source.write_config(tables=[source.table_id("items")])
    source.source("CREATE TABLE items (id INT PRIMARY KEY, v VARCHAR(20))")
    source.sync()
    statements = []
    for i in range(1, 301):
        statements.append(f"INSERT INTO items VALUES ({i}, 'inserted')")
        if i % 3 == 0:
            statements.append(f"UPDATE items SET v = 'updated {i}' WHERE id = {i}")
        if i % 5 == 0:
            statements.append(f"DELETE FROM items WHERE id = {i}")
        if i % 7 == 0:
            statements.append(f"UPDATE items SET id = {i + 1000} WHERE id = {i}")
    source.source(statements)
    source.write_config(tables=[source.table_id("items")], batch_size=64, apply_batch_events=64)

    summary = source.sync()

    assert summary["batches"] > 5
    source.assert_same("items")


def test_a_second_run_applies_only_the_changes_made_since_the_first(any_source):
    source = any_source
    source.write_config(tables=[source.table_id("customers"), source.table_id("products")])
    source.source([
        "CREATE TABLE customers (id INT PRIMARY KEY, email VARCHAR(40))",
        "CREATE TABLE products (sku VARCHAR(20) PRIMARY KEY, title VARCHAR(40), price DECIMAL(30,10), stock BIGINT)",
        "INSERT INTO customers VALUES " + ", ".join(f"({i}, 'c{i}@example.com')" for i in range(1, 11)),
        "INSERT INTO products VALUES " + ", ".join(f"('SKU-{i:04d}', 'product {i}', {i}.0123456789, {i * 1000})"
                                                   for i in range(1, 6)),
    ])
    first = source.sync()
    assert first["snapshot_rows"] == 15

    source.source(["INSERT INTO products VALUES ('SKU-0100', 'late', 1.5, 7)",
                   "UPDATE customers SET email = 'changed@example.com' WHERE id = 3",
                   "DELETE FROM customers WHERE id = 4"])
    second = source.sync()

    assert (second["snapshot_rows"], second["inserts"], second["updates"], second["deletes"]) == (0, 1, 1, 1)
    assert second["events"] == 3
    source.assert_same("customers", "products")

    third = source.sync()

    assert third["events"] == 0
    assert source.stats(STATS) == {"snapshot_rows": 15, "inserts": 1, "updates": 1, "deletes": 1}
