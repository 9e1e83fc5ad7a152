"""Unit tests for cdc_pipeline.sink.plan: DDL steps and per-table DML segments in source order."""

from __future__ import annotations

from collections import Counter
from functools import reduce
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_pipeline.sink.plan import (
    SNAPSHOT_END,
    SNAPSHOT_RESTART,
    SNAPSHOT_TABLE,
    BatchPlan,
    DdlStep,
    DmlStep,
    SnapshotStep,
    attach_dml_frames,
    plan_batch,
    with_frame,
)
from cdc_pipeline.config import ConnectorConfig, parse_config
from tests.helpers.spark import all_events_batch, fixture_records, get_spark, parse_records

PRODUCTS = "inventory.products"
CUSTOMERS = "inventory.customers"


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return get_spark()


@pytest.fixture(scope="module")
def connector() -> ConnectorConfig:
    config = parse_config({
        "destination": {"dsn": "postgresql://cdc@localhost/warehouse"},
        "connectors": {"mdb": {"type": "mariadb", "hostname": "localhost", "user": "cdc", "password": "secret",
                               "database": "inventory"}},
    }, Path("x.yaml"))
    return config.connector("mdb")


@pytest.fixture(scope="module")
def plan(spark: SparkSession, connector: ConnectorConfig) -> BatchPlan:
    return plan_batch(all_events_batch(), connector)


def step_summary(step: DdlStep | DmlStep | SnapshotStep) -> tuple:
    if isinstance(step, DdlStep):
        return ("ddl", step.ref.seq, tuple((change.kind, change.source_table) for change in step.changes))
    if isinstance(step, SnapshotStep):
        return ("snapshot", step.kind, step.source_table, step.ref.seq)
    return ("dml", step.source_table, step.first_seq, step.last_seq, dict(step.ops))


def table_steps(plan: BatchPlan, table: str) -> list[tuple]:
    """The steps touching one table, in plan order, as (kind, first seq, last seq)."""
    steps = []
    for step in plan.steps:
        if isinstance(step, DmlStep) and step.source_table == table:
            steps.append(("dml", step.first_seq, step.last_seq))
        elif isinstance(step, DdlStep) and any(change.source_table == table for change in step.changes):
            steps.append(("ddl", step.ref.seq, step.ref.seq))
    return steps


def test_each_tables_steps_are_in_source_order_and_split_at_its_ddl(plan: BatchPlan) -> None:
    assert table_steps(plan, PRODUCTS) == [("ddl", 6, 6), ("dml", 7, 12), ("ddl", 23, 23), ("dml", 24, 24)]
    assert table_steps(plan, CUSTOMERS) == [
        ("ddl", 14, 14), ("dml", 15, 16), ("ddl", 17, 17), ("dml", 18, 18), ("ddl", 19, 19), ("dml", 20, 20),
        ("ddl", 21, 21), ("dml", 22, 22), ("ddl", 25, 25),
    ]


def test_ddl_steps_keep_source_order_and_segments_precede_later_ddl_of_their_table(plan: BatchPlan) -> None:
    ddl_seqs = [step.ref.seq for step in plan.steps if isinstance(step, DdlStep)]
    assert ddl_seqs == sorted(ddl_seqs)
    for index, step in enumerate(plan.steps):
        if isinstance(step, DmlStep):
            earlier_ddl = [other.ref.seq for other in plan.steps[:index] if isinstance(other, DdlStep)
                           and any(change.source_table == step.source_table for change in other.changes)]
            assert all(seq < step.first_seq for seq in earlier_ddl), step_summary(step)


def test_segments_hold_one_value_schema_and_their_ops(plan: BatchPlan) -> None:
    refs = {ref.seq: ref for ref in plan.parsed.refs}
    segments = [step for step in plan.steps if isinstance(step, DmlStep)]
    for segment in segments:
        assert refs[segment.first_seq].schema_id == refs[segment.last_seq].schema_id == segment.schema_id
        assert segment.last_ref is refs[segment.last_seq]
    products = [segment for segment in segments if segment.source_table == PRODUCTS]
    assert [dict(segment.ops) for segment in products] == [{"r": 3, "c": 1, "u": 1, "d": 1}, {"u": 1}]
    assert products[0].schema_id != products[1].schema_id


def test_counts_count_every_event_once(plan: BatchPlan) -> None:
    records = fixture_records()
    ops = Counter((record.get("value") or {}).get("payload", {}).get("op") for record in records)
    counts = plan.counts
    assert counts.events == len(records) == 25
    assert (counts.snapshot_rows, counts.inserts, counts.updates, counts.deletes) == (
        ops["r"], ops["c"], ops["u"], ops["d"]) == (3, 5, 3, 1)
    assert counts.ddls == 7
    assert counts.other_events == 6
    assert sum((counts.ddls, counts.snapshot_rows, counts.inserts, counts.updates, counts.deletes,
                counts.other_events)) == counts.events
    assert plan.last_ref is not None and plan.last_ref.seq == 25


