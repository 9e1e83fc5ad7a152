"""The SQL Server source's checks without a JVM or a server: the change check, the preflight and row counts, each
against SQL Server's recorded answers (tests/fixtures/recorded/sqlserver.yaml, each answer citing the page of
Microsoft's documentation it follows), through pymssql's `connect` answered by a recorded connection; an unreachable
server through pymssql itself."""

from __future__ import annotations

import json

import pymssql
import pytest

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sources import captures, sqlserver
from tests.fixtures.recorded import closed_port, connectors_file

APPLIED = {"commit_lsn": "0000002c:00000a38:0005", "change_lsn": "0000002c:00000a38:0004", "event_serial_no": 1}
PASSWORD = "s3cret-Pa55"
IN_FILE = {"type": "sqlserver", "hostname": "sql.example.com", "user": "dbz", "password": PASSWORD, "database": "shop",
           "tables": ["dbo.orders", "dbo.customers"]}


def connector(**fields) -> ConnectorConfig:
    return ConnectorConfig(**{"name": "erp", "type": "sqlserver", "hostname": "sql.example.com", "user": "dbz",
                              "password": PASSWORD, "database": "shop", "tables": ["dbo.orders", "dbo.customers"],
                              **fields})


def check(server, scenario: str, applied: dict = APPLIED, **fields):
    server.scenario = scenario
    source = connector(**fields)
    return sqlserver.check_changes(source, None, applied, lambda table: captures(source, table))


def test_nothing_is_new_when_the_max_lsn_is_the_applied_commit(server):
    found = check(server, "nothing_new")
    assert not found.changes and found.known and found.reached_end
    assert "no change since the applied position 0000002c:00000a38:0005" in found.reason
    assert server.last.closed
    opened = server.last.opened_with
    assert (opened["server"], opened["port"], opened["database"], opened["user"]) == \
        ("sql.example.com", "1433", "shop", "dbz")
    assert opened["autocommit"] and opened["login_timeout"] == 10


def test_changes_of_other_captured_tables_are_nothing_to_do(server):
    found = check(server, "changes_elsewhere")
    assert not found.changes and found.reached_end
    assert "changes of other tables" in found.reason
    # Each of the connector's capture instances was asked for a row after the applied commit and change LSN.
    asked = [(text, params) for text, params in server.last.sent if "_CT]" in text]
    assert [text.split()[5] for text, _ in asked] == ["cdc.[dbo_customers_CT]", "cdc.[dbo_orders_CT]"]
    commit, change = bytes.fromhex("0000002c00000a380005"), bytes.fromhex("0000002c00000a380004")
    assert all(params == (commit, commit, change) for _, params in asked)


def test_changes_waiting_in_a_captured_table_ask_for_a_run(server):
    found = check(server, "changes_waiting")
    assert found.changes
    assert found.reason == "capture instance dbo_customers of dbo.customers holds changes after 0000002c:00000a38:0005"


def test_a_position_the_cleanup_job_passed_is_said_and_launches_nothing(server):
    found = check(server, "out_of_retention")
    assert not found.changes and not found.known
    assert "fell out of the change tables' retention" in found.reason and "dbo_orders" in found.reason
    assert "cdc-pipeline restart erp always" in found.reason


def test_a_capture_instance_made_after_the_applied_commit_is_no_loss(server):
    found = check(server, "new_capture_instance")
    assert found.changes and found.known


def test_cdc_off_cannot_be_checked(server):
    found = check(server, "cdc_disabled")
    assert not found.changes and not found.known and "CDC is not enabled on database shop" in found.reason


def test_no_streamed_position_asks_for_a_run_without_connecting(server):
    found = check(server, "nothing_new", applied={})
    assert found.changes and server.last is None
    snapshot = {**APPLIED, "snapshot": "INITIAL", "snapshot_completed": False}
    assert check(server, "nothing_new", applied=snapshot).changes and server.last is None


