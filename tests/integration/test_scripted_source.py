"""The scripted SQL Server and Oracle sources (tests/helpers/scripted_source.py) give the runner, through the real
embedded engine, the records the connectors' own classes make: the source struct and offsets each connector writes,
its schema changes (SQL Server's without DDL text, Oracle's with it, both with Debezium's tableChanges), keyed and
keyless tables, a transaction over two tables; a run resumes after its stored offset, `redeliver` replays steps
before it with the offsets they had; and a sync lands the rows, skips re-delivered changes, and takes a column added
later, in PostgreSQL."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from cdc_pipeline import cycle, faults
from cdc_pipeline.config import load_config
from cdc_pipeline.decode.events import DATA_CHANGE, OTHER, SCHEMA_CHANGE, TRANSACTION
from tests.helpers.commit_audit import audit_commits, totals_committed
from tests.helpers.runs import kill_at
from tests.helpers.scripted_source import ScriptedPipeline, new_scripted_pipeline, sqlserver_column

pytestmark = pytest.mark.integration

SQLSERVER_ITEMS = [sqlserver_column("id", "int", 10, 0, optional=False), sqlserver_column("name", "nvarchar", 20)]
SQLSERVER_NOTES = [sqlserver_column("note", "varchar", 50)]


def fetched(pipe: ScriptedPipeline, spark, markers: bool = False) -> list[dict[str, Any]]:
    """The index entries the runner's EventSerializer made of everything one fetch cycle pops (after the script is
    written, heartbeats left out), a transaction's BEGIN and END records only with `markers`; each batch is marked
    complete, which stores its offset as a run does."""
    pipe.script.write()
    config = load_config()
    entries = []
    with cycle.ConnectorSession(config.connector(pipe.name), config.destination, spark) as session:
        for group in cycle.fetch_batches(session):
            for batch in group:
                entries.extend(batch.index)
                session.runner.mark_complete(batch.batch_id)
    # The connector's heartbeats (OTHER) come once a second when a fetch takes that long (a loaded machine): no step
    # of the script makes them.
    return [entry for entry in entries if entry["kind"] != OTHER and (markers or entry["kind"] != TRANSACTION)]


def changes(entries: list[dict[str, Any]]) -> list[tuple]:
    """Each entry but a transaction's BEGIN and END as (kind, table, op or the schema change's type)."""
    return [(entry["kind"], entry["source"]["table"],
             entry["op"] if entry["kind"] == DATA_CHANGE else entry["change"]["tableChanges"][0]["type"])
            for entry in entries]


def transactions(entries: list[dict[str, Any]]) -> list[int]:
    """The data changes of each source transaction, as its BEGIN and END records bracket them; asserts that every
    data change is inside one and that each END counts its transaction's changes."""
    sizes: list[int] = []
    open_changes: int | None = None
    for entry in entries:
        if entry["kind"] == TRANSACTION and entry["status"] == "BEGIN":
            assert open_changes is None, f"a BEGIN inside a transaction: {entry}"
            open_changes = 0
        elif entry["kind"] == TRANSACTION:
            assert open_changes is not None and entry["event_count"] == open_changes, entry
            sizes.append(open_changes)
            open_changes = None
        elif entry["kind"] == DATA_CHANGE:
            assert open_changes is not None, f"a change outside any transaction: {entry}"
            open_changes += 1
    assert open_changes is None, "the last transaction has its END"
    return sizes


def sqlserver_changes(script) -> None:
    script.create_table("dbo.items", SQLSERVER_ITEMS, primary_key=["id"])
    script.create_table("dbo.notes", SQLSERVER_NOTES)
    with script.transaction():
        script.insert("dbo.items", {"id": 1, "name": "a"})
        script.insert("dbo.notes", {"note": "first"})
    script.insert("dbo.items", {"id": 2, "name": "b"})
    script.update("dbo.items", {"id": 1, "name": "a"}, {"id": 1, "name": "c"})
    script.delete("dbo.items", {"id": 2, "name": "b"})


