"""The runner's index entries and rows (made in Java) agree with the whole JSON lines of the events."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from cdc_pipeline import cycle
from cdc_pipeline.config import load_config
from cdc_pipeline.capture.runner import merge_batches
from cdc_pipeline.capture.spark import batch_dataframe
from cdc_pipeline.decode.events import DATA_CHANGE, SCHEMA_CHANGE, TRUNCATE, parse_events, row_events, row_lines
from tests.helpers.spark import index_entry

pytestmark = pytest.mark.integration


def test_index_entries_describe_their_lines_and_rows_read_as_the_lines_parse(pipeline, spark):
    # Under `skip` a batch keeps its records: an event's whole line is made on demand (a dead letter's).
    pipeline.write_config(error_strategy="skip")
    pipeline.source(["CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10), d DECIMAL(30,10))",
                     "INSERT INTO t VALUES (1, 'a', 1.5), (2, 'b', NULL)",
                     "CREATE TABLE kinds (id INT PRIMARY KEY, f FLOAT, g DOUBLE, b VARBINARY(8), bits BIT(10), "
                     "j JSON, e ENUM('x','y'), s SET('p','q'), dt DATE, ts DATETIME(6), tm TIME(3), stamp TIMESTAMP(3), "
                     "y YEAR, p POINT, txt TEXT, small TINYINT, big BIGINT UNSIGNED, yes BOOLEAN, n DECIMAL(5,2))"])
    pipeline.sync()
    pipeline.source(["INSERT INTO t VALUES (3, 'c', 123456789012345678.0123456789)",
                     "UPDATE t SET v = 'z' WHERE id = 1", "DELETE FROM t WHERE id = 2",
                     "INSERT INTO kinds VALUES (1, 0.1, 1e300, x'00ff10', b'1010000001', '{\"a\": [1.50, \"b\"]}', "
                     "'y', 'p,q', '2024-02-29', '1999-12-31 23:59:59.123456', '-838:59:59.000', "
                     "'2038-01-19 03:14:07.999', 2155, POINT(1.5, -2.25), 'é \"q\" \\\\ \\n', -128, "
                     "18446744073709551615, TRUE, -999.99)",
                     "INSERT INTO kinds (id, f, g) VALUES (2, 3.4e38, -1.5e-300)",
                     "INSERT INTO kinds (id) VALUES (3)", "UPDATE kinds SET f = 1e-7, txt = '' WHERE id = 3",
                     "ALTER TABLE t ADD COLUMN w INT", "TRUNCATE TABLE t"])
    config = load_config()
    with cycle.ConnectorSession(config.connector(pipeline.name), config.destination, spark) as session:
        batches = [batch for group in cycle.fetch_batches(session) for batch in group]
        entries = [entry for batch in batches for entry in batch.index]
        lines = [str(line) for batch in batches for line in batch.java_batch.lines()]
        by_seq = [str(batch.line(entry["seq"])) for batch in batches for entry in batch.index]
        merged = merge_batches(batches, session.jvm)
        rows = row_events(batch_dataframe(spark, merged), merged)
        images = ["seq", "schema_id", "op", "before", "after", "malformed"]
        from_rows = [row.asDict() for row in rows.events.select(images).orderBy("seq").collect()]
        from_lines = [row.asDict() for row in parse_events(
            spark.createDataFrame([(line,) for line in lines], "line string"), merged).events.where(
                "op IN ('c', 'r', 'u', 'd')").select(images).orderBy("seq").collect()]
        # What a dead letter keeps of an event whose batch keeps no records: its row written as a line.
        from_row_lines = [row.asDict() for row in parse_events(row_lines(rows.events).select("line"), merged).events.select(
            images).orderBy("seq").collect()]
    assert entries == [index_entry(line) for line in lines]
    assert by_seq == lines
    # The rows Spark reads, a data change's seq, schema id, op and row images, are what its whole line parses to.
    assert len(from_rows) == 7 and from_rows == from_lines
    kinds = {row["after"]["id"]: row["after"] for row in from_rows if row["after"] and "bits" in row["after"]}
    assert kinds["1"]["f"] == "0.1" and kinds["1"]["g"] == "1.0E300" and kinds["1"]["b"] == "AP8Q"
    assert kinds["2"]["f"] == "3.4E38" and kinds["2"]["g"] == "-1.5E-300" and kinds["2"]["txt"] is None
    assert kinds["1"]["big"] == "18446744073709551615" and kinds["1"]["n"] == "-999.99"
    assert json.loads(kinds["1"]["p"])["x"] == 1.5
    assert from_row_lines == from_rows
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
