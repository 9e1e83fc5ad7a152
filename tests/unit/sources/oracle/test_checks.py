"""The Oracle source's checks without a JVM or a server: the change check (LogMiner over the redo since the applied
position), the preflight and row counts, each against Oracle's recorded answers (tests/fixtures/recorded/oracle.yaml,
each answer citing the page of Oracle's documentation it follows), through python-oracledb's `connect` answered by a
recorded connection; an unreachable server through python-oracledb itself (thin mode)."""

from __future__ import annotations

import json

import pytest

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sources import captures, oracle
from tests.fixtures.recorded import closed_port, connectors_file

APPLIED = {"scn": "289100", "commit_scn": "289120:1:0a001b00", "txId": "0a001b00", "txSeq": 3}
PASSWORD = "0racle-Secr3t"


def connector(**fields) -> ConnectorConfig:
    return ConnectorConfig(**{"name": "ledger", "type": "oracle", "hostname": "ora.example.com", "user": "C##DBZUSER",
                              "password": PASSWORD, "database": "ORCLCDB",
                              "tables": ["INVENTORY.ORDERS", "INVENTORY.CUSTOMERS"],
                              "debezium": {"database.pdb.name": "ORCLPDB1"}, **fields})


def check(server, scenario: str, applied: dict = APPLIED, **fields):
    server.scenario = scenario
    source = connector(**fields)
    return oracle.check_changes(source, None, applied, lambda table: captures(source, table))


def test_nothing_is_new_when_the_redo_since_the_applied_commit_holds_no_captured_change(server):
    found = check(server, "nothing_new")
    assert not found.changes and found.known and found.reached_end
    assert found.reason == "no change of the connector's tables between SCN 289100 and 289200"
    opened = server.last.opened_with
    assert (opened["host"], opened["port"], opened["service_name"], opened["user"]) == \
        ("ora.example.com", 1521, "ORCLCDB", "C##DBZUSER")
    # Mined from where Debezium resumes, to the current SCN, over the archived copy of 41 and the online 42.
    sent = server.last.sent
    logfiles = [params for text, params in sent if text.startswith("BEGIN DBMS_LOGMNR.ADD_LOGFILE")]
    assert logfiles == [{"name": "/u01/fra/ORCLCDB/archivelog/1_41_1150000000.arc", "options": 1},
                        {"name": "/u01/oradata/ORCLCDB/redo02.log", "options": 3}]
    assert [params for text, params in sent if text.startswith("BEGIN DBMS_LOGMNR.START_LOGMNR")] == \
        [{"start_scn": 289100, "end_scn": 289200}]
    assert [params for text, params in sent if "v$logmnr_contents" in text] == \
        [{"start_scn": 289100, "committed_scn": 289120, "row_limit": oracle.CHECK_ROWS}]
    assert server.last.statements()[-1] == "BEGIN DBMS_LOGMNR.END_LOGMNR; END;" and server.last.closed


def test_a_change_of_the_same_table_in_another_pdb_is_not_the_connectors(server):
    found = check(server, "other_pdb")
    assert not found.changes and found.reached_end


def test_a_change_of_a_captured_table_after_the_applied_commit_asks_for_a_run(server):
    found = check(server, "changes_waiting")
    assert found.changes and found.reason == "INVENTORY.CUSTOMERS changed at SCN 289160, after the applied commit " \
                                             "(SCN 289120)"


def test_a_transaction_open_at_the_applied_commit_asks_for_a_run(server):
    found = check(server, "open_transaction")
    assert found.changes and "a transaction open at the applied commit (SCN 289120) changed INVENTORY.CUSTOMERS" \
        == found.reason


def test_a_position_older_than_every_redo_log_is_said_and_launches_nothing(server):
    found = check(server, "out_of_retention")
    assert not found.changes and not found.known
    assert "older than every redo log the database keeps (the oldest starts at SCN 289500)" in found.reason
    assert "cdc-pipeline restart ledger always" in found.reason
    assert not any("DBMS_LOGMNR" in text for text in server.last.statements())


def test_more_archived_redo_than_a_check_mines_asks_for_a_run(server):
    found = check(server, "too_much_redo")
    assert found.changes and "300 MB of archived redo since SCN 289100" in found.reason
    assert not any("DBMS_LOGMNR" in text for text in server.last.statements())


def test_no_streamed_position_asks_for_a_run_without_connecting(server):
    assert check(server, "nothing_new", applied={}).changes and server.last is None
    snapshot = {"scn": "1001", "snapshot_scn": "1001", "snapshot": "INITIAL", "snapshot_completed": False}
    assert check(server, "nothing_new", applied=snapshot).changes and server.last is None


