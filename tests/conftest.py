"""Test harness: real throwaway servers (MariaDB with row binlog, destination PostgreSQL) for the session,
and per test its own source database, destination database and connector, so tests never see each other.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import psycopg
import pytest
import yaml
from psycopg import sql

from cdc_pipeline import faults
from cdc_pipeline.capture.runner import build_runner
from cdc_pipeline.testing.servers import MariaDbServer, PostgresServer, start_mariadb, start_postgres

CAPTURE_USER = "dbz"
CAPTURE_PASSWORD = "capture-secret-7f3a"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
PAUSE_DEADLINE_SECONDS = 240


def start_sync(name: str, *args: str, env: dict[str, str] | None = None, **popen: Any) -> subprocess.Popen:
    """Starts `cdc-pipeline sync NAME` in its own process group (so a test can kill all of it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "cdc_pipeline.ops.cli", "sync", name, *args],
        cwd=PROJECT_ROOT, env={**os.environ, **(env or {})}, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def kill_when(name: str, ready: Callable[[], bool], what: str, env: dict[str, str] | None = None) -> None:
    """Runs `cdc-pipeline sync NAME` until `ready()` holds, then kills its process group with SIGKILL."""
    run = start_sync(name, env=env)
    deadline = time.monotonic() + PAUSE_DEADLINE_SECONDS
    try:
        while not ready():
            assert run.poll() is None, f"the run ended before {what}: {run.communicate()}"
            assert time.monotonic() < deadline, f"the run did not reach {what} within {PAUSE_DEADLINE_SECONDS} s"
            time.sleep(0.05)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()


def kill_at(name: str, pause_at: str, marker: Path, env: dict[str, str] | None = None) -> None:
    """Runs `cdc-pipeline sync NAME` until it pauses at `pause_at` (see cdc_pipeline/faults.py), then kills its
    process group with SIGKILL."""
    kill_when(name, marker.exists, f"pausing at {pause_at}",
              env={**(env or {}), faults.PAUSE_AT_ENV: pause_at, faults.PAUSE_FILE_ENV: str(marker)})
    assert marker.read_text() == pause_at.partition("@")[0]


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDbServer]:
    server = start_mariadb()
    try:
        server.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def destination_pg() -> Iterator[PostgresServer]:
    server = start_postgres()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def spark():
    from cdc_pipeline.capture.spark import build_spark_session

    build_runner()
    return build_spark_session()


def connector_stats(dest_dsn: str, connector: str, columns: Sequence[str]) -> dict[str, int]:
    """These counts of the connector's row of cdc.stats (zeros before the first run made it)."""
    with psycopg.connect(dest_dsn) as conn:
        if not conn.execute("SELECT to_regclass('cdc.stats') IS NOT NULL").fetchone()[0]:
            return dict.fromkeys(columns, 0)
        query = sql.SQL("SELECT {} FROM cdc.stats WHERE connector = %s").format(
            sql.SQL(", ").join(map(sql.Identifier, columns)))
        row = conn.execute(query, (connector,)).fetchone()
    return dict(zip(columns, map(int, row))) if row else dict.fromkeys(columns, 0)


@dataclass
class Pipeline:
    """One test's connector: its source database, destination database and connectors file."""

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

    def source(self, statements: str | list[str]) -> None:
        self.mariadb.execute(statements, database=self.source_db)

    def source_rows(self, table: str) -> list[tuple]:
        return self.mariadb.query(f"SELECT * FROM `{table}` ORDER BY 1, 2", database=self.source_db)

    def dest_rows(self, table: str, schema: str | None = None) -> list[tuple]:
        with psycopg.connect(self.dest_dsn) as conn:
            query = sql.SQL("SELECT * FROM {} ORDER BY 1, 2").format(sql.Identifier(schema or self.source_db, table))
            return conn.execute(query).fetchall()

    def dest_query(self, query: str, params: Any = None) -> list[tuple]:
        with psycopg.connect(self.dest_dsn) as conn:
            return conn.execute(query, params).fetchall()

    def source_changes(self, statements: list[str]) -> list[int]:
        """Runs the statements on the source; returns the rows each changed, as MariaDB counts them."""
        with self.mariadb.connect(self.source_db) as connection, connection.cursor() as cursor:
            return [cursor.execute(statement) for statement in statements]

    def stats(self, columns: Sequence[str]) -> dict[str, int]:
        return connector_stats(self.dest_dsn, self.name, columns)

    def dest_table_exists(self, table: str) -> bool:
        return self.dest_query("SELECT to_regclass(%s) IS NOT NULL",
                               (f'"{self.source_db}"."{table}"',))[0][0]

    def assert_same(self, *tables: str) -> None:
        for table in tables:
            source, dest = self.source_rows(table), self.dest_rows(table)
            assert dest == source, f"table {table}: destination differs from source"

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
            "batch_size": 2048,
            **overrides,
        }
        document = {"destination": {"dsn": "${TEST_DEST_DSN}", "control_schema": "cdc", **(destination or {})},
                    "connectors": {self.name: connector}}
        if spark is not None:
            document["spark"] = spark
        self.config_path.write_text(yaml.safe_dump(document, sort_keys=False))


@pytest.fixture
def pipeline(mariadb: MariaDbServer, destination_pg: PostgresServer, spark, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    return new_pipeline(mariadb, destination_pg, tmp_path, monkeypatch)


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
