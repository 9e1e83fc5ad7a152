"""A MariaDB-source connector of one test: its own source database, destination database and connectors file."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg import sql

from cdc_pipeline.testing.servers import MariaDbServer, PostgresServer
from tests.helpers.destination import DestinationChecks
from tests.helpers.runs import start_sync

CAPTURE_USER = "dbz"
CAPTURE_PASSWORD = "capture-secret-7f3a"


@dataclass
class Pipeline(DestinationChecks):
    """One test's MariaDB connector: its source database, destination database and connectors file."""

    mariadb: MariaDbServer
    destination: PostgresServer
    name: str
    source_db: str
    dest_db: str
    config_path: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def dest_dsn(self) -> str:
        return self.destination.dsn(self.dest_db)

    @property
    def dest_schema(self) -> str:
        return self.source_db

    def table_id(self, table: str) -> str:
        """The table as the connectors file's `tables` names it."""
        return f"{self.source_db}.{table}"

    def keyless(self, table: str) -> list[str]:
        """The statements that make a keyless table's updates and deletes carry whole rows (none: row binlog)."""
        return []

    def numbers(self, count: int) -> str:
        """A FROM item of the integers 1..count in a column `seq`."""
        return f"seq_1_to_{count}"

    def limited(self, table: str, where: str, limit: int) -> str:
        """The WHERE clause of an UPDATE or DELETE that touches `limit` of the rows matching `where`."""
        return f"WHERE {where} LIMIT {limit}"

    def source(self, statements: str | list[str]) -> None:
        self.mariadb.execute(statements, database=self.source_db)

    def source_rows(self, table: str) -> list[tuple]:
        return self.mariadb.query(f"SELECT * FROM `{table}` ORDER BY 1, 2", database=self.source_db)

    def dest_rows(self, table: str, schema: str | None = None) -> list[tuple]:
        with psycopg.connect(self.dest_dsn) as conn:
            query = sql.SQL("SELECT * FROM {} ORDER BY 1, 2").format(sql.Identifier(schema or self.source_db, table))
            return conn.execute(query).fetchall()

    def source_changes(self, statements: list[str]) -> list[int]:
        """Runs the statements on the source; returns the rows each changed, as MariaDB counts them."""
        with self.mariadb.connect(self.source_db) as connection, connection.cursor() as cursor:
            return [cursor.execute(statement) for statement in statements]

    def assert_same(self, *tables: str) -> None:
        for table in tables:
            source, dest = self.source_rows(table), self.dest_rows(table)
            assert dest == source, f"table {table}: destination differs from source"

    def purge_binlogs(self) -> str:
        """Purges every binlog file but a new one (`PURGE BINARY LOGS TO` the newest); returns its name. MariaDB keeps
        a file until its binlog checkpoint moved past it (a commit in the next file), so this commits and tries
        again for a while."""
        self.mariadb.execute("FLUSH BINARY LOGS")
        newest = self.mariadb.query("SHOW BINARY LOGS")[-1][0]
        for _ in range(50):
            self.source("CREATE TABLE IF NOT EXISTS checkpoint_nudge (n INT)")
            self.mariadb.execute(f"PURGE BINARY LOGS TO '{newest}'")
            if [row[0] for row in self.mariadb.query("SHOW BINARY LOGS")][0] == newest:
                return newest
            time.sleep(0.2)
        pytest.fail(f"MariaDB kept the binlog files before {newest}")

    def sync(self) -> dict[str, Any]:
        from cdc_pipeline.ops.cli import run_sync

        return run_sync(self.name)

    def catch_up(self, keyed: str, keyless: str, runs: int = 3) -> None:
        """Syncs (a few runs at most) until the keyless table holds the source's rows, duplicates included; then
        asserts both tables equal the source's."""
        for _ in range(runs):
            self.sync()
            if Counter(self.dest_rows(keyless)) == Counter(self.source_rows(keyless)):
                break
        self.assert_same(keyed)
        assert Counter(self.dest_rows(keyless)) == Counter(self.source_rows(keyless)), f"table {keyless} differs"

    def sync_cli(self, *args: str, **popen: Any) -> subprocess.Popen:
        """Starts `cdc-pipeline sync NAME` in its own process group (so a test can kill all of it)."""
        return start_sync(self.name, *args, env=self.env, **popen)

    def write_config(self, destination: dict[str, Any] | None = None, spark: dict[str, Any] | None = None,
                     **overrides: Any) -> None:
        connector = {
            "type": "mariadb",
            "hostname": "127.0.0.1",
            "port": self.mariadb.port,
            "user": CAPTURE_USER,
            "password": "${TEST_SOURCE_PASSWORD}",
            "database": self.source_db,
            "idle_timeout_seconds": 2,
            "linger_seconds": 0,  # Dagster runs end caught up, as syncs do (tests/integration/test_linger.py lingers)
            "batch_size": 2048,
            **overrides,
        }
        document = {"destination": {"dsn": "${TEST_DEST_DSN}", "control_schema": "cdc", **(destination or {})},
                    "connectors": {self.name: connector}}
        if spark is not None:
            document["spark"] = spark
        self.config_path.write_text(yaml.safe_dump(document, sort_keys=False))


def new_pipeline(mariadb: MariaDbServer, destination_pg: PostgresServer, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    """A connector with its own source and destination databases, its environment set through `monkeypatch`."""
    suffix = uuid.uuid4().hex[:8]
    pipe = Pipeline(mariadb, destination_pg, name=f"c_{suffix}", source_db=f"src_{suffix}",
                    dest_db=f"dst_{suffix}", config_path=tmp_path / "connectors.yaml")
    mariadb.execute(f"CREATE DATABASE `{pipe.source_db}`")
    destination_pg.create_database(pipe.dest_db)
    pipe.write_config()
    pipe.env = {
        "CDC_PIPELINE_CONFIG": str(pipe.config_path),
        "TEST_SOURCE_PASSWORD": CAPTURE_PASSWORD,
        "TEST_DEST_DSN": pipe.dest_dsn,
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
    }
    (tmp_path / "dagster_home").mkdir()
    (tmp_path / "dagster_home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    for key, value in pipe.env.items():
        monkeypatch.setenv(key, value)
    return pipe
