"""Offset shapes per connector type: what set-offset and start_offset accept, and how they say what is wrong."""

from __future__ import annotations

import json

import pytest

from cdc_pipeline.decode.offsets import OffsetError, offset_key, parse_offset


def test_a_binlog_offset_as_debezium_writes_it_is_accepted():
    offset = {"ts_sec": 1700000000, "file": "mariadb-bin.000001", "pos": 3165, "row": 1, "server_id": 1, "event": 2,
              "gtids": "0-1-10"}
    assert parse_offset(json.dumps(offset), "inventory", "mariadb") == offset


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