def test_snapshot_drops_and_database_statements_make_no_ddl_step(plan: BatchPlan) -> None:
    ddl_steps = [step for step in plan.steps if isinstance(step, DdlStep)]
    assert [step.ref.seq for step in ddl_steps] == [6, 14, 17, 19, 21, 23, 25]
    texts = [step.ref.schema_change["ddl"] for step in ddl_steps]
    assert not any(text.startswith(("DROP TABLE IF EXISTS", "DROP DATABASE", "CREATE DATABASE", "SET", "USE"))
                   for text in texts)
    assert [change.kind for step in ddl_steps for change in step.changes] == [
        "create", "create", "alter", "alter", "alter", "alter", "drop"]


def test_attached_frames_hold_exactly_each_segments_events(plan: BatchPlan) -> None:
    attach_dml_frames(plan)
    segments = [step for step in plan.steps if isinstance(step, DmlStep)]
    tagged: list[DataFrame] = [with_frame(segment).frame.select(F.lit(index).alias("segment"), "seq")
                               for index, segment in enumerate(segments)]
    rows = reduce(DataFrame.unionByName, tagged).collect()
    seqs_by_segment: dict[int, list[int]] = {}
    for row in rows:
        seqs_by_segment.setdefault(row.segment, []).append(row.seq)
    refs = {ref.seq: ref for ref in plan.parsed.refs}
    for index, segment in enumerate(segments):
        expected = [seq for seq in range(segment.first_seq, segment.last_seq + 1)
                    if refs[seq].source_table == segment.source_table]
        assert sorted(seqs_by_segment[index]) == expected
        assert segment.fields == plan.parsed.fields(segment.schema_id)
    assert [field.name for field in segments[-1].fields][-1] == "note"


def test_interleaved_tables_split_only_at_their_own_ddl(spark: SparkSession, connector: ConnectorConfig) -> None:
    records = fixture_records()
    create_products, create_customers, alter_customers = records[5], records[13], records[16]
    products_rows, customers_before, customers_after = records[6:9], records[14], records[17]
    parsed = parse_records([
        create_products, create_customers,
        products_rows[0], customers_before, products_rows[1], alter_customers, products_rows[2], customers_after,
    ])
    try:
        steps = [step_summary(step) for step in plan_batch(parsed, connector).steps]
    finally:
        parsed.release()
    assert ("dml", PRODUCTS, 3, 7, {"r": 3}) in steps
    customers = [step for step in steps if step[1] == CUSTOMERS or step[0] == "ddl"]
    assert customers == [
        ("ddl", 1, (("create", PRODUCTS),)),
        ("ddl", 2, (("create", CUSTOMERS),)),
        ("dml", CUSTOMERS, 4, 4, {"c": 1}),
        ("ddl", 6, (("alter", CUSTOMERS),)),
        ("dml", CUSTOMERS, 8, 8, {"c": 1}),
    ]


def test_a_new_value_schema_starts_a_new_segment(spark: SparkSession, connector: ConnectorConfig) -> None:
    records = fixture_records()
    parsed = parse_records([records[14], records[15], records[17]])
    try:
        steps = [step_summary(step) for step in plan_batch(parsed, connector).steps]
    finally:
        parsed.release()
    assert steps == [("dml", CUSTOMERS, 1, 2, {"c": 2}), ("dml", CUSTOMERS, 3, 3, {"c": 1})]


# The planner's snapshot steps, on the captured snapshot and stream of `mariadb_all_events.jsonl`.

def _snapshot_marker(record: dict) -> str:
    return str((((record.get("value") or {}).get("payload") or {}).get("source") or {}).get("snapshot")).lower()


