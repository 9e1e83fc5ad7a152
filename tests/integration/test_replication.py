"""End to end against real servers: MariaDB -> Debezium runner -> Spark -> PostgreSQL through the Dagster job."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

CUSTOMERS = """CREATE TABLE customers (
    id INT PRIMARY KEY AUTO_INCREMENT,
    name VARCHAR(100) NOT NULL,
    email VARCHAR(200),
    balance DECIMAL(12,2),
    born DATE,
    created_at DATETIME(6),
    note TEXT)"""
PRODUCTS = """CREATE TABLE products (
    sku VARCHAR(20) NOT NULL,
    title TEXT,
    price DECIMAL(30,10),
    stock BIGINT,
    PRIMARY KEY (sku))"""


def _customer(i: int) -> str:
    return (f"('customer {i}', 'c{i}@example.com', {i * 10}.{i % 100:02d}, '19{50 + i % 50}-0{1 + i % 9}-1{i % 10}', "
            f"'2024-01-{1 + i % 28:02d} 10:{i % 60:02d}:00.{i:06d}', 'line one\\nline\\ttwo {i} \\\\ ✓ 😀')")


def _seed(pipeline, customers: int = 40, products: int = 30) -> None:
    pipeline.source([CUSTOMERS, PRODUCTS])
    pipeline.source("INSERT INTO customers (name, email, balance, born, created_at, note) VALUES "
                    + ", ".join(_customer(i) for i in range(1, customers + 1)))
    pipeline.source("INSERT INTO products VALUES "
                    + ", ".join(f"('SKU-{i:04d}', 'product {i}', {i}.0123456789, {i * 1000})"
                                for i in range(1, products + 1)))


def test_snapshot_then_streaming_inserts_updates_deletes_create_and_drop(pipeline):
    _seed(pipeline)

    summary = pipeline.sync()

    assert summary["snapshot_rows"] == 70
    assert summary["ddls"] == 2
    pipeline.assert_same("customers", "products")
    columns = dict(pipeline.dest_query(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s "
        "AND table_name = 'customers'", (pipeline.source_db,)))
    assert columns["balance"] == "numeric" and columns["born"] == "date"
    assert columns["created_at"] == "timestamp without time zone"
    key = pipeline.dest_query(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = %s::regclass AND i.indisprimary", (f'"{pipeline.source_db}"."products"',))
    assert key == [("sku",)]

    pipeline.source([
        "INSERT INTO customers (name, email, balance) VALUES ('new one', NULL, -5.50), ('new two', '', 0)",
        "UPDATE customers SET balance = balance + 1, note = NULL WHERE id <= 10",
        "DELETE FROM customers WHERE id BETWEEN 11 AND 15",
        "UPDATE products SET price = 99999999999999999999.9999999999 WHERE sku = 'SKU-0001'",
        "DELETE FROM products WHERE sku IN ('SKU-0002', 'SKU-0003')",
        "INSERT INTO products VALUES ('SKU-9999', NULL, NULL, NULL)",
        "CREATE TABLE orders (order_id BIGINT PRIMARY KEY, customer_id INT, total DECIMAL(10,2), placed DATE)",
        "INSERT INTO orders VALUES (1, 1, 10.00, '2024-05-01'), (2, 2, 20.50, '2024-05-02'), (3, 1, 0.01, NULL)",
        "UPDATE orders SET total = 11.00 WHERE order_id = 1",
        "DELETE FROM orders WHERE order_id = 3",
    ])

    summary = pipeline.sync()

    assert (summary["inserts"], summary["updates"], summary["deletes"], summary["ddls"]) == (6, 12, 8, 1)
    pipeline.assert_same("customers", "products", "orders")

    pipeline.source("DROP TABLE products")
    summary = pipeline.sync()

    assert summary["ddls"] == 1
    assert not pipeline.dest_table_exists("products")
    pipeline.assert_same("customers", "orders")


def test_tables_outside_the_connector_never_reach_the_destination(pipeline):
    other = f"{pipeline.source_db}_other"
    pipeline.mariadb.execute([f"CREATE DATABASE `{other}`", f"CREATE TABLE `{other}`.foreign_t (id INT PRIMARY KEY)",
                              f"INSERT INTO `{other}`.foreign_t VALUES (1)"])
    pipeline.source(["CREATE TABLE wanted (id INT PRIMARY KEY, v INT)", "CREATE TABLE unwanted (id INT PRIMARY KEY)",
                     "INSERT INTO wanted VALUES (1, 1)", "INSERT INTO unwanted VALUES (1)"])
    pipeline.write_config(tables=[f"{pipeline.source_db}.wanted"])

    pipeline.sync()
    pipeline.mariadb.execute([f"CREATE TABLE `{other}`.foreign_2 (id INT PRIMARY KEY)",
                              f"INSERT INTO `{other}`.foreign_t VALUES (2)"])
    pipeline.source(["ALTER TABLE unwanted ADD COLUMN extra INT", "INSERT INTO unwanted VALUES (2, 2)",
                     "INSERT INTO wanted VALUES (2, 2)"])
    pipeline.sync()

    pipeline.assert_same("wanted")
    assert not pipeline.dest_table_exists("unwanted")
    schemas = {row[0] for row in pipeline.dest_query("SELECT nspname FROM pg_namespace")}
    assert other not in schemas


def test_keys_changed_many_times_in_one_group_end_as_their_last_change(pipeline, caplog):
    """The destination keeps each key's last change of a group (`_drop_superseded`): updates, a delete and a
    re-insert, a primary-key update (a delete and a create), on a composite key too, all in one group."""
    pipeline.source(["CREATE TABLE hot (id INT PRIMARY KEY, n INT, s VARCHAR(20))",
                     "CREATE TABLE pairs (a INT, b VARCHAR(5), v INT, PRIMARY KEY (a, b))",
                     "INSERT INTO hot VALUES (1, 0, 'a'), (2, 0, 'b'), (4, 0, 'd')",
                     "INSERT INTO pairs VALUES (1, 'x', 0), (1, 'y', 0)"])
    pipeline.sync()

    pipeline.source([*(f"UPDATE hot SET n = {i} WHERE id = 1" for i in range(1, 30)),
                     "DELETE FROM hot WHERE id = 2", "INSERT INTO hot VALUES (2, 7, 'again')",
                     "UPDATE hot SET id = 3 WHERE id = 2", "INSERT INTO hot VALUES (2, 8, 'third')",
                     "DELETE FROM hot WHERE id = 1", "INSERT INTO hot VALUES (1, 99, 'back')",
                     "UPDATE hot SET n = 100 WHERE id = 1", "UPDATE hot SET n = 1 WHERE id = 4",
                     "DELETE FROM hot WHERE id = 4",
                     *(f"UPDATE pairs SET v = {i} WHERE a = 1" for i in range(1, 10)),
                     "UPDATE pairs SET b = 'z' WHERE b = 'y'", "INSERT INTO pairs VALUES (1, 'y', 5)"])
    with caplog.at_level("INFO", logger="cdc_pipeline.sink"):
        pipeline.sync()

    assert pipeline.dest_rows("hot") == [(1, 100, "back"), (2, 8, "third"), (3, 7, "again")]
    pipeline.assert_same("hot", "pairs")
    # The merge took the staged rows as they were: no key's changes reached it twice (which PostgreSQL refuses, and
    # the driver's fallback would have hidden).
    assert not [record for record in caplog.records if "through the driver" in record.getMessage()]
