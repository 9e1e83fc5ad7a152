"""Sources that take TLS connections only: every connection of a run to the source (Debezium's binlog client or
replication connection and its JDBC queries, the driver's planning and change checks, the bulk snapshot's JDBC
readers in Spark's tasks) encrypts as `tls_mode` says and verifies the certificate against `tls_ca_file`."""

from __future__ import annotations

import time
import uuid

import pymysql
import pytest

from cdc_pipeline.ops import pending
from cdc_pipeline.config import load_config
from cdc_pipeline.errors import CdcError
from cdc_pipeline.testing.servers import start_mariadb, start_postgres
from tests.helpers.mariadb_source import CAPTURE_PASSWORD, CAPTURE_USER, new_pipeline
from tests.helpers.postgres_source import PostgresPipeline

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tls_mariadb():
    with start_mariadb(tls=True) as server:
        server.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
        yield server


@pytest.fixture(scope="module")
def tls_source_pg():
    with start_postgres(logical=True, tls=True) as server:
        yield server


def test_a_mariadb_source_that_requires_tls_is_replicated_with_its_certificate_verified(
        tls_mariadb, destination_pg, spark, tmp_path, monkeypatch):
    with pytest.raises(pymysql.err.OperationalError, match="insecure transport|Access denied"):
        pymysql.connect(host=tls_mariadb.host, port=tls_mariadb.port, user=CAPTURE_USER, password=CAPTURE_PASSWORD,
                        ssl_disabled=True)
    pipeline = new_pipeline(tls_mariadb, destination_pg, tmp_path, monkeypatch)
    pipeline.write_config(tls_mode="verify-full", tls_ca_file=str(tls_mariadb.ca_file))
    pipeline.source(["CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))",
                     "INSERT INTO t SELECT seq, CONCAT('v', seq) FROM seq_1_to_300"])

    pipeline.sync()  # the bulk snapshot: the driver's planning queries, then JDBC reads in Spark's tasks
    pipeline.source(["INSERT INTO t VALUES (301, 'new')", "UPDATE t SET v = 'w' WHERE id = 1"])
    connector = load_config(pipeline.config_path).connector(pipeline.name)
    assert pending.check(connector, load_config(pipeline.config_path).destination).work
    summary = pipeline.sync()  # the binlog client

    assert summary["inserts"] == 1 and summary["updates"] == 1
    pipeline.assert_same("t")


def test_a_mariadb_source_without_tls_is_refused_when_tls_is_asked_for(mariadb, destination_pg, spark, tmp_path,
                                                                        monkeypatch):
    pipeline = new_pipeline(mariadb, destination_pg, tmp_path, monkeypatch)
    pipeline.write_config(tls_mode="require")
    connector = load_config(pipeline.config_path).connector(pipeline.name)

    with pytest.raises(CdcError, match="SSL is required"):
        from cdc_pipeline.sources import mariadb as source
        source.connect(connector).close()


def test_a_postgres_source_that_requires_tls_is_replicated_with_its_certificate_verified(
        tls_source_pg, destination_pg, spark, tmp_path, monkeypatch):
    suffix = uuid.uuid4().hex[:8]
    pipeline = PostgresPipeline(tls_source_pg, destination_pg, name=f"p_{suffix}", source_db=f"src_{suffix}",
                                dest_db=f"dst_{suffix}", config_path=tmp_path / "connectors.yaml")
    tls_source_pg.create_database(pipeline.source_db)
    destination_pg.create_database(pipeline.dest_db)
    pipeline.write_config(tls_mode="verify-full", tls_ca_file=str(tls_source_pg.ca_file))
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    for key, value in {"CDC_PIPELINE_CONFIG": str(pipeline.config_path), "TEST_SOURCE_PASSWORD": "unused",
                       "TEST_DEST_DSN": pipeline.dest_dsn, "DAGSTER_HOME": str(dagster_home)}.items():
        monkeypatch.setenv(key, value)
    pipeline.source(["CREATE TABLE items (id int PRIMARY KEY, v text)",
                     "INSERT INTO items SELECT i, 'v' || i FROM generate_series(1, 300) AS i"])

    pipeline.sync()  # the bulk snapshot (JDBC in Spark's tasks) and the replication slot
    pipeline.source(["INSERT INTO items VALUES (301, 'new')", "UPDATE items SET v = 'w' WHERE id = 1"])
    config = load_config(pipeline.config_path)
    deadline = time.monotonic() + 20  # the slot shows a change once its WAL is flushed
    while not pending.check(config.connector(pipeline.name), config.destination).work:
        assert time.monotonic() < deadline, "the change check through the slot found no change"
        time.sleep(0.5)
    summary = pipeline.sync()

    assert summary["inserts"] == 1 and summary["updates"] == 1
    pipeline.assert_same("items")
