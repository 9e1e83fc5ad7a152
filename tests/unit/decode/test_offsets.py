"""Offset shapes per connector type: what set-offset and start_offset accept, and how they say what is wrong."""

from __future__ import annotations

import json

import pytest

from cdc_pipeline.decode.offsets import OffsetError, offset_key, parse_offset


def test_a_binlog_offset_as_debezium_writes_it_is_accepted():
    offset = {"ts_sec": 1700000000, "file": "mariadb-bin.000001", "pos": 3165, "row": 1, "server_id": 1, "event": 2,
              "gtids": "0-1-10"}
    assert parse_offset(json.dumps(offset), "inventory", "mariadb") == offset


@pytest.mark.parametrize("connector_type, offset", [
    # SqlServerOffsetContext.getOffset (Debezium 3.5): streaming; after a poll without a change (change_lsn null,
    # serial 0); during the snapshot ("snapshot": the SnapshotType's name).
    ("sqlserver", {"commit_lsn": "0000002c:00000a38:0005", "change_lsn": "0000002c:00000a38:0004",
                   "event_serial_no": 2, "transaction_id": "0000002c:00000a38:0005"}),
    ("sqlserver", {"commit_lsn": "0000002c:00000b10:0001", "change_lsn": None, "event_serial_no": 0}),
    ("sqlserver", {"snapshot": "INITIAL", "snapshot_completed": False, "commit_lsn": "0000002c:00000a38:0005",
                   "change_lsn": None, "event_serial_no": 0}),
    # OracleOffsetContext.getOffset: a record of a transaction on two redo threads (CommitScn's list); the offset
    # after the snapshot (HybridMiningStrategyIT's); a first streamed record before any commit (commit_scn null).
    ("oracle", {"scn": "289100", "commit_scn": "289120:1:0a001b00,289118:2:", "txId": "0c000200", "txSeq": 3}),
    ("oracle", {"commit_scn": "1001:1:", "snapshot_scn": "1001", "scn": "1001", "snapshot_completed": True}),
    ("oracle", {"scn": "1001", "commit_scn": None, "txId": "0a000100", "txSeq": 1, "snapshot_scn": "1001"}),
])
def test_sqlserver_and_oracle_offsets_as_debezium_writes_them_are_accepted(connector_type, offset):
    # The keys of the transaction metadata (`transaction_id`, ...) are left out: the engine resumes outside any.
    assert parse_offset(json.dumps(offset), "c", connector_type) == {
        key: value for key, value in offset.items() if not key.startswith("transaction_")}


def test_an_offset_copied_from_the_engines_store_is_accepted_without_its_transaction_metadata():
    stored = {"file": "mariadb-bin.000001", "pos": 2840, "row": 1, "event": 2, "gtids": "0-1-13",
              "transaction_id": "0-1-13", "transaction_data_collection_order_shop.items": 1}
    assert parse_offset(json.dumps(stored), "c", "mariadb") == {
        "file": "mariadb-bin.000001", "pos": 2840, "row": 1, "event": 2, "gtids": "0-1-13"}


def test_offset_shapes_per_connector_type():
    assert parse_offset('{"lsn": 24023128, "txId": 555}', "pg", "postgres") == {"lsn": 24023128, "txId": 555}
    for text, message in (('{"file": "f.1", "pos": -1}', "must not be negative"),
                          ('{"file": "f.1", "pos": "12"}', "'pos' must be int"),
                          ('{"file": "f.1", "pos": true}', "'pos' must be int"),
                          ('[1, 2]', "must be a JSON object"),
                          ('{"file": "", "pos": 1}', "must not be empty")):
        with pytest.raises(OffsetError, match=message) as error:
            parse_offset(text, "inventory", "mariadb")
        assert "connector 'inventory'" in str(error.value)
    with pytest.raises(OffsetError, match="lacks commit_lsn"):
        parse_offset('{"lsn": 5}', "mssql", "sqlserver")


def test_offset_keys_name_the_engine_and_the_source_partition():
    assert offset_key("inventory", "mariadb", "shop") == '["inventory",{"server":"inventory"}]'
    assert offset_key("pg", "postgres", "shop") == '["pg",{"server":"pg"}]'
    assert offset_key("ora", "oracle", "ORCLPDB1") == '["ora",{"server":"ora"}]'
    assert json.loads(offset_key("mssql", "sqlserver", "sales")) == ["mssql", {"server": "mssql", "database": "sales"}]
