"""The harness of the PostgreSQL-source tests: a logical-decoding source server per test module, and per test its
own source database, destination database and connector (the `pg_pipeline` fixture).

A test module uses them with `from pg_source_helpers import pg_pipeline, source_pg`.
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

from cdc_pipeline.testing.servers import PostgresServer, start_postgres

SOURCE_SCHEMA = "public"


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

    @property
    def source_dsn(self) -> str:
        return self.source_server.dsn(self.source_db)

    @property
    def dest_dsn(self) -> str:
        return self.destination.dsn(self.dest_db)

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
        from cdc_pipeline.ops.cli import run_sync

        return run_sync(self.name)

    def source_rows(self, table: str) -> list[tuple]:
        return _rows(self.source_dsn, table)

    def dest_rows(self, table: str) -> list[tuple]:
        return _rows(self.dest_dsn, table)

    def dest_columns(self, table: str) -> dict[str, str]:
        with psycopg.connect(self.dest_dsn) as conn:
            rows = conn.execute(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                (f"{SOURCE_SCHEMA}.{table}",)).fetchall()
        return dict(rows)

    def dest_primary_key(self, table: str) -> list[str]:
        with psycopg.connect(self.dest_dsn) as conn:
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
    monkeypatch.setenv("TEST_DEST_DSN", pipe.dest_dsn)
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
    return pipe
