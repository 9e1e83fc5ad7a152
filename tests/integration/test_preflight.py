"""`cdc-pipeline check NAME` and the first sync's preflight, on real servers: a source or destination that lacks a
setting or privilege is named with the statement that fixes it, and a connector's first run does not start."""

from __future__ import annotations

import json
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import psycopg
import pytest
from psycopg import sql

from cdc_pipeline import control
from cdc_pipeline.config import load_config
from cdc_pipeline.errors import PreflightError
from cdc_pipeline.ops.cli import main, run_sync
from cdc_pipeline.testing.servers import MariaDbServer, PostgresServer
from tests.helpers.mariadb_source import CAPTURE_PASSWORD, Pipeline, new_pipeline
from tests.helpers.postgres_source import PostgresPipeline, new_pg_pipeline

pytestmark = pytest.mark.integration


@pytest.fixture
def source(mariadb: MariaDbServer, destination_pg: PostgresServer, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    """A MariaDB connector without the Spark session: no check and no refused sync starts one."""
    return new_pipeline(mariadb, destination_pg, tmp_path, monkeypatch)


@pytest.fixture
def pg_source(source_pg: PostgresServer, destination_pg: PostgresServer, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> PostgresPipeline:
    return new_pg_pipeline(source_pg, destination_pg, tmp_path, monkeypatch)


@contextmanager
def statement_binlog(mariadb: MariaDbServer) -> Iterator[None]:
    """The shared MariaDB server's binlog_format set to STATEMENT for new sessions, restored after."""
    mariadb.execute("SET GLOBAL binlog_format = 'STATEMENT'")
    try:
        yield
    finally:
        mariadb.execute("SET GLOBAL binlog_format = 'ROW'")


def check(name: str, capsys: pytest.CaptureFixture) -> tuple[int, list[dict]]:
    exit_code = main(["check", name, "--json"])
    return exit_code, json.loads(capsys.readouterr().out)[0]["findings"]


def test_a_clean_source_and_destination_pass_the_check(source: Pipeline, capsys) -> None:
    assert main(["check", source.name]) == 0

    out = capsys.readouterr().out
    assert f"connector {source.name} (mariadb):" in out
    assert "0 errors, 0 warnings: ready for a first run" in out


def test_a_statement_binlog_is_named_with_its_fix_and_the_first_sync_refuses(source: Pipeline, capsys) -> None:
    with statement_binlog(source.mariadb):
        exit_code, findings = check(source.name, capsys)
        with pytest.raises(PreflightError) as refused:
            run_sync(source.name)

    assert exit_code == 1
    assert [(f["level"], f["where"], f["setting"]) for f in findings] == [("error", "source", "binlog_format")]
    assert "binlog_format is STATEMENT" in findings[0]["problem"]
    assert "SET GLOBAL binlog_format = 'ROW'" in findings[0]["fix"] and "my.cnf" in findings[0]["fix"]
    message = str(refused.value)
    assert "binlog_format is STATEMENT" in message and source.name in message
    # Refused before the session opened, and recorded as the connector's failure: no engine started, no position.
    with psycopg.connect(source.dest_dsn, autocommit=True) as conn:
        state = control.read_state(conn, "cdc", source.name)
        assert state["state"] == "stopped" and "binlog_format is STATEMENT" in state["last_error"]
        assert not control.has_offset(conn, "cdc", source.name)


def test_a_capture_user_with_only_select_lacks_the_replication_privileges(source: Pipeline, capsys) -> None:
    user = f"pf_{uuid.uuid4().hex[:8]}"
    source.mariadb.execute([f"CREATE USER '{user}'@'%' IDENTIFIED BY '{CAPTURE_PASSWORD}'",
                            f"GRANT SELECT ON `{source.source_db}`.* TO '{user}'@'%'"])
    source.write_config(user=user)

    exit_code, findings = check(source.name, capsys)

    assert exit_code == 1
    errors = [f for f in findings if f["level"] == "error"]
    assert [f["setting"] for f in errors] == ["privileges"]
    assert errors[0]["problem"] == (f"the capture user {user}@% lacks RELOAD, SHOW DATABASES, "
                                    "REPLICATION SLAVE, REPLICATION CLIENT")
    assert errors[0]["fix"] == (f"GRANT RELOAD, SHOW DATABASES, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO "
                                f"'{user}'@'%';")
    # The statement it gives is the fix.
    source.mariadb.execute(errors[0]["fix"])
    assert [f["level"] for f in check(source.name, capsys)[1]] == ["warning"]  # LOCK TABLES, not granted here


def test_a_postgres_role_without_replication_is_named_with_its_grants(pg_source: PostgresPipeline, capsys) -> None:
    role = f"pf_{uuid.uuid4().hex[:8]}"
    pg_source.source(["CREATE TABLE items (id int PRIMARY KEY)",
                      sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)).as_string()])
    pg_source.write_config(user=role)

    exit_code, findings = check(pg_source.name, capsys)

    assert exit_code == 1
    by_setting = {f["setting"]: f for f in findings}
    assert by_setting["replication"]["fix"].startswith(f'ALTER ROLE "{role}" WITH REPLICATION;')
    assert by_setting["privileges"]["problem"] == f"the capture role {role} cannot SELECT public.items, which the " \
                                                  "snapshot reads"
    assert by_setting["privileges"]["fix"] == f'GRANT SELECT ON "public"."items" TO "{role}";'
    assert by_setting["heartbeat table"]["level"] == "error"  # PostgreSQL 15 gives PUBLIC no CREATE on public
    assert by_setting["max_slot_wal_keep_size"]["level"] == "warning"
    publication = [f for f in findings if f["setting"] == "publication"]
    assert publication and "GRANT CREATE ON DATABASE" in publication[0]["fix"]
    assert "wal_level" not in by_setting and "max_replication_slots" not in by_setting