def test_a_finished_snapshot_or_a_poll_without_change_covers_its_whole_commit_lsn(server):
    finished = {"snapshot": "INITIAL", "snapshot_completed": True, "commit_lsn": "0000002c:00000a38:0005",
                "change_lsn": None, "event_serial_no": 0}
    found = check(server, "changes_elsewhere", applied=finished)
    assert not found.changes and found.reached_end
    commit = bytes.fromhex("0000002c00000a380005")
    assert {params for text, params in server.last.sent if "_CT]" in text} == {(commit, commit, b"\xff" * 10)}
    # The later of two positions: by commit LSN, then by change LSN within it.
    assert sqlserver.check_position(finished) > sqlserver.check_position(APPLIED)
    assert sqlserver.check_position({**finished, "snapshot_completed": False}) is None


def test_an_unreachable_server_names_the_connector_and_host_never_the_password():
    # pymssql itself, against a port nothing listens on.
    source = connector(hostname="127.0.0.1", port=closed_port())
    with pytest.raises(CdcError) as raised:
        sqlserver.check_changes(source, None, APPLIED, lambda table: True)
    message = str(raised.value)
    assert f"cannot connect to the source 127.0.0.1:{source.port}" in message and "connector 'erp'" in message
    assert PASSWORD not in message


def test_a_refused_query_names_the_connector_and_host(server, monkeypatch):
    def refused(**kwargs):
        raise pymssql.OperationalError(18456, f"Login failed for user 'dbz' (password {PASSWORD}).".encode())

    monkeypatch.setattr(pymssql, "connect", refused)
    with pytest.raises(CdcError) as raised:
        sqlserver.preflight(connector())
    assert "sql.example.com:1433" in str(raised.value) and PASSWORD not in str(raised.value)


def test_a_ready_source_has_no_findings(server):
    server.scenario = "ready"
    assert sqlserver.preflight(connector()) == []
    server.scenario = "owner"
    assert sqlserver.preflight(connector()) == []


def test_each_missing_setting_is_a_finding_with_its_fix(server):
    server.scenario = "not_ready"
    findings = {finding.setting: finding for finding in sqlserver.preflight(
        connector(debezium={"snapshot.isolation.mode": "snapshot"}))}
    assert set(findings) == {"is_tracked_by_cdc", "sql_server_agent", "privileges", "snapshot_isolation_state"}
    assert findings["is_tracked_by_cdc"].problem == "CDC is not enabled on dbo.customers"
    assert findings["is_tracked_by_cdc"].fix == ("USE [shop]; EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', "
                                                 "@source_name = N'customers', @role_name = NULL;")
    assert findings["sql_server_agent"].is_error and "is Stopped" in findings["sql_server_agent"].problem
    assert findings["snapshot_isolation_state"].fix == "ALTER DATABASE [shop] SET ALLOW_SNAPSHOT_ISOLATION ON;"
    assert findings["privileges"].fix == "USE [shop]; GRANT SELECT ON SCHEMA::cdc TO [dbz];"
    server.scenario = "gated"
    [gated] = sqlserver.preflight(connector())
    assert gated.setting == "privileges" and gated.fix == "USE [shop]; ALTER ROLE [cdc_reader] ADD MEMBER [dbz];"


def test_a_query_the_source_refuses_is_one_finding_naming_it(server):
    from cdc_pipeline.ops import preflight

    server.scenario = "refused"
    [finding] = preflight._source_findings(sqlserver, connector())
    assert finding.setting == "check" and finding.is_error
    assert "refused a check's query: The SELECT permission was denied on the object 'change_tables'" in \
        finding.problem


def test_cdc_off_on_the_database_is_the_one_finding(server):
    server.scenario = "cdc_off"
    [finding] = sqlserver.preflight(connector())
    assert finding.setting == "is_cdc_enabled" and finding.fix == "USE [shop]; EXEC sys.sp_cdc_enable_db; (as a member of sysadmin)"


def test_a_listed_table_that_does_not_exist_is_a_finding(server):
    server.scenario = "ready"
    [finding] = sqlserver.preflight(connector(tables=["dbo.orders", "dbo.invoices"]))
    assert finding.setting == "tables" and "dbo.invoices" in finding.problem


def test_an_agent_status_the_user_may_not_read_is_a_warning(server):
    server.scenario = "agent_hidden"
    [finding] = sqlserver.preflight(connector())
    assert finding.setting == "sql_server_agent" and not finding.is_error


def test_row_counts_of_the_captured_tables(server):
    server.scenario = "counts"
    source = connector()
    assert sqlserver.row_counts(source, lambda table: captures(source, table)) == {"dbo.customers": 35,
                                                                                   "dbo.orders": 120}


