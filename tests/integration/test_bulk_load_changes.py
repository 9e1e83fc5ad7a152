"""A bulk snapshot spanning runs while the source changes between them (MariaDB): unique values moving between rows
(the destination's unique keys wait for the stream to reconcile the chunks), and schema changes (a widened column,
a dropped primary key, a column added to a keyless table) that make the table be copied again."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.helpers.mariadb_source import Pipeline

pytestmark = pytest.mark.integration

ROWS = 3_000
# A run copies one slice of chunks (eight of 250 rows here: ids 1-2000), then stops at its budget.
SPANNING_RUNS = {"snapshot_chunk_rows": 250, "max_seconds_per_run": 0.01}


def _sync_until_loaded(pipeline: Pipeline, runs: int = 12) -> None:
    """Syncs until the connector's bulk snapshot is finished (a few runs of one slice each)."""
    for _ in range(runs):
        pipeline.sync()
        if pipeline.dest_query("SELECT count(*) FROM cdc.bulk_loads WHERE connector = %s AND finished_at IS NULL",
                               (pipeline.name,)) == [(0,)]:
            return
    raise AssertionError("the bulk snapshot did not finish")


def _settle(pipeline: Pipeline) -> None:
    """Lets the stream apply everything, with the connector's usual budget."""
    pipeline.write_config(snapshot_chunk_rows=250)
    for _ in range(3):
        pipeline.sync()


def _unique_constraints(pipeline: Pipeline, table: str) -> list[tuple]:
    return pipeline.dest_query(
        "SELECT conname, pg_get_constraintdef(c.oid) FROM pg_constraint c WHERE contype = 'u' AND conrelid = "
        "to_regclass(%s) ORDER BY 1", (f'"{pipeline.dest_schema}"."{table}"',))


def test_a_unique_value_moving_between_rows_during_the_load_does_not_stall_it(pipeline: Pipeline):
    pipeline.source(["CREATE TABLE users (id INT PRIMARY KEY, email VARCHAR(64) NOT NULL UNIQUE, name VARCHAR(32))",
                     f"INSERT INTO users SELECT seq, CONCAT('u', seq, '@x'), 'n' FROM seq_1_to_{ROWS}"])
    pipeline.write_config(**SPANNING_RUNS)
    pipeline.sync()
    assert pipeline.dest_query(f"SELECT count(*) FROM \"{pipeline.dest_schema}\".users") == [(2_000,)]
    # Between runs, on rows copied and rows not yet copied: two rows swap emails, an account is deleted and its
    # email taken by a new one.
    pipeline.source(["UPDATE users SET email = 'swap' WHERE id = 10",
                     "UPDATE users SET email = 'u10@x' WHERE id = 2500",
                     "UPDATE users SET email = 'u2500@x' WHERE id = 10",
                     "DELETE FROM users WHERE id = 20",
                     "INSERT INTO users VALUES (2999999, 'u20@x', 'again')"])
    _sync_until_loaded(pipeline)
    _settle(pipeline)
    pipeline.assert_same("users")
    assert _unique_constraints(pipeline, "users") == [("users_email_key", "UNIQUE (email) DEFERRABLE INITIALLY "
                                                                          "DEFERRED")]
    pipeline.source("UPDATE users SET email = 'later' WHERE id = 1")
    pipeline.sync()
    pipeline.assert_same("users")


def test_a_column_widened_during_the_load(pipeline: Pipeline):
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20), qty INT)",
                     f"INSERT INTO items SELECT seq, CONCAT('item ', seq), seq FROM seq_1_to_{ROWS}"])
    pipeline.write_config(**SPANNING_RUNS)
    pipeline.sync()
    pipeline.source(["ALTER TABLE items MODIFY name VARCHAR(200), MODIFY qty BIGINT",
                     "UPDATE items SET name = REPEAT('w', 150), qty = 5000000000 WHERE id IN (5, 2800)"])
    _sync_until_loaded(pipeline)
    _settle(pipeline)
    pipeline.assert_same("items")


def test_a_primary_key_dropped_during_the_load(pipeline: Pipeline):
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, qty INT)",
                     f"INSERT INTO items SELECT seq, seq FROM seq_1_to_{ROWS}"])
    pipeline.write_config(**SPANNING_RUNS)
    pipeline.sync()
    pipeline.source(["ALTER TABLE items DROP PRIMARY KEY",
                     "UPDATE items SET qty = -qty WHERE id IN (7, 2700)",
                     "INSERT INTO items VALUES (7, 7), (2700, 2700)",
                     "DELETE FROM items WHERE id IN (8, 2800)"])
    _sync_until_loaded(pipeline)
    _settle(pipeline)
    assert Counter(pipeline.dest_rows("items")) == Counter(pipeline.source_rows("items"))


def test_a_column_added_to_a_keyless_table_and_set_before_its_snapshot(pipeline: Pipeline):
    # `items` (first by name) takes the first runs; `z_log`, without a key, is read under its consistent snapshot
    # after the column was added and set.
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, qty INT)",
                     f"INSERT INTO items SELECT seq, seq FROM seq_1_to_{ROWS}",
                     "CREATE TABLE z_log (kind VARCHAR(10), amount INT)",
                     "INSERT INTO z_log SELECT CONCAT('k', seq % 5), seq % 3 FROM seq_1_to_300"])
    pipeline.write_config(**SPANNING_RUNS)
    pipeline.sync()
    pipeline.source(["ALTER TABLE z_log ADD COLUMN tag VARCHAR(10)",
                     "UPDATE z_log SET tag = 'set' WHERE amount = 1"])
    _sync_until_loaded(pipeline)
    _settle(pipeline)
    pipeline.assert_same("items")
    assert Counter(pipeline.dest_rows("z_log")) == Counter(pipeline.source_rows("z_log"))
