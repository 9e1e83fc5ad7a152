"""End to end from a PostgreSQL source: pgoutput -> Debezium runner -> Spark -> PostgreSQL.

PostgreSQL emits no DDL events, so the destination table is created, and later altered, from the value
schemas of the data changes; the tests compare full table contents read through each side's driver.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest
import yaml
from psycopg import sql

from cdc_pipeline.servers import PostgresServer, start_postgres

pytestmark = pytest.mark.integration

SOURCE_SCHEMA = "public"
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


@pytest.fixture(scope="module")
def source_pg() -> Iterator[PostgresServer]:
    server = start_postgres(logical=True)
    try:
        yield server
    finally:
        server.stop()


@dataclass
class PostgresPipeline:
    """One test's connector: a source database on the logical-decoding server and its destination database."""

    source_server: PostgresServer
    destination: PostgresServer
    name: str
    source_db: str
    dest_db: str
    config_path: Path

    def write_config(self, **overrides: Any) -> None:
        connector = {
            "type": "postgres",
            "hostname": self.source_server.host,
            "port": self.source_server.port,
            "user": self.source_server.superuser,
            "password": "${TEST_SOURCE_PASSWORD}",
            "database": self.source_db,
            "tables": [f"{SOURCE_SCHEMA}.items"],
            "idle_timeout_seconds": 2,
            **overrides,
        }
        document = {"destination": {"dsn": "${TEST_DEST_DSN}", "control_schema": "cdc"},
                    "connectors": {self.name: connector}}
        self.config_path.write_text(yaml.safe_dump(document, sort_keys=False))

    def source(self, statements: str | list[str]) -> None:
        self.source_server.execute(statements, dbname=self.source_db)

    def sync(self) -> dict[str, Any]:
        from cdc_pipeline.cli import run_sync

        return run_sync(self.name)

    def source_rows(self, table: str) -> list[tuple]:
        return _rows(self.source_server.dsn(self.source_db), table)

    def dest_rows(self, table: str) -> list[tuple]:
        return _rows(self.destination.dsn(self.dest_db), table)

    def dest_columns(self, table: str) -> dict[str, str]:
        with psycopg.connect(self.destination.dsn(self.dest_db)) as conn:
            rows = conn.execute(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                (f"{SOURCE_SCHEMA}.{table}",)).fetchall()
        return dict(rows)

    def dest_primary_key(self, table: str) -> list[str]:
        with psycopg.connect(self.destination.dsn(self.dest_db)) as conn:
            rows = conn.execute(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary",
                (f"{SOURCE_SCHEMA}.{table}",)).fetchall()
        return [name for (name,) in rows]

    def assert_same(self, table: str) -> None:
        source, dest = self.source_rows(table), self.dest_rows(table)
        assert len(source) > 0
        assert dest == source, f"table {table}: destination differs from source"


def _rows(dsn: str, table: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        query = sql.SQL("SELECT * FROM {} ORDER BY 1").format(sql.Identifier(SOURCE_SCHEMA, table))
        return conn.execute(query).fetchall()


@pytest.fixture
def pg_pipeline(source_pg: PostgresServer, destination_pg: PostgresServer, spark, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> PostgresPipeline:
    suffix = uuid.uuid4().hex[:8]
    pipe = PostgresPipeline(source_pg, destination_pg, name=f"p_{suffix}", source_db=f"src_{suffix}",
                            dest_db=f"dst_{suffix}", config_path=tmp_path / "connectors.yaml")
    source_pg.create_database(pipe.source_db)
    destination_pg.create_database(pipe.dest_db)
    pipe.write_config()
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("CDC_PIPELINE_CONFIG", str(pipe.config_path))
    monkeypatch.setenv("TEST_SOURCE_PASSWORD", "unused-with-trust-auth")
    monkeypatch.setenv("TEST_DEST_DSN", destination_pg.dsn(pipe.dest_db))
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
    return pipe


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


def test_table_without_key_is_created_without_primary_key_and_changes_apply_row_by_row(pg_pipeline):
    pg_pipeline.write_config(tables=[f"{SOURCE_SCHEMA}.notes"])
    pg_pipeline.source([
        "CREATE TABLE notes (n integer, body text)",
        "ALTER TABLE notes REPLICA IDENTITY FULL",
        "INSERT INTO notes SELECT i, 'note ' || i FROM generate_series(1, 20) AS i",
    ])

    pg_pipeline.sync()

    assert pg_pipeline.dest_columns("notes") == {"n": "integer", "body": "text"}
    assert pg_pipeline.dest_primary_key("notes") == []
    pg_pipeline.assert_same("notes")

    pg_pipeline.source([
        "INSERT INTO notes VALUES (21, 'late'), (22, NULL)",
        "UPDATE notes SET body = 'changed' WHERE n IN (3, 21)",
        "DELETE FROM notes WHERE n BETWEEN 5 AND 7",
    ])

    pg_pipeline.sync()

    pg_pipeline.assert_same("notes")