@pytest.mark.integration
def test_pending_and_check_answer_through_the_cli(destination_pg, tmp_path, monkeypatch, server, capsys):
    from cdc_pipeline.ops.cli import main

    path = connectors_file(destination_pg, tmp_path, monkeypatch, "erp", IN_FILE, APPLIED)
    server.scenario = "changes_waiting"
    assert main(["pending", "erp", "--config", str(path)]) == 0
    assert capsys.readouterr().out == ("erp: work: capture instance dbo_customers of dbo.customers holds changes "
                                       "after 0000002c:00000a38:0005\n")
    server.scenario = "changes_elsewhere"
    assert main(["pending", "erp", "--json", "--config", str(path)]) == 1, "the sensor launches nothing"
    assert json.loads(capsys.readouterr().out)["erp"]["work"] is False
    server.scenario = "not_ready"
    assert main(["check", "erp", "--config", str(path)]) == 1
    out = capsys.readouterr().out
    assert "error   source is_tracked_by_cdc: CDC is not enabled on dbo.customers" in out
    assert "fix: USE [shop]; EXEC sys.sp_cdc_enable_table @source_schema = N'dbo'" in out
    assert PASSWORD not in out


@pytest.mark.integration
def test_verify_counts_the_rows_of_each_key_range_on_both_sides(destination_pg, tmp_path, monkeypatch, server, capsys):
    from psycopg import sql

    from cdc_pipeline.config import load_config
    from cdc_pipeline.mapping.objmap import ObjectMap
    from cdc_pipeline.ops.cli import main
    from cdc_pipeline.ops.verify import DIFFERS

    path = connectors_file(destination_pg, tmp_path, monkeypatch, "erp", IN_FILE, APPLIED)
    config = load_config(path)
    names = ObjectMap(config.connector("erp"), [])
    orders, customers = names.table_name("dbo.orders"), names.table_name("dbo.customers")
    with config.destination.connect("erp") as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(orders[0])))
        # The source's ids are 1..10: here 6 is missing and 11 extra, the counts of 1..10 alike.
        conn.execute(sql.SQL("CREATE TABLE {} (id integer PRIMARY KEY)").format(sql.Identifier(*orders)))
        conn.execute(sql.SQL("INSERT INTO {} SELECT g FROM generate_series(1, 11) g WHERE g <> 6").format(
            sql.Identifier(*orders)))
        conn.execute(sql.SQL("CREATE TABLE {} (code text PRIMARY KEY)").format(sql.Identifier(*customers)))
        conn.execute(sql.SQL("INSERT INTO {} VALUES ('a'), ('b'), ('c')").format(sql.Identifier(*customers)))
    server.scenario = "verify"

    assert main(["verify", "erp", "--json", "--chunk-rows", "4", "--rechecks", "1", "--recheck-seconds", "0",
                 "--config", str(path)]) == DIFFERS
    tables = {table["source_table"]: table for table in json.loads(capsys.readouterr().out)["tables"]}
    assert tables["dbo.orders"]["differing_ranges"] == [{"lower": [5], "upper": [9]}, {"lower": [9], "upper": [13]}]
    assert (tables["dbo.orders"]["source_rows"], tables["dbo.orders"]["destination_rows"]) == (10, 10)
    assert tables["dbo.orders"]["compared_by"] == "row counts per key range" and tables["dbo.orders"]["chunks"] == 3
    assert not tables["dbo.customers"]["differs"] and tables["dbo.customers"]["destination_rows"] == 3
    assert "not hashed" in tables["dbo.orders"]["unlisted"]
    # Counted again once (--rechecks 1), the differing table only; the change check found nothing unapplied.
    sent = [text for connection in server.connections for text in connection.statements()]
    assert sent.count("SELECT NULL, NULL, COUNT_BIG(*) FROM [dbo].[customers]") == 1
    assert sent.count("SELECT MIN(CAST([id] AS bigint)), MAX(CAST([id] AS bigint)), COUNT_BIG(*) FROM [dbo].[orders]") \
        == 2
    assert sent[-1].startswith("SELECT s.name, t.name, ct.capture_instance"), "the change check, last"