def test_sqlserver_events_are_the_connectors_and_a_run_resumes_after_its_offset(destination_pg, spark, tmp_path,
                                                                                  monkeypatch):
    pipe = new_scripted_pipeline("sqlserver", destination_pg, tmp_path, monkeypatch, tables=["dbo.items", "dbo.notes"])
    sqlserver_changes(pipe.script)
    bracketed = fetched(pipe, spark, markers=True)
    # The script's transaction of two inserts, then one change each, as the connector brackets them.
    assert transactions(bracketed) == [2, 1, 1, 1]
    entries = [entry for entry in bracketed if entry["kind"] != TRANSACTION]
    assert changes(entries) == [(SCHEMA_CHANGE, "items", "CREATE"), (SCHEMA_CHANGE, "notes", "CREATE"),
                                (DATA_CHANGE, "items", "c"), (DATA_CHANGE, "notes", "c"), (DATA_CHANGE, "items", "c"),
                                (DATA_CHANGE, "items", "u"), (DATA_CHANGE, "items", "d")]
    create_items, create_notes = (entry["change"] for entry in entries[:2])
    # SqlServerSchemaChangeEventEmitter: no DDL text ("N/A"), the table as getColumns described it.
    assert create_items["ddl"] == "N/A" and create_items["databaseName"] == "testdb"
    table = create_items["tableChanges"][0]["table"]
    assert table["primaryKeyColumnNames"] == ["id"] and create_notes["tableChanges"][0]["table"]["primaryKeyColumnNames"] == []
    assert [(c["name"], c["typeName"], c["jdbcType"], c["length"], c["optional"]) for c in table["columns"]] == [
        ("id", "int", 4, 10, False), ("name", "nvarchar", -9, 20, True)]
    insert_items, insert_notes = entries[2:4]
    # One transaction over two tables: one commit LSN, a change LSN each (SqlServerOffsetContext).
    assert insert_items["source"]["commit_lsn"] == insert_notes["source"]["commit_lsn"]
    assert insert_items["source"]["change_lsn"] < insert_notes["source"]["change_lsn"]
    assert {"db", "schema", "table", "commit_lsn", "change_lsn", "event_serial_no", "snapshot"} <= set(insert_items["source"])
    assert insert_items["source"]["snapshot"] == "false" and insert_items["source"]["db"] == "testdb"
    assert set(insert_items["offset"]) == {"commit_lsn", "change_lsn", "event_serial_no"}
    assert entries[5]["offset"]["event_serial_no"] == 2  # an update is the change table's two rows

    pipe.script.insert("dbo.items", {"id": 3, "name": "d"})
    resumed = fetched(pipe, spark)
    assert changes(resumed) == [(DATA_CHANGE, "items", "c")]
    pipe.write_config(redeliver=2)
    pipe.script.insert("dbo.items", {"id": 4, "name": "e"})
    again = fetched(pipe, spark)
    # The two steps before the stored offset again, at their own positions, then the new one.
    assert changes(again) == [(DATA_CHANGE, "items", "d"), (DATA_CHANGE, "items", "c"), (DATA_CHANGE, "items", "c")]
    assert [entry["source"] for entry in again[:2]] == [entries[-1]["source"], resumed[0]["source"]]


