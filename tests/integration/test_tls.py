"""A destination that takes TLS connections only: every connection of a run, Python's and the JVM's (offsets,
schema history, the bulk snapshot's COPY), verifies its certificate as the DSN's `sslmode` and `sslrootcert` say."""

from __future__ import annotations

import psycopg
import pytest

from cdc_pipeline.config import DestinationConfig, Secret
from cdc_pipeline.capture.runner import jdbc_target
from cdc_pipeline.testing.servers import start_postgres
from tests.helpers.mariadb_source import new_pipeline

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tls_destination():
    with start_postgres(tls=True) as server:
        yield server


def test_a_destination_that_requires_tls_is_replicated_into_with_its_certificate_verified(
        mariadb, tls_destination, spark, tmp_path, monkeypatch):
    pipeline = new_pipeline(mariadb, tls_destination, tmp_path, monkeypatch)
    with pytest.raises(psycopg.OperationalError, match="no encryption|SSL off"):
        psycopg.connect(pipeline.dest_dsn + "?sslmode=disable").close()
    verified = f"{pipeline.dest_dsn}?sslmode=verify-full&sslrootcert={tls_destination.ca_file}"
    pipeline.env["TEST_DEST_DSN"] = verified
    monkeypatch.setenv("TEST_DEST_DSN", verified)
    pipeline.source(["CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))",
                     "INSERT INTO t SELECT seq, CONCAT('v', seq) FROM seq_1_to_500"])

    pipeline.sync()  # the bulk snapshot's COPY and the engine's stores connect through JDBC
    pipeline.source(["INSERT INTO t VALUES (501, 'new')", "UPDATE t SET v = 'w' WHERE id = 1"])
    summary = pipeline.sync()

    assert (summary["inserts"], summary["updates"]) == (1, 1)
    pipeline.assert_same("t")
    assert pipeline.dest_query("SELECT count(*) FROM cdc.debezium_offsets WHERE connector = %s",
                               (pipeline.name,)) == [(1,)], "the JVM's offset store wrote over TLS"


def test_the_jvm_connections_take_the_dsn_tls_settings_and_the_timeouts():
    destination = DestinationConfig(
        dsn=Secret("postgresql://w:pw@db.example:5433/wh?sslmode=verify-full&sslrootcert=/etc/ca.pem"),
        control_schema="cdc", lock_timeout_seconds=5, statement_timeout_seconds=60)

    url, user, password = jdbc_target(destination)

    assert url.startswith("jdbc:postgresql://db.example:5433/wh?") and (user, password) == ("w", "pw")
    assert "sslmode=verify-full" in url and "sslrootcert=%2Fetc%2Fca.pem" in url and "tcpKeepAlive=true" in url
    assert "-c%20lock_timeout%3D5000ms%20-c%20statement_timeout%3D60000ms" in url.partition("options=")[2]