def test_a_snapshot_from_the_engine_start_supersedes_the_earlier_one_and_replaces_each_tables_rows(connector):
    records = fixture_records()
    parsed = parse_records(records, first_seq=1)
    try:
        plan = plan_batch(parsed, connector)
    finally:
        parsed.release()
    steps = plan.steps
    assert isinstance(steps[0], SnapshotStep) and steps[0].kind == SNAPSHOT_RESTART
    products = next(step for step in steps if isinstance(step, SnapshotStep) and step.kind == SNAPSHOT_TABLE
                    and step.source_table == "inventory.products")
    index = steps.index(products)
    create = next(i for i, step in enumerate(steps) if isinstance(step, DdlStep)
                  and any(change.source_table == "inventory.products" for change in step.changes))
    reads = next(i for i, step in enumerate(steps) if isinstance(step, DmlStep) and step.ops["r"])
    assert create < index < reads, "the table's rows are replaced after its CREATE and before its snapshot rows"
    snapshot = [record for record in records if _snapshot_marker(record) not in ("none", "false")]
    reads_of_products = [record for record in snapshot if record["value"]["payload"].get("op") == "r"]
    tables = [step for step in steps if isinstance(step, SnapshotStep) and step.kind == SNAPSHOT_TABLE]
    assert sum(step.counts.events for step in tables) == len(snapshot), "every snapshot event is tracked once"
    assert products.counts.snapshot_rows == len(reads_of_products)
    end = [i for i, step in enumerate(steps) if isinstance(step, SnapshotStep) and step.kind == SNAPSHOT_END]
    last_seq = 1 + next(i for i, record in enumerate(records) if _snapshot_marker(record) == "last")
    assert len(end) == 1 and steps[end[0]].ref.seq == last_seq


def test_a_later_batch_of_a_snapshot_does_not_start_it_again(connector):
    records = fixture_records()
    first_read = next(i for i, record in enumerate(records) if _snapshot_marker(record) == "first")
    parsed = parse_records(records[first_read:], first_seq=first_read + 1)
    try:
        kinds = [step.kind for step in plan_batch(parsed, connector).steps if isinstance(step, SnapshotStep)]
    finally:
        parsed.release()
    assert kinds == [SNAPSHOT_TABLE, SNAPSHOT_END]


def test_a_stream_from_the_engine_start_has_no_snapshot_steps(connector):
    records = fixture_records()
    streaming = [record for record in records if _snapshot_marker(record) == "false"]
    parsed = parse_records(streaming, first_seq=1)
    try:
        steps = plan_batch(parsed, connector).steps
    finally:
        parsed.release()
    assert steps and not any(isinstance(step, SnapshotStep) for step in steps)


def test_a_bulk_snapshot_position_retires_at_the_first_event_past_it(connector):
    # The stream of `mariadb_all_events.jsonl`: products' changes at 3165, 3531, 3935, customers' from 4098 on.
    streaming = [record for record in fixture_records() if _snapshot_marker(record) == "false"]
    for record in streaming:
        del record["value"]["payload"]["source"]["snapshot"]  # a streamed event's offset has no snapshot flag
    positions = {"inventory.products": {"file": "mariadb-bin.000001", "pos": 3531},
                 "inventory.customers": {"file": "mariadb-bin.000001", "pos": 100_000}}
    parsed = parse_records(streaming, first_seq=1)
    try:
        plan = plan_batch(parsed, connector, snapshot_positions=positions)
    finally:
        parsed.release()
    assert plan.retired_positions == ["inventory.products"]
    assert plan.counts.redelivered == 1 + sum(1 for record in streaming
                                              if record["value"]["payload"]["source"]["table"] == "customers"
                                              and record["value"]["payload"].get("op")), \
        "the change before the position and every change of the table not passed yet are skipped"


def test_a_postgresql_connectors_heartbeat_is_neither_applied_nor_counted():
    from cdc_pipeline.decode.events import DATA_CHANGE, OTHER, EventRef
    from cdc_pipeline.sink.plan import is_heartbeat

    config = parse_config({
        "destination": {"dsn": "postgresql://cdc@localhost/warehouse"},
        "connectors": {"pg": {"type": "postgres", "hostname": "localhost", "user": "cdc", "password": "secret",
                              "database": "shop"}}}, Path("connectors.yaml"))
    pg = config.connector("pg")
    beat = EventRef(1, DATA_CHANGE, pg.heartbeat_table, "s", "u", {"table": "cdc_heartbeat"})
    message = EventRef(2, OTHER, None, "h", None, {})
    change = EventRef(3, DATA_CHANGE, "public.orders", "s", "c", {"table": "orders"})
    assert is_heartbeat(pg, beat) and is_heartbeat(pg, message) and not is_heartbeat(pg, change)


