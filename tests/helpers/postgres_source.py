"""A PostgreSQL-source connector of one test: its own database on the logical-decoding source server (the
`source_pg` fixture, one per test module), its destination database and connectors file (the `pg_pipeline`
fixture)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg import sql

from cdc_pipeline.testing.servers import PostgresServer
from tests.helpers.destination import DestinationChecks

SOURCE_SCHEMA = "public"


@dataclass
class PostgresPipeline(DestinationChecks):
    """One test's PostgreSQL connector: a source database on the logical-decoding server and its destination
    database. Its source tables are in `public`, as are their destination tables."""

    source_server: PostgresServer
    destination: PostgresServer
    name: str
    source_db: str
    dest_db: str
    config_path: Path
    dest_schema = SOURCE_SCHEMA
    env: dict[str, str] = field(default_factory=dict)  # what the test's environment sets (a server's, a process's)

    @property
    def source_dsn(self) -> str:
        return self.source_server.dsn(self.source_db)

    @property
    def dest_dsn(self) -> str:
        return self.destination.dsn(self.dest_db)

    def write_config(self, spark: dict[str, Any] | None = None, **overrides: Any) -> None:
        connector = {
            "type": "postgres",
            "hostname": self.source_server.host,
            "port": self.source_server.port,
            "user": self.source_server.superuser,
            "password": "${TEST_SOURCE_PASSWORD}",
            "database": self.source_db,
            "tables": [f"{SOURCE_SCHEMA}.items"],
            "idle_timeout_seconds": 2,
            "linger_seconds": 0,  # Dagster runs end caught up, as syncs do (tests/integration/test_linger.py lingers)
            **overrides,
        }
        document: dict[str, Any] = {"destination": {"dsn": "${TEST_DEST_DSN}", "control_schema": "cdc"},
                                    "connectors": {self.name: connector}}
        if spark is not None:
            document["spark"] = spark
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

    def assert_same(self, *tables: str) -> None:
        for table in tables:
            source, dest = self.source_rows(table), self.dest_rows(table)
            assert len(source) > 0
            assert dest == source, f"table {table}: destination differs from source"

    def source_changes(self, statements: list[str]) -> list[int]:
        """Runs the statements on the source; returns the rows each changed."""
        with psycopg.connect(self.source_dsn, autocommit=True) as conn:
            return [conn.execute(statement).rowcount for statement in statements]

    def table_id(self, table: str) -> str:
        """The table as the connectors file's `tables` names it."""
        return f"{SOURCE_SCHEMA}.{table}"

    def keyless(self, table: str) -> list[str]:
        """The statements that make a keyless table's updates and deletes carry whole rows."""
        return [f"ALTER TABLE {table} REPLICA IDENTITY FULL"]

    def numbers(self, count: int) -> str:
        """A FROM item of the integers 1..count in a column `seq`."""
        return f"generate_series(1, {count}) AS seq"

    def limited(self, table: str, where: str, limit: int) -> str:
        """The WHERE clause of an UPDATE or DELETE that touches `limit` of the rows matching `where`."""
        return f"WHERE ctid IN (SELECT ctid FROM {table} WHERE {where} LIMIT {limit})"


def _rows(dsn: str, table: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        query = sql.SQL("SELECT * FROM {} ORDER BY 1").format(sql.Identifier(SOURCE_SCHEMA, table))
        return conn.execute(query).fetchall()


def new_pg_pipeline(source_pg: PostgresServer, destination_pg: PostgresServer, tmp_path: Path,
                    monkeypatch: pytest.MonkeyPatch) -> PostgresPipeline:
    """A connector with its own source and destination databases, its environment set through `monkeypatch`."""
    suffix = uuid.uuid4().hex[:8]
    pipe = PostgresPipeline(source_pg, destination_pg, name=f"p_{suffix}", source_db=f"src_{suffix}",
                            dest_db=f"dst_{suffix}", config_path=tmp_path / "connectors.yaml")
    source_pg.create_database(pipe.source_db)
    destination_pg.create_database(pipe.dest_db)
    pipe.write_config()
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    pipe.env = {"CDC_PIPELINE_CONFIG": str(pipe.config_path), "TEST_SOURCE_PASSWORD": "unused-with-trust-auth",
                "TEST_DEST_DSN": pipe.dest_dsn, "DAGSTER_HOME": str(dagster_home)}
    for key, value in pipe.env.items():
        monkeypatch.setenv(key, value)
    return pipe