def test_an_unreachable_server_names_the_connector_and_host_never_the_password():
    source = connector(hostname="127.0.0.1", port=closed_port())
    with pytest.raises(CdcError) as raised:
        oracle.check_changes(source, None, APPLIED, lambda table: True)
    message = str(raised.value)
    assert f"cannot connect to the source 127.0.0.1:{source.port}: DPY-6005" in message
    assert "connector 'ledger'" in message and PASSWORD not in message


def test_a_ready_source_has_no_findings(server):
    server.scenario = "ready"
    assert oracle.preflight(connector()) == []
    assert 'ALTER SESSION SET CONTAINER = "ORCLPDB1"' in server.last.statements()


def test_each_missing_setting_is_a_finding_with_its_fix(server):
    server.scenario = "not_ready"
    findings = oracle.preflight(connector(user="DBZUSER"))
    by_problem = {finding.problem: finding for finding in findings}
    assert all(finding.is_error for finding in findings)
    assert [finding.setting for finding in findings] == [
        "log_mode", "supplemental_log_data_min", "user", "privileges", "privileges", "privileges",
        "supplemental_log_data_all"]
    assert "ALTER DATABASE ARCHIVELOG" in by_problem["the database is in NOARCHIVELOG mode: LogMiner reads redo logs "
                                                     "the database archives"].fix
    assert findings[1].fix == "ALTER DATABASE ADD SUPPLEMENTAL LOG DATA;"
    assert "C##" in findings[2].fix
    assert findings[3].fix == 'GRANT LOGMINING, SELECT ANY TRANSACTION TO "DBZUSER" CONTAINER=ALL;'
    assert findings[4].fix == 'GRANT EXECUTE ON DBMS_LOGMNR TO "DBZUSER" CONTAINER=ALL; (as SYS)'
    assert findings[5].problem == "the capture user DBZUSER cannot read V$LOGMNR_CONTENTS"
    assert findings[5].fix == 'GRANT SELECT ON V_$LOGMNR_CONTENTS TO "DBZUSER" CONTAINER=ALL; (as SYS)'
    assert findings[6].fix == 'ALTER TABLE "INVENTORY"."CUSTOMERS" ADD SUPPLEMENTAL LOG DATA (ALL) COLUMNS;'


def test_all_column_logging_of_the_database_covers_every_table(server):
    server.scenario = "all_columns_on_the_database"
    settings = [finding.setting for finding in oracle.preflight(connector())]
    assert "supplemental_log_data_all" not in settings and "log_mode" not in settings


def test_row_counts_of_the_captured_tables_in_the_pdb(server):
    server.scenario = "counts"
    source = connector()
    assert oracle.row_counts(source, lambda table: captures(source, table)) == {"INVENTORY.CUSTOMERS": 3,
                                                                                "INVENTORY.ORDERS": 7}
    assert server.last.statements()[0] == 'ALTER SESSION SET CONTAINER = "ORCLPDB1"'


def test_verify_counts_rows_per_range_of_an_integer_key_and_others_whole(server):
    from cdc_pipeline.sources.change_check import RangeCounts

    server.scenario = "key_ranges"
    source = connector()
    assert oracle.key_range_counts(source, lambda table: captures(source, table), 3) == {
        "INVENTORY.CUSTOMERS": RangeCounts(None, 0, 1, {0: 3}),
        "INVENTORY.ORDERS": RangeCounts("ORDER_ID", 1001, 3, {0: 3, 1: 3, 2: 1})}


@pytest.mark.integration
def test_pending_and_check_answer_through_the_cli(destination_pg, tmp_path, monkeypatch, server, capsys):
    from cdc_pipeline.ops.cli import main

    path = connectors_file(destination_pg, tmp_path, monkeypatch, "ledger", {
        "type": "oracle", "hostname": "ora.example.com", "user": "C##DBZUSER", "password": PASSWORD,
        "database": "ORCLCDB", "tables": ["INVENTORY.ORDERS", "INVENTORY.CUSTOMERS"],
        "debezium": {"database.pdb.name": "ORCLPDB1"}}, APPLIED)
    server.scenario = "changes_waiting"
    assert main(["pending", "ledger", "--config", str(path)]) == 0
    assert capsys.readouterr().out == ("ledger: work: INVENTORY.CUSTOMERS changed at SCN 289160, after the applied "
                                       "commit (SCN 289120)\n")
    server.scenario = "nothing_new"
    assert main(["pending", "ledger", "--json", "--config", str(path)]) == 1, "the sensor launches nothing"
    assert json.loads(capsys.readouterr().out)["ledger"]["work"] is False
    server.scenario = "not_ready"
    assert main(["check", "ledger", "--config", str(path)]) == 1
    out = capsys.readouterr().out
    assert "error   source log_mode: the database is in NOARCHIVELOG mode" in out
    assert 'fix: ALTER TABLE "INVENTORY"."CUSTOMERS" ADD SUPPLEMENTAL LOG DATA (ALL) COLUMNS;' in out
    assert PASSWORD not in out
