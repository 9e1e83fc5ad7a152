"""Records that share one offset (the schema changes of one multi-table statement, a TRUNCATE of several
PostgreSQL tables) are applied together: a batch, group or run never ends between them. Once the first is applied,
the others compare as applied (`events.redelivery_test`), so a run ending between them would lose them."""

from __future__ import annotations

import pytest

from cdc_pipeline.decode.events import same_stream_position
from tests.helpers.postgres_source import SOURCE_SCHEMA

pytestmark = pytest.mark.integration

# One record a batch, a group and a run: every cut that can fall between two records does.
EVERY_CUT = {"batch_size": 1, "apply_batch_events": 1, "max_events_per_run": 1}


@pytest.mark.parametrize("first, second, same", [
    ({"file": "b.000003", "pos": 400, "event": 1}, {"file": "b.000003", "pos": 400, "event": 1}, True),
    ({"file": "b.000003", "pos": 400, "event": 1}, {"file": "b.000003", "pos": 400, "event": 2}, False),
    ({"file": "b.000003", "pos": 400}, {"file": "c.000003", "pos": 400}, False),
    ({"file": "b.000003", "pos": 400, "snapshot": True}, {"file": "b.000003", "pos": 400, "snapshot": True}, False),
    ({"txId": 7, "lsn": 100, "lsn_commit": 90}, {"txId": 7, "lsn": 100, "lsn_commit": 90}, True),
    ({"txId": 7, "lsn": 100, "lsn_commit": 90}, {"txId": 7, "lsn": 108, "lsn_commit": 90}, False),
    (None, {"txId": 7, "lsn": 100}, False),
])
def test_records_share_a_stream_position_only_when_their_offsets_are_one(first, second, same):
    assert same_stream_position(first, second) is same


def test_a_multi_table_drop_is_applied_whole_whatever_the_budget(pipeline):
    pipeline.source(["CREATE TABLE a (id INT PRIMARY KEY)", "CREATE TABLE b (id INT PRIMARY KEY)",
                     "CREATE TABLE c (id INT PRIMARY KEY)", "INSERT INTO a VALUES (1)", "INSERT INTO b VALUES (1)"])
    pipeline.sync()
    assert all(pipeline.dest_table_exists(table) for table in "abc")
    pipeline.write_config(**EVERY_CUT)
    pipeline.source(["DROP TABLE a, b, c", "CREATE TABLE d (id INT PRIMARY KEY)"])

    for _ in range(2):
        pipeline.sync()

    assert not any(pipeline.dest_table_exists(table) for table in "abc")
    pipeline.write_config()  # (one event a run: the drop's records, given again, would spend every run's budget)
    pipeline.sync()
    assert [table for table in "abcd" if pipeline.dest_table_exists(table)] == ["d"]


def test_a_truncate_of_several_postgres_tables_is_applied_whole_whatever_the_budget(pg_pipeline):
    pg_pipeline.source(["CREATE TABLE items (id int PRIMARY KEY)", "CREATE TABLE other (id int PRIMARY KEY)",
                        "INSERT INTO items SELECT generate_series(1, 5)", "INSERT INTO other VALUES (1), (2)"])
    tables = [f"{SOURCE_SCHEMA}.items", f"{SOURCE_SCHEMA}.other"]
    pg_pipeline.write_config(tables=tables)
    pg_pipeline.sync()
    assert len(pg_pipeline.dest_rows("other")) == 2
    pg_pipeline.write_config(tables=tables, **EVERY_CUT)
    pg_pipeline.source(["TRUNCATE items, other", "INSERT INTO items VALUES (9)"])

    for _ in range(2):
        pg_pipeline.sync()

    assert pg_pipeline.dest_rows("other") == []
    pg_pipeline.write_config(tables=tables)
    pg_pipeline.sync()
    assert pg_pipeline.dest_rows("other") == [] and pg_pipeline.dest_rows("items") == [(9,)]
