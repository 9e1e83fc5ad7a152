"""Test harness: real throwaway servers (MariaDB with row binlog, a logical-decoding PostgreSQL source, the
destination PostgreSQL) and per test its own source database, destination database and connector, so tests never
see each other. The classes and helpers live in `tests/helpers/`; this file holds the fixtures.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from cdc_pipeline.capture.runner import build_runner
from cdc_pipeline.config import SPARK_MASTER_ENV
from cdc_pipeline.ops.auto_server import AUTO_SERVE_ENV
from cdc_pipeline.testing.servers import MariaDbServer, PostgresServer, start_mariadb, start_postgres
from tests.helpers.mariadb_source import CAPTURE_PASSWORD, CAPTURE_USER, Pipeline, new_pipeline
from tests.helpers.postgres_source import PostgresPipeline, new_pg_pipeline

# Every run of the suite, in its process and in the `sync` processes it starts, has two cores, CI's: a bulk load's
# slice is four rounds of the cores, and the tests' counts of chunks per run, and of writes that land during a load,
# are written for two. A test of a cluster names its own master.
os.environ.setdefault(SPARK_MASTER_ENV, "local[2]")
# Dagster's runs in the tests go cold, each in its own process, unless a test starts a server or turns this on
# (tests/dagster_layer/test_auto_server.py): a server started per test's connectors file would outlive the test.
os.environ.setdefault(AUTO_SERVE_ENV, "0")


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDbServer]:
    with start_mariadb() as server:
        server.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
        yield server


@pytest.fixture(scope="session")
def destination_pg() -> Iterator[PostgresServer]:
    with start_postgres() as server:
        yield server


@pytest.fixture(scope="module")
def source_pg() -> Iterator[PostgresServer]:
    """A logical-decoding PostgreSQL source, one per test module that uses it."""
    with start_postgres(logical=True) as server:
        yield server


@pytest.fixture(scope="session")
def spark():
    from cdc_pipeline.capture.spark import build_spark_session

    build_runner()
    return build_spark_session()


@pytest.fixture
def pipeline(mariadb: MariaDbServer, destination_pg: PostgresServer, spark, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    return new_pipeline(mariadb, destination_pg, tmp_path, monkeypatch)


@pytest.fixture
def pg_pipeline(source_pg: PostgresServer, destination_pg: PostgresServer, spark, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> PostgresPipeline:
    return new_pg_pipeline(source_pg, destination_pg, tmp_path, monkeypatch)


@pytest.fixture(params=["mariadb", "postgres"])
def any_source(request: pytest.FixtureRequest, destination_pg: PostgresServer, spark, tmp_path: Path,
               monkeypatch: pytest.MonkeyPatch) -> Pipeline | PostgresPipeline:
    """One test body run against a MariaDB and a PostgreSQL connector, for behaviour every source type shares."""
    if request.param == "mariadb":
        return new_pipeline(request.getfixturevalue("mariadb"), destination_pg, tmp_path, monkeypatch)
    return new_pg_pipeline(request.getfixturevalue("source_pg"), destination_pg, tmp_path, monkeypatch)