def oracle_changes(script) -> None:
    script.ddl("DEBEZIUM.ITEMS", 'CREATE TABLE "DEBEZIUM"."ITEMS" ("ID" NUMBER(9,0) NOT NULL, "NAME" VARCHAR2(20), '
                                 'PRIMARY KEY ("ID"))')
    script.ddl("DEBEZIUM.NOTES", 'CREATE TABLE "DEBEZIUM"."NOTES" ("NOTE" VARCHAR2(50))')
    with script.transaction():
        script.redo("DEBEZIUM.ITEMS", """insert into "DEBEZIUM"."ITEMS"("ID","NAME") values ('1','a');""")
        script.redo("DEBEZIUM.NOTES", """insert into "DEBEZIUM"."NOTES"("NOTE") values ('first');""")
    script.redo("DEBEZIUM.ITEMS", """insert into "DEBEZIUM"."ITEMS"("ID","NAME") values ('2','b');""")
    script.redo("DEBEZIUM.ITEMS", """update "DEBEZIUM"."ITEMS" set "NAME" = 'c' where "ID" = '1' and "NAME" = 'a';""")
    script.redo("DEBEZIUM.ITEMS", """delete from "DEBEZIUM"."ITEMS" where "ID" = '2' and "NAME" = 'b';""")


def test_oracle_events_are_the_connectors_and_a_run_resumes_after_its_offset(destination_pg, spark, tmp_path,
                                                                               monkeypatch):
    pipe = new_scripted_pipeline("oracle", destination_pg, tmp_path, monkeypatch,
                                 tables=["DEBEZIUM.ITEMS", "DEBEZIUM.NOTES"])
    oracle_changes(pipe.script)
    bracketed = fetched(pipe, spark, markers=True)
    # The script's transaction of two inserts, then one change each, as the connector brackets them.
    assert transactions(bracketed) == [2, 1, 1, 1]
    entries = [entry for entry in bracketed if entry["kind"] != TRANSACTION]
    assert changes(entries) == [(SCHEMA_CHANGE, "ITEMS", "CREATE"), (SCHEMA_CHANGE, "NOTES", "CREATE"),
                                (DATA_CHANGE, "ITEMS", "c"), (DATA_CHANGE, "NOTES", "c"), (DATA_CHANGE, "ITEMS", "c"),
                                (DATA_CHANGE, "ITEMS", "u"), (DATA_CHANGE, "ITEMS", "d")]
    create_items, create_notes = (entry["change"] for entry in entries[:2])
    # OracleSchemaChangeEventEmitter: the DDL text, and the table OracleDdlParser made of it.
    assert create_items["ddl"].startswith('CREATE TABLE "DEBEZIUM"."ITEMS"')
    table = create_items["tableChanges"][0]["table"]
    assert table["primaryKeyColumnNames"] == ["ID"] and create_notes["tableChanges"][0]["table"]["primaryKeyColumnNames"] == []
    assert [(c["name"], c["typeName"], c["length"], c["scale"], c["optional"]) for c in table["columns"]] == [
        ("ID", "NUMBER", 9, 0, False), ("NAME", "VARCHAR2", 20, None, True)]
    insert_items, insert_notes = entries[2:4]
    # One transaction over two tables: one id and commit SCN, an SCN and a sequence each (OracleOffsetContext).
    assert insert_items["source"]["txId"] == insert_notes["source"]["txId"]
    assert insert_items["source"]["commit_scn"] == insert_notes["source"]["commit_scn"]
    assert [insert_items["source"]["txSeq"], insert_notes["source"]["txSeq"]] == [1, 2]
    assert {"db", "schema", "table", "scn", "commit_scn", "txId", "snapshot"} <= set(insert_items["source"])
    assert insert_items["source"]["snapshot"] == "false" and insert_items["source"]["db"] == "ORCLPDB1"
    assert set(insert_items["offset"]) == {"scn", "commit_scn", "txId", "txSeq"}

    pipe.script.redo("DEBEZIUM.ITEMS", """insert into "DEBEZIUM"."ITEMS"("ID","NAME") values ('3','d');""")
    resumed = fetched(pipe, spark)
    assert changes(resumed) == [(DATA_CHANGE, "ITEMS", "c")]
    pipe.write_config(redeliver=2)
    pipe.script.redo("DEBEZIUM.ITEMS", """insert into "DEBEZIUM"."ITEMS"("ID","NAME") values ('4','e');""")
    again = fetched(pipe, spark)
    assert changes(again) == [(DATA_CHANGE, "ITEMS", "d"), (DATA_CHANGE, "ITEMS", "c"), (DATA_CHANGE, "ITEMS", "c")]
    assert [entry["source"] for entry in again[:2]] == [entries[-1]["source"], resumed[0]["source"]]


