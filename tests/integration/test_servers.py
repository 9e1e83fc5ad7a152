"""Integration tests for the throwaway MariaDB and PostgreSQL servers in cdc_pipeline.testing.servers."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pymysql
import pytest

from cdc_pipeline.testing.servers import MariaDbServer, PostgresServer, free_port, start_mariadb, start_postgres

pytestmark = pytest.mark.integration


def port_is_open(port: int) -> bool:
    """Tell whether something accepts TCP connections on 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def mariadb(tmp_path: Path) -> Iterator[MariaDbServer]:
    with start_mariadb(tmp_path) as server:
        yield server


@pytest.fixture
def logical_postgres(tmp_path: Path) -> Iterator[PostgresServer]:
    with start_postgres(tmp_path, logical=True) as server:
        yield server


def test_mariadb_writes_a_row_binlog(mariadb: MariaDbServer) -> None:
    settings = dict(mariadb.query("SHOW VARIABLES WHERE Variable_name IN ('binlog_format', 'log_bin', 'server_id')"))

    assert settings == {"binlog_format": "ROW", "log_bin": "ON", "server_id": "1"}


def test_mariadb_capture_user_logs_in_over_tcp(mariadb: MariaDbServer) -> None:
    mariadb.execute(
        [
            "CREATE DATABASE inventory",
            "CREATE TABLE inventory.products (id INT PRIMARY KEY, name VARCHAR(50))",
        ]
    )
    mariadb.create_capture_user("capture", "capture-secret")

    connection = pymysql.connect(
        host="127.0.0.1", port=mariadb.port, user="capture", password="capture-secret", database="inventory"
    )
    with connection, connection.cursor() as cursor:
        cursor.execute("SELECT CURRENT_USER()")
        current_user = cursor.fetchone()[0]
        cursor.execute("SHOW BINARY LOGS")
        binary_logs = cursor.fetchall()

    mariadb.execute("INSERT INTO products VALUES (1, 'scooter')", database="inventory")
    assert current_user.startswith("capture@")
    assert binary_logs
    assert mariadb.query("SELECT id, name FROM products", database="inventory") == [(1, "scooter")]


def test_mariadb_stop_closes_the_port_and_is_idempotent(tmp_path: Path) -> None:
    server = start_mariadb(tmp_path)
    assert port_is_open(server.port)

    server.stop()
    server.stop()

    assert not port_is_open(server.port)
    assert not server.work_dir.exists()


def test_postgres_runs_with_logical_wal(logical_postgres: PostgresServer) -> None:
    assert logical_postgres.query("SHOW wal_level") == [("logical",)]


def test_postgres_create_database_is_idempotent(logical_postgres: PostgresServer) -> None:
    logical_postgres.create_database("Destination DB")
    logical_postgres.create_database("Destination DB")

    with psycopg.connect(logical_postgres.dsn("Destination DB"), autocommit=True) as connection:
        connection.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        connection.execute("INSERT INTO orders VALUES (7)")
        address = connection.execute("SELECT inet_server_addr()::text, current_database()").fetchone()

    assert address == ("127.0.0.1/32", "Destination DB")
    assert logical_postgres.query("SELECT id FROM orders", dbname="Destination DB") == [(7,)]


def test_postgres_stop_closes_the_port_and_is_idempotent(tmp_path: Path) -> None:
    server = start_postgres(tmp_path)
    assert port_is_open(server.port)
    assert server.query("SHOW wal_level") == [("replica",)]

    server.stop()
    server.stop()

    assert not port_is_open(server.port)
    assert not server.work_dir.exists()


def test_mariadb_root_password_is_set_and_used(tmp_path: Path) -> None:
    work_dir = tmp_path / "secured"
    server = MariaDbServer(
        port=free_port(), datadir=work_dir / "data", socket=work_dir / "mariadb.sock", root_password="root-secret"
    )

    with server:
        connection = pymysql.connect(host="127.0.0.1", port=server.port, user="root", password="root-secret")
        connection.close()
        assert server.query("SELECT CURRENT_USER()") == [("root@localhost",)]
