"""The runner's index entries (made in Java next to each JSON line) agree with the lines they index."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from cdc_pipeline import cycle
from cdc_pipeline.config import load_config
from cdc_pipeline.decode.events import DATA_CHANGE, SCHEMA_CHANGE, TRUNCATE
from tests.helpers.spark import index_entry

pytestmark = pytest.mark.integration


def test_index_entries_describe_their_lines(pipeline, spark):
    # Under `skip` a batch keeps its records: an event's whole line is made on demand (a dead letter's).
    pipeline.write_config(error_strategy="skip")
    pipeline.source(["CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10), d DECIMAL(30,10))",
                     "INSERT INTO t VALUES (1, 'a', 1.5), (2, 'b', NULL)"])
    pipeline.sync()
    pipeline.source(["INSERT INTO t VALUES (3, 'c', 123456789012345678.0123456789)",
                     "UPDATE t SET v = 'z' WHERE id = 1", "DELETE FROM t WHERE id = 2",
                     "ALTER TABLE t ADD COLUMN w INT", "TRUNCATE TABLE t"])
    config = load_config()
    with cycle.ConnectorSession(config.connector(pipeline.name), config.destination, spark) as session:
        batches = [batch for group in cycle.fetch_batches(session) for batch in group]
        entries = [entry for batch in batches for entry in batch.index]
        lines = [str(line) for batch in batches for line in batch.java_batch.lines()]
        data_lines = [str(line) for batch in batches for line in batch.data_lines()]
        by_seq = [str(batch.line(entry["seq"])) for batch in batches for entry in batch.index]
    assert entries == [index_entry(line) for line in lines]
    assert by_seq == lines
    # The lines Spark parses: a data change's seq, schema id, op and row images, as in its whole line.
    whole = [line for line, entry in zip(lines, entries) if entry["kind"] == DATA_CHANGE]
    assert [json.loads(line) for line in data_lines] == [
        {"seq": event["seq"], "schema": event["schema"],
         "value": {key: event["value"][key] for key in ("op", "before", "after")}}
        for event in map(json.loads, whole)]
    assert len(whole) == 3 and all(len(data) < len(line) / 2 for data, line in zip(data_lines, whole))
    kinds = Counter((entry["kind"], entry.get("op"), entry.get("table")) for entry in entries)
    table = f"{pipeline.source_db}.t"
    assert kinds[(DATA_CHANGE, "c", table)] == 1 and kinds[(DATA_CHANGE, "u", table)] == 1
    assert kinds[(DATA_CHANGE, "d", table)] == 1 and kinds[(TRUNCATE, "t", table)] == 1
    alter = [entry for entry in entries if entry["kind"] == SCHEMA_CHANGE and "ALTER" in entry["change"]["ddl"]]
    assert len(alter) == 1 and alter[0]["change"]["tableChanges"][0]["type"] == "ALTER"
    assert all(entry["offset"]["file"].startswith("mariadb-bin") for entry in entries)


def test_batches_keep_no_records_unless_dead_letters_may_need_them(pipeline, spark):
    """Under the default error strategy a batch keeps its lines and index, not its records (which the JVM's collector
    would copy while they are in flight): no whole line is made, and completing a batch still moves the engine's
    offset to its last event."""
    pipeline.source(["CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO t VALUES (1, 'a')"])
    pipeline.sync()
    pipeline.source([f"INSERT INTO t VALUES ({n}, 'b')" for n in range(2, 40)] + ["UPDATE t SET v = 'c'"])
    config = load_config()
    with cycle.ConnectorSession(config.connector(pipeline.name), config.destination, spark) as session:
        batches = [batch for group in cycle.fetch_batches(session) for batch in group]
        assert sum(batch.size for batch in batches) == len([e for b in batches for e in b.index]) > 39
        assert all(batch.line(entry["seq"]) is None for batch in batches for entry in batch.index)
        with pytest.raises(Exception, match="keeps no records"):
            batches[0].java_batch.lines()
        last = batches[-1].index[-1]["offset"]
        for batch in batches:
            session.runner.mark_complete(batch.batch_id)
    stored = pipeline.dest_query(
        "SELECT offset_value FROM cdc.debezium_offsets WHERE connector = %s", (pipeline.name,))
    assert json.loads(stored[0][0])["pos"] == last["pos"]


def test_row_changes_of_one_table_share_a_binlog_offset_only_as_a_key_updates_delete_and_create(pipeline, spark):
    """What `StreamRedeliveries` relies on to tell repeats that begin at the last offset taken: at one binlog offset,
    no two streamed row changes have the same op and table (a key update's delete and create share one)."""
    pipeline.source(["CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", "CREATE TABLE n (v VARCHAR(10))",
                     "INSERT INTO t VALUES (1, 'a')"])
    pipeline.sync()
    pipeline.source(["INSERT INTO t VALUES (2, 'b'), (3, 'c'), (4, 'd'), (5, 'e')",
                     "INSERT INTO n VALUES ('x'), ('x'), ('x')",
                     "UPDATE t SET v = 'z' WHERE id <= 3", "UPDATE n SET v = 'y'",
                     "UPDATE t SET id = id + 10 WHERE id >= 4",
                     "DELETE FROM t WHERE id <= 2", "DELETE FROM n"])
    config = load_config()
    with cycle.ConnectorSession(config.connector(pipeline.name), config.destination, spark) as session:
        entries = [entry for group in cycle.fetch_batches(session) for batch in group for entry in batch.index
                   if entry["kind"] == DATA_CHANGE]
    changes: dict[str, list[tuple[str, str]]] = {}
    for entry in entries:
        changes.setdefault(json.dumps(entry["offset"], sort_keys=True), []).append((entry["op"], entry["table"]))
    assert len(entries) == 4 + 3 + 3 + 3 + 2 * 2 + 2 + 3
    assert all(len(set(at)) == len(at) for at in changes.values()), changes
    table = f"{pipeline.source_db}.t"
    assert sorted(at for at in changes.values() if len(at) > 1) == [[("d", table), ("c", table)]] * 2