def sqlserver_add_column(script) -> None:
    script.alter_table("dbo.items", [*SQLSERVER_ITEMS, sqlserver_column("qty", "int", 10, 0)], primary_key=["id"],
                       capture="dbo_items_v2")
    with script.transaction():
        script.insert("dbo.items", {"id": 5, "name": "x", "qty": 3})
        script.insert("dbo.notes", {"note": "second"})


def oracle_add_column(script) -> None:
    script.ddl("DEBEZIUM.ITEMS", 'ALTER TABLE "DEBEZIUM"."ITEMS" ADD "QTY" NUMBER(5,0)')
    with script.transaction():
        script.redo("DEBEZIUM.ITEMS", """insert into "DEBEZIUM"."ITEMS"("ID","NAME","QTY") values ('5','x','3');""")
        script.redo("DEBEZIUM.NOTES", """insert into "DEBEZIUM"."NOTES"("NOTE") values ('second');""")


SYNC_CASES = {
    "sqlserver": (["dbo.items", "dbo.notes"], sqlserver_changes, sqlserver_add_column),
    "oracle": (["DEBEZIUM.ITEMS", "DEBEZIUM.NOTES"], oracle_changes, oracle_add_column),
}


@pytest.mark.parametrize("source_type", SYNC_CASES)
def test_sync_lands_rows_takes_a_column_added_later_and_skips_redelivered_changes(source_type, destination_pg, spark,
                                                                                   tmp_path, monkeypatch):
    tables, first_changes, add_column = SYNC_CASES[source_type]
    pipe = new_scripted_pipeline(source_type, destination_pg, tmp_path, monkeypatch, tables=tables)
    first_changes(pipe.script)
    pipe.sync()
    assert pipe.dest_rows("items") == [(1, "c")] and pipe.dest_rows("notes") == [("first",)]
    before = pipe.stored_offset()
    add_column(pipe.script)
    pipe.sync()
    assert pipe.dest_rows("items") == [(1, "c", None), (5, "x", 3)]
    assert pipe.dest_rows("notes") == [("first",), ("second",)]
    # A crash between the second run's commit and its offset's flush: the connector gives its changes again.
    pipe.set_stored_offset(before)
    redelivered = pipe.sync()["redelivered"]
    assert pipe.dest_rows("items") == [(1, "c", None), (5, "x", 3)]
    assert redelivered == 3
    assert pipe.dest_rows("notes") == [("first",), ("second",)]
    if source_type == "oracle":
        # Oracle logs DROP TABLE (SQL Server's capture instances give no drop): Debezium's DROP change drops the
        # destination table, and the other one stays.
        pipe.script.ddl("DEBEZIUM.NOTES", 'DROP TABLE "DEBEZIUM"."NOTES"')
        pipe.sync()
        assert pipe.dest_query("SELECT to_regclass(%s)", (f"{pipe.dest_schema}.notes",)) == [(None,)]
        assert pipe.dest_rows("items") == [(1, "c", None), (5, "x", 3)]