def test_a_postgres_superuser_passes_with_the_unbounded_wal_warning(pg_source: PostgresPipeline, capsys) -> None:
    pg_source.source("CREATE TABLE items (id int PRIMARY KEY)")

    exit_code, findings = check(pg_source.name, capsys)

    assert exit_code == 0
    assert [(f["level"], f["setting"]) for f in findings] == [("warning", "max_slot_wal_keep_size")]
    assert findings[0]["fix"].startswith("ALTER SYSTEM SET max_slot_wal_keep_size = ")

    pg_source.write_config(debezium={"publication.autocreate.mode": "disabled"})
    exit_code, findings = check(pg_source.name, capsys)

    assert exit_code == 1
    publication = next(f for f in findings if f["setting"] == "publication")
    assert publication["fix"] == (f'as the tables\' owner or a superuser: CREATE PUBLICATION "cdc_{pg_source.name}" '
                                  'FOR TABLE "public"."items", "public"."cdc_heartbeat";')


def test_a_read_only_destination_default_is_an_error_the_session_does_not_override(source: Pipeline,
                                                                                     capsys) -> None:
    database = sql.Identifier(source.dest_db)
    source.destination.execute([
        sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(database).as_string(),
        # Pinned by every session the pipeline opens: not a finding.
        sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = 'serializable'").format(database).as_string(),
    ])

    exit_code, findings = check(source.name, capsys)

    assert exit_code == 1
    assert [(f["where"], f["setting"]) for f in findings] == [("destination", "default_transaction_read_only")]
    assert findings[0]["fix"] == f'ALTER DATABASE "{source.dest_db}" RESET "default_transaction_read_only";'


def test_the_dagster_sync_job_fails_its_first_step_before_the_engine_starts(source: Pipeline) -> None:
    from dagster import DagsterInstance

    from assets.definitions import build_definitions

    job = build_definitions(load_config(source.config_path)).resolve_job_def(f"sync_{source.name}")
    with statement_binlog(source.mariadb), DagsterInstance.ephemeral() as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False)

    assert not result.success
    failure = next(event for event in result.all_events if event.is_step_failure)
    assert failure.step_key == f"{source.name}_fetch_cycle.fetch_batches"
    assert "binlog_format is STATEMENT" in str(failure.step_failure_data.error)
