"""Unit tests for cdc_pipeline.decode.events: the runner's JSON lines of real captured MariaDB events, parsed in Spark."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from pyspark.sql import SparkSession

from cdc_pipeline.decode.events import (
    StreamRedeliveries,
    DATA_CHANGE,
    OTHER,
    SCHEMA_CHANGE,
    ParsedBatch,
    parse_events,
    redelivery_test,
    row_image_fields,
)
from tests.helpers.spark import all_events_batch, fetched_batch, fixture_records, get_spark

PRODUCTS_SEQS = [7, 8, 9, 10, 11, 12, 24]
CUSTOMERS_SEQS = [15, 16, 18, 20, 22]


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return get_spark()


@pytest.fixture(scope="module")
def parsed(spark: SparkSession) -> ParsedBatch:
    return all_events_batch()


def expected_kind(record: dict) -> str:
    payload = (record.get("value") or {}).get("payload")
    if payload is None:
        return OTHER
    return SCHEMA_CHANGE if "ddl" in payload else DATA_CHANGE


def test_every_line_gives_one_ref_of_the_right_kind(parsed: ParsedBatch) -> None:
    records = fixture_records()
    assert [ref.seq for ref in parsed.refs] == list(range(1, len(records) + 1))
    assert [ref.kind for ref in parsed.refs] == [expected_kind(record) for record in records]
    assert Counter(ref.kind for ref in parsed.refs) == {SCHEMA_CHANGE: 12, DATA_CHANGE: 12, OTHER: 1}


def test_tombstone_is_other_without_table_or_schema(parsed: ParsedBatch) -> None:
    tombstone = parsed.refs[12]
    assert (tombstone.seq, tombstone.kind, tombstone.op) == (13, OTHER, None)
    assert tombstone.source_table is None and tombstone.schema_id is None
    assert tombstone.position == {}


def test_data_changes_name_their_source_table_and_op(parsed: ParsedBatch) -> None:
    by_table: dict[str, list[int]] = {}
    for ref in parsed.refs:
        if ref.kind == DATA_CHANGE:
            by_table.setdefault(ref.source_table, []).append(ref.seq)
        else:
            assert ref.source_table is None
    assert by_table == {"inventory.products": PRODUCTS_SEQS, "inventory.customers": CUSTOMERS_SEQS}
    ops = {ref.seq: ref.op for ref in parsed.refs if ref.kind == DATA_CHANGE}
    assert [ops[seq] for seq in PRODUCTS_SEQS] == ["r", "r", "r", "c", "u", "d", "u"]
    assert [ops[seq] for seq in CUSTOMERS_SEQS] == ["c", "c", "c", "u", "c"]


def test_refs_are_sorted_by_seq_and_row_images_parse_whatever_the_order(spark: SparkSession) -> None:
    batch, lines = fetched_batch(fixture_records())
    data_lines = [line for line, entry in zip(lines, batch.index) if entry["kind"] == DATA_CHANGE]
    batch.index.reverse()
    shuffled = spark.createDataFrame([(line,) for line in reversed(data_lines)], "line string").repartition(3)
    reparsed = parse_events(shuffled, batch)
    try:
        assert [ref.seq for ref in reparsed.refs] == list(range(1, len(lines) + 1))
        assert sorted(row.seq for row in reparsed.events.collect()) == PRODUCTS_SEQS[:6] + CUSTOMERS_SEQS[:4] + [
            CUSTOMERS_SEQS[4], PRODUCTS_SEQS[6]]
    finally:
        reparsed.release()


def test_schema_change_carries_ddl_and_table_changes(parsed: ParsedBatch) -> None:
    alter = parsed.refs[16].schema_change
    assert alter is not None
    assert alter["ddl"] == "ALTER TABLE customers ADD COLUMN score DECIMAL(6,2) DEFAULT 0"
    assert alter["databaseName"] == "inventory"
    assert isinstance(alter["tableChanges"], list) and len(alter["tableChanges"]) == 1
    table_change = alter["tableChanges"][0]
    assert (table_change["type"], table_change["id"]) == ("ALTER", '"inventory"."customers"')
    assert [column["name"] for column in table_change["table"]["columns"]] == ["id", "email", "score"]
    assert alter["source"]["snapshot"] == "false" and alter["source"]["pos"] == "4553"
    set_statement = parsed.refs[0].schema_change
    assert set_statement is not None and set_statement["tableChanges"] == []
    assert all(ref.schema_change is None for ref in parsed.refs if ref.kind != SCHEMA_CHANGE)


def test_position_names_binlog_file_pos_and_row(parsed: ParsedBatch) -> None:
    assert parsed.refs[15].position == {
        "file": "mariadb-bin.000001", "pos": "4421", "row": "1", "gtid": "0-1-14", "snapshot": "false",
    }
    snapshot_row = parsed.refs[6].position
    assert snapshot_row == {"file": "mariadb-bin.000001", "pos": "2834", "row": "0", "snapshot": "first"}


def test_schema_ids_change_with_the_table_schema(parsed: ParsedBatch) -> None:
    schema_ids = {ref.seq: ref.schema_id for ref in parsed.refs}
    assert len({schema_ids[seq] for seq in PRODUCTS_SEQS[:6]}) == 1
    assert schema_ids[24] != schema_ids[7]
    assert len({schema_ids[seq] for seq in (15, 18, 20, 22)}) == 4
    assert schema_ids[15] == schema_ids[16]
    assert set(parsed.batch.schemas) == {schema_id for schema_id in schema_ids.values() if schema_id}


def test_row_images_keep_json_values_as_text(parsed: ParsedBatch) -> None:
    rows = {row.seq: row for row in parsed.events.where("seq IN (7, 12, 18)").collect()}
    first = rows[7].after
    assert first["id"] == "1" and first["weight"] == "3.14" and first["created_at"] == "1704164645678"
    assert first["price"] == "19.99" and json.loads(first["attrs"]) == {"color": "red", "sizes": [1, 2]}
    assert rows[12].op == "d" and rows[12].after is None and rows[12].before["name"] == "car battery"
    assert rows[18].after == {"id": "3", "email": "c@x.io", "score": "4.50"}
    assert {row.batch_id for row in rows.values()} == {str(parsed.batch_id)}
    assert parsed.refs[6].offset["pos"] == 2834


def test_only_data_changes_have_row_images(parsed: ParsedBatch) -> None:
    seqs = sorted(row.seq for row in parsed.events.select("seq").collect())
    assert seqs == sorted(ref.seq for ref in parsed.refs if ref.kind == DATA_CHANGE)


def test_row_image_fields_give_columns_with_logical_names(parsed: ParsedBatch) -> None:
    fields = parsed.fields(parsed.refs[6].schema_id)
    assert [(field.name, field.type, field.logical) for field in fields] == [
        ("id", "int32", None),
        ("name", "string", None),
        ("price", "string", None),
        ("created_at", "int64", "io.debezium.time.Timestamp"),
        ("release_date", "int32", "io.debezium.time.Date"),
        ("attrs", "string", None),
        ("image", "string", None),
        ("status", "string", "io.debezium.data.Enum"),
        ("flags", "bytes", "io.debezium.data.Bits"),
        ("weight", "double", None),
    ]
    by_name = {field.name: field for field in fields}
    assert by_name["flags"].parameters == {"length": "8"}
    assert by_name["status"].parameters == {"allowed": "active,discontinued,draft"}
    assert not by_name["id"].optional and by_name["price"].optional


def test_row_image_fields_follow_the_schema_version_and_image(parsed: ParsedBatch) -> None:
    altered = parsed.batch.schemas[parsed.refs[23].schema_id]
    assert [field.name for field in row_image_fields(altered)][-1] == "note"
    assert row_image_fields(altered, "before") == row_image_fields(altered, "after")
    assert row_image_fields(altered, "no_such_image") == []


def test_postgres_source_table_is_schema_and_table(spark: SparkSession) -> None:
    record = fixture_records("mariadb_insert_c.json")[0]
    record["value"]["payload"]["source"].update({"schema": "public", "table": "orders"})
    batch, lines = fetched_batch([record])
    parsed = parse_events(spark.createDataFrame([(line,) for line in lines], "line string"), batch)
    try:
        assert [(ref.kind, ref.source_table) for ref in parsed.refs] == [(DATA_CHANGE, "public.orders")]
    finally:
        parsed.release()


def test_binlog_records_at_or_before_the_applied_one_are_redelivered() -> None:
    redelivered = redelivery_test({"file": "mariadb-bin.000002", "pos": 400, "event": 2, "row": 1})
    assert redelivered({"file": "mariadb-bin.000002", "pos": 400, "event": 2, "row": 1})
    assert redelivered({"file": "mariadb-bin.000001", "pos": 9000, "event": 5})
    assert not redelivered({"file": "mariadb-bin.000002", "pos": 400, "event": 2, "row": 2})
    assert not redelivered({"file": "mariadb-bin.000010", "pos": 4})
    assert not redelivered({"file": "mariadb-bin.000001", "pos": 4, "snapshot": True}), "snapshots are per table"


def test_postgres_records_of_the_applied_transaction_or_earlier_ones_are_redelivered() -> None:
    # The applied record: transaction 736, after the commit at LSN 2000 of the transaction before it.
    redelivered = redelivery_test({"lsn": 2600, "txId": 736, "lsn_commit": 2000, "lsn_proc": 2600})
    assert redelivered({"lsn": 2500, "txId": 736, "lsn_commit": 2000}), "earlier in the same transaction"
    assert redelivered({"lsn": 2600, "txId": 736, "lsn_commit": 2000}), "the applied record itself"
    assert not redelivered({"lsn": 2700, "txId": 736, "lsn_commit": 2000}), "later in the same transaction"
    # The same transaction re-delivered from an engine start carries an older lsn_commit: txId and lsn decide.
    assert redelivered({"lsn": 2500, "txId": 736, "lsn_commit": 1200})
    assert not redelivered({"lsn": 2650, "txId": 736, "lsn_commit": 1200})
    assert redelivered({"lsn": 1900, "txId": 735, "lsn_commit": 1200}), "a transaction committed before"
    # A transaction committed after the applied one: its changes may have lower LSNs (they interleaved).
    assert not redelivered({"lsn": 2300, "txId": 737, "lsn_commit": 3100})
    assert not redelivered({"lsn": 2300, "txId": 737, "lsn_commit": 2000}), "no commit read since the engine start"
    assert not redelivered({"lsn": 100, "txId": 700, "snapshot": True}), "snapshots are per table"


def test_snapshot_and_unknown_applied_offsets_skip_nothing() -> None:
    assert redelivery_test(None) is None
    assert redelivery_test({"lsn": 10, "txId": 5, "snapshot": True, "last_snapshot_record": True}) is None
    assert redelivery_test({"commit_lsn": "00000027:00000758:0005", "change_lsn": "00000027:00000758:0003",
                            "event_serial_no": 1, "snapshot": "INITIAL", "snapshot_completed": False}) is None
    assert redelivery_test({"scn": "1001", "snapshot": "INITIAL", "snapshot_completed": False}) is None


def test_the_parse_of_another_batch_reuses_the_generated_code(spark: SparkSession) -> None:
    """Nothing batch-specific may be inlined into Spark's generated code: a class compiled anew per batch costs its
    compile, and runs interpreted until the JVM compiles it in turn."""
    from tests.helpers.spark import parse_records

    compilations = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    records = fixture_records()

    def run(batch_id: int) -> list:
        events = parse_records(records, batch_id=batch_id).events
        return events.where("op IS NOT NULL").select("batch_id", "seq", "after").collect()

    run(1)
    before = compilations.getCount()
    rows = run(2)

    assert {row.batch_id for row in rows} == {"2"}
    assert compilations.getCount() == before


def _binlog(file: str, pos: int, event: int = 0, row: int = 0) -> dict:
    return {"file": file, "pos": pos, "event": event, "row": row, "server_id": 1, "ts_sec": 1}


def test_a_record_of_a_reset_renamed_or_other_binlog_stops_the_run_instead_of_counting_as_applied():
    from cdc_pipeline.decode.events import redelivery_test
    from cdc_pipeline.sources import SourceLogChangedError

    applied = _binlog("mariadb-bin.000012", 5000, 1, 3)
    resumed = _binlog("mariadb-bin.000012", 4000, 2)
    test = redelivery_test(applied, resumed, connector="c")

    assert test(_binlog("mariadb-bin.000012", 4000, 2)), "re-delivered from where the engine resumed"
    assert test(_binlog("mariadb-bin.000012", 5000, 1, 3))
    assert not test(_binlog("mariadb-bin.000012", 5000, 1, 4)) and not test(_binlog("mariadb-bin.000013", 4))
    for changed in (_binlog("mariadb-bin.000001", 4),  # RESET MASTER: the files start over
                    _binlog("mariadb-bin.000012", 3000),  # before the transaction the engine resumed from
                    _binlog("mysql-bin.000002", 900)):  # another server's binlog, or a renamed log_bin
        with pytest.raises(SourceLogChangedError, match="the source's binlog changed") as raised:
            test(changed)
        assert raised.value.connector == "c" and "restart NAME always" in str(raised.value)
    # Without a stored offset (it was moved by hand, or lost) only the base name is checked.
    assert redelivery_test(applied)(_binlog("mariadb-bin.000011", 1))


def _row_offset(event: int, row: int, pos: int = 2152, file: str = "mariadb-bin.000001") -> dict:
    return {"file": file, "pos": pos, "event": event, "row": row, "gtids": "0-1-9"}


def test_a_run_skips_the_events_its_reader_gives_again_after_reconnecting_by_itself() -> None:
    taken = StreamRedeliveries(_row_offset(1, 5), connector="c")
    first = [_row_offset(2, row) for row in range(1, 4)] + [_row_offset(3, row) for row in range(1, 3)]
    # The reader reconnects in the middle of the transaction and gives it again from its first event.
    again = [_row_offset(2, row) for row in range(1, 4)] + [_row_offset(3, row) for row in range(1, 3)]
    later = [_row_offset(3, 3), _row_offset(1, 1, pos=9000)]
    assert [taken(offset) for offset in [_row_offset(1, 5), *first, *again, *later]] == (
        [True] + [False] * 5 + [True] * 5 + [False] * 2)


def test_the_records_of_one_statement_sharing_an_offset_are_all_taken() -> None:
    taken = StreamRedeliveries(None)
    drop = {"file": "mariadb-bin.000001", "pos": 700, "event": 1}  # DROP TABLE a, b: two records, one offset
    assert [taken(drop), taken(dict(drop)), taken(_row_offset(1, 1, pos=800))] == [False, False, False]


def test_a_postgres_run_skips_a_transaction_given_again() -> None:
    taken = StreamRedeliveries(None)
    t1 = [{"txId": 7, "lsn": lsn, "lsn_commit": 100} for lsn in (110, 120, 130)]
    t2 = [{"txId": 8, "lsn": lsn, "lsn_commit": 140} for lsn in (150, 160)]
    assert [taken(offset) for offset in [*t1, *t2, t2[0], t2[1], t1[1]]] == [False] * 5 + [True] * 3


def test_a_key_updates_delete_and_create_share_an_offset_and_both_apply_once() -> None:
    taken = StreamRedeliveries(None)
    before, update, after = _row_offset(2, 1), _row_offset(3, 1), _row_offset(3, 2)
    # The delete of the old key and the create of the new one, then a reconnect gives both again from `before`.
    given = [before, update, dict(update), after, before, update, dict(update), after, _row_offset(4, 1)]
    assert [taken(offset) for offset in given] == [False, False, False, False, True, True, True, True, False]


def test_repeats_that_begin_at_the_last_offset_taken_are_told_by_the_first_change_taken_there() -> None:
    # A keyless table's two-row transaction: the run took its first row, then the reader reconnected and gave the
    # transaction again from that row.
    taken = StreamRedeliveries(None)
    first, second = _row_offset(2, 1), _row_offset(2, 2)
    insert = ("c", "db.log")
    given = [(first, insert), (dict(first), insert), (second, insert), (_row_offset(3, 1), insert)]
    assert [taken(offset, change) for offset, change in given] == [False, True, False, False]


def test_a_key_update_given_again_from_its_delete_is_skipped_whole_or_in_part() -> None:
    update = _row_offset(3, 1)
    delete, create = ("d", "db.items"), ("c", "db.items")
    # Both halves taken, then given again: both are repeats.
    taken = StreamRedeliveries(None)
    given = [(update, delete), (dict(update), create), (dict(update), delete), (dict(update), create),
             (_row_offset(3, 2), create)]
    assert [taken(offset, change) for offset, change in given] == [False, False, True, True, False]
    # Only the delete taken: given again, the delete is a repeat and the create is new.
    taken = StreamRedeliveries(None)
    given = [(update, delete), (dict(update), delete), (dict(update), create)]
    assert [taken(offset, change) for offset, change in given] == [False, True, False]
    # Without a reconnect, the delete and the create both apply.
    taken = StreamRedeliveries(None)
    assert [taken(update, delete), taken(dict(update), create)] == [False, False]


def test_postgres_changes_of_one_table_sharing_an_lsn_are_all_taken() -> None:
    # A COPY's rows come from one multi-row WAL record: the same op and table at one LSN are not repeats.
    taken = StreamRedeliveries(None)
    row = {"txId": 7, "lsn": 110, "lsn_commit": 100}
    insert = ("c", "public.log")
    assert [taken(row, insert), taken(dict(row), insert), taken(dict(row), insert)] == [False, False, False]


def test_an_incremental_snapshots_reads_sharing_the_streams_offset_are_all_taken() -> None:
    taken = StreamRedeliveries(None)
    offset = {**_row_offset(4, 0), "incremental_snapshot_primary_key": "x"}
    read = ("r", "db.items")
    assert [taken(dict(offset), read) for _ in range(3)] == [False, False, False]