def test_a_sqlserver_run_refuses_to_resume_past_changes_the_cleanup_job_removed(destination_pg, spark, tmp_path,
                                                                                  monkeypatch):
    """Debezium's SQL Server connector resumes from the change table's oldest row when the cleanup job passed its
    offset, skipping what was removed without a word: the run asks the source first (its recorded answers) and
    fails naming the loss and its remedy; once the source has no such loss, the same run resumes."""
    import pymssql

    from cdc_pipeline.errors import CdcError
    from tests.fixtures.recorded import recorded_server

    orders = [sqlserver_column("id", "int", 10, 0, optional=False), sqlserver_column("name", "nvarchar", 20)]
    pipe = new_scripted_pipeline("sqlserver", destination_pg, tmp_path, monkeypatch, tables=["dbo.orders"])
    pipe.script.create_table("dbo.orders", orders, primary_key=["id"])
    pipe.script.insert("dbo.orders", {"id": 1, "name": "a"})
    pipe.sync()
    pipe.script.insert("dbo.orders", {"id": 2, "name": "b"})
    server = recorded_server(monkeypatch, pymssql, "sqlserver")
    server.scenario = "out_of_retention"
    with pytest.raises(CdcError, match=r"fell out of the change tables' retention.*dbo_orders.*restart"):
        pipe.sync()
    assert pipe.dest_rows("orders") == [(1, "a")]
    server.scenario = "new_capture_instance"
    pipe.sync()
    assert pipe.dest_rows("orders") == [(1, "a"), (2, "b")]


@pytest.mark.parametrize("source_type", SYNC_CASES)
def test_a_quiet_source_moves_the_stored_offset_by_debeziums_heartbeat(source_type, destination_pg, spark, tmp_path,
                                                                        monkeypatch):
    """Once the script is played out the task dispatches Debezium's heartbeat as the connector's streaming source
    does: a quiet stretch moves the offset context (SQL Server: the max LSN read; Oracle: the SCN mining reached) and
    the heartbeat record carries it. The run applies and counts nothing, ends idle, and the engine's stored offset
    (the runner commits a batch of heartbeats itself) is the quiet position, which the change check starts from."""
    import json

    import psycopg

    from cdc_pipeline.control import BatchCounts
    from cdc_pipeline.ops import pending
    from cdc_pipeline.sources import module_for

    tables, first_changes, _ = SYNC_CASES[source_type]
    pipe = new_scripted_pipeline(source_type, destination_pg, tmp_path, monkeypatch, tables=tables)
    pipe.write_config(heartbeat_interval_seconds=0.5)
    first_changes(pipe.script)
    pipe.sync()
    assert pipe.dest_rows("items") == [(1, "c")]
    quiet_position = pipe.script.quiet()
    summary = pipe.sync()
    assert not summary.get("budget_spent") and all(summary[name] == 0 for name in BatchCounts.COUNTERS), summary
    assert pipe.dest_rows("items") == [(1, "c")]
    stored = json.loads(pipe.stored_offset())
    position_key = "commit_lsn" if source_type == "sqlserver" else "scn"
    assert stored[position_key] == quiet_position, stored
    with psycopg.connect(pipe.dest_dsn) as conn:
        checked = pending.checked_offset(conn, "cdc", pipe.name, module_for(source_type))
    assert checked[position_key] == quiet_position, checked


BANK_ACCOUNTS = 20


def _bank_change(script, source_type: str, balances: dict[int, int], moves: dict[int, int]) -> None:
    """One source transaction moving money between accounts (`moves`: account -> amount added; they sum to 0)."""
    with script.transaction():
        for account, amount in moves.items():
            before, after = balances[account], balances[account] + amount
            if source_type == "sqlserver":
                script.update("dbo.accounts", {"id": account, "balance": before}, {"id": account, "balance": after})
            else:
                script.redo("DEBEZIUM.ACCOUNTS", f"""update "DEBEZIUM"."ACCOUNTS" set "BALANCE" = '{after}' """
                                                 f"""where "ID" = '{account}' and "BALANCE" = '{before}';""")
            balances[account] = after