@pytest.mark.parametrize("connector_type, source, expected", [
    ("mariadb", {"db": "shop", "table": "orders"}, "shop.orders"),
    ("sqlserver", {"db": "shop", "schema": "dbo", "table": "orders"}, "dbo.orders"),
    ("oracle", {"db": "ORCLPDB1", "schema": "DEBEZIUM", "table": "ORDERS"}, "DEBEZIUM.ORDERS"),
    ("sqlserver", {"db": "shop", "schema": "dbo", "table": "audit"}, ""),
])
def test_a_snapshot_schema_event_names_its_table_as_the_data_events_do(connector_type, source, expected):
    """SQL Server's and Oracle's source blocks carry a schema: their tables are `schema.table`, as their data events
    and `tables` name them, not `db.table`."""
    from cdc_pipeline.decode.events import SCHEMA_CHANGE, EventRef
    from cdc_pipeline.sink.plan import _schema_change_table

    tables = {"mariadb": ["shop.orders"], "sqlserver": ["dbo.orders"], "oracle": ["DEBEZIUM.ORDERS"]}[connector_type]
    config = parse_config({
        "destination": {"dsn": "postgresql://cdc@localhost/warehouse"},
        "connectors": {"c": {"type": connector_type, "hostname": "localhost", "user": "cdc", "password": "secret",
                             "database": source["db"], "tables": tables}}}, Path("connectors.yaml"))
    ref = EventRef(1, SCHEMA_CHANGE, None, "s", None, {**source, "snapshot": "true"})
    assert _schema_change_table(ref, config.connector("c")) == expected


@pytest.mark.parametrize("source_type", ["sqlserver", "oracle", "mariadb"])
def test_debeziums_heartbeat_message_is_neither_applied_nor_counted_for_every_source_type(source_type):
    """Debezium's heartbeat record (`HeartbeatImpl`: a struct value with no table, source block or op) of any
    connector is no change; a tombstone (no value) is not a heartbeat, and a change of a table with the PostgreSQL
    heartbeat table's name is data for other types."""
    from cdc_pipeline.decode.events import DATA_CHANGE, OTHER, EventRef
    from cdc_pipeline.sink.plan import is_heartbeat

    config = parse_config({
        "destination": {"dsn": "postgresql://cdc@localhost/warehouse"},
        "connectors": {"src": {"type": source_type, "hostname": "localhost", "user": "cdc", "password": "secret",
                               "database": "shop", "tables": ["public.orders"]}}}, Path("connectors.yaml"))
    connector = config.connector("src")
    message = EventRef(1, OTHER, None, "h", None, {})
    named_like_pg_heartbeat = EventRef(2, DATA_CHANGE, connector.heartbeat_table, "s", "u", {"table": "cdc_heartbeat"})
    change = EventRef(3, DATA_CHANGE, "public.orders", "s", "c", {"table": "orders"})
    tombstone = EventRef(4, OTHER, None, None, None, {})
    assert is_heartbeat(connector, message)
    assert not is_heartbeat(connector, named_like_pg_heartbeat) and not is_heartbeat(connector, change)
    assert not is_heartbeat(connector, tombstone)


def test_a_transaction_given_again_inside_a_segment_is_not_in_its_rows(connector):
    """The binlog reader reconnecting mid-transaction gives the transaction again from its start: its repeats come
    between the table's changes. Every step takes its rows by seq range (`with_frame`, the group's staging): no
    range may hold a repeat, or a keyless table would get its rows twice."""
    import copy

    records = fixture_records()
    first, second = records[14], records[15]
    for record in (first, second):
        del record["value"]["payload"]["source"]["snapshot"]  # a streamed event's offset has no snapshot flag
    third = copy.deepcopy(second)
    third["value"]["payload"]["source"]["row"] = 2
    third["value"]["payload"]["after"] = {**third["value"]["payload"]["after"], "id": 5, "email": "e@x.io"}
    parsed = parse_records([first, second, first, second, third])
    try:
        plan = plan_batch(parsed, connector)
        assert plan.redelivered_seqs == {3, 4} and plan.counts.inserts == 3
        attach_dml_frames(plan)
        segments = [step for step in plan.steps if isinstance(step, DmlStep)]
        seqs = sorted(row.seq for segment in segments for row in with_frame(segment).frame.select("seq").collect())
        assert seqs == [1, 2, 5]
        assert not any(segment.first_seq <= seq <= segment.last_seq
                       for segment in segments for seq in plan.redelivered_seqs)
    finally:
        parsed.release()


def test_schema_changes_outside_the_connectors_tables_make_one_line_per_batch(caplog) -> None:
    # A connector of another database on the same server: every schema change of the fixtures' `inventory` is
    # outside its tables (as other tenants' are in a run on a server of many databases).
    other = parse_config({
        "destination": {"dsn": "postgresql://cdc@localhost/warehouse"},
        "connectors": {"other": {"type": "mariadb", "hostname": "localhost", "user": "cdc", "password": "secret",
                                 "database": "billing"}},
    }, Path("x.yaml")).connector("other")

    with caplog.at_level("INFO", logger="cdc_pipeline"):
        plan = plan_batch(all_events_batch(), other)

    lines = [record.getMessage() for record in caplog.records if "ignored" in record.getMessage()]
    assert not [step for step in plan.steps if isinstance(step, DdlStep)]
    assert len(lines) == 1
    assert lines[0].startswith("other: ignored ") and "outside the connector's tables: inventory." in lines[0]