def _scripted_bank(source_type: str, destination_pg, tmp_path, monkeypatch) -> tuple[ScriptedPipeline, dict[int, int]]:
    """A scripted connector of `source_type` whose accounts table (BANK_ACCOUNTS accounts of 100) is synced, every
    destination commit then audited, in groups of 10 events at most; the pipeline and the balances."""
    table = "dbo.accounts" if source_type == "sqlserver" else "DEBEZIUM.ACCOUNTS"
    pipe = new_scripted_pipeline(source_type, destination_pg, tmp_path, monkeypatch, tables=[table])
    pipe.write_config(batch_size=4, apply_batch_events=10)
    script = pipe.script
    if source_type == "sqlserver":
        script.create_table(table, [sqlserver_column("id", "int", 10, 0, optional=False),
                                    sqlserver_column("balance", "int", 10, 0, optional=False)], primary_key=["id"])
    else:
        script.ddl(table, 'CREATE TABLE "DEBEZIUM"."ACCOUNTS" ("ID" NUMBER(9,0) NOT NULL, '
                          '"BALANCE" NUMBER(9,0) NOT NULL, PRIMARY KEY ("ID"))')
    with script.transaction():
        for account in range(1, BANK_ACCOUNTS + 1):
            if source_type == "sqlserver":
                script.insert(table, {"id": account, "balance": 100})
            else:
                script.redo(table, f"""insert into "DEBEZIUM"."ACCOUNTS"("ID","BALANCE") values ('{account}','100');""")
    pipe.sync()
    audit_commits(pipe.dest_dsn, f'"{pipe.dest_schema}".accounts')
    return pipe, dict.fromkeys(range(1, BANK_ACCOUNTS + 1), 100)


@pytest.mark.parametrize("source_type", SYNC_CASES)
def test_a_scripted_transaction_larger_than_a_group_commits_once(source_type, destination_pg, spark, tmp_path,
                                                                  monkeypatch, caplog):
    pipe, balances = _scripted_bank(source_type, destination_pg, tmp_path, monkeypatch)
    script = pipe.script
    everyone = {account: 3 if account % 2 else -3 for account in balances}  # one change of every account
    _bank_change(script, source_type, balances, everyone)
    for index in range(6):
        _bank_change(script, source_type, balances, {1 + index: -(index + 1), 11 + index: index + 1})
    _bank_change(script, source_type, balances, {account: -amount for account, amount in everyone.items()})

    with caplog.at_level(logging.INFO, logger="cdc_pipeline"):
        pipe.sync()

    assert sorted(pipe.dest_rows("accounts")) == sorted(balances.items())
    totals = totals_committed(pipe.dest_dsn)
    assert totals and set(totals) == {100 * BANK_ACCOUNTS}, f"a commit held part of a source transaction: {totals}"
    spanned = [record.getMessage() for record in caplog.records if "spanned" in record.getMessage()]
    assert len(spanned) == 2, f"each whole-table transaction spans groups and commits once: {spanned}"


@pytest.mark.parametrize("source_type", SYNC_CASES)
def test_a_kill_inside_a_scripted_spanning_transaction_leaves_the_previous_commit(source_type, destination_pg, spark,
                                                                                 tmp_path, monkeypatch):
    """A `cdc-pipeline sync` killed (SIGKILL) inside the third group: a transfer committed in the first, and the
    second and third are parts of one whole-table transaction (22 events in groups of 10). The destination is left
    at the transfer's commit, and the next run applies the whole transaction."""
    pipe, balances = _scripted_bank(source_type, destination_pg, tmp_path, monkeypatch)
    _bank_change(pipe.script, source_type, balances, {1: -7, 2: 7})
    after_transfer = dict(balances)
    _bank_change(pipe.script, source_type, balances, {account: 3 if account % 2 else -3 for account in balances})
    pipe.script.write()

    kill_at(pipe.name, f"{faults.IN_TRANSACTION}@3", tmp_path / "paused")

    assert dict(pipe.dest_rows("accounts")) == after_transfer, \
        "the destination is at the transfer's commit, nothing of the transaction the kill cut"
    assert set(totals_committed(pipe.dest_dsn)) == {100 * BANK_ACCOUNTS}
    pipe.sync()
    assert dict(pipe.dest_rows("accounts")) == balances
    assert set(totals_committed(pipe.dest_dsn)) == {100 * BANK_ACCOUNTS}, "no commit held part of a transaction"
