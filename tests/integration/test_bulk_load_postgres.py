"""The bulk snapshot engine from a PostgreSQL source (logical decoding, the slot Debezium creates): tables of every
key shape copied in primary-key chunks while the source takes inserts, updates, deletes and primary-key changes,
a table without a key read under one statement snapshot (the stream skips the transactions it saw), a run killed
inside a chunk, and a load spread over several runs; every table ends equal to the source."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from tests.helpers.postgres_source import SOURCE_SCHEMA, PostgresPipeline
from tests.helpers.runs import kill_at, start_sync


pytestmark = pytest.mark.integration

TABLES = [
    "CREATE TABLE items (id integer PRIMARY KEY, name text, qty integer, note varchar(40))",
    "CREATE TABLE pairs (region varchar(10), n integer, v numeric(12,2), PRIMARY KEY (region, n))",
    "CREATE TABLE tokens (id uuid PRIMARY KEY, v integer)",
    "CREATE TABLE notes (kind text, amount integer)",  # no key, duplicate rows
    "ALTER TABLE notes REPLICA IDENTITY FULL",
    "CREATE TABLE empty (id bigint PRIMARY KEY)",
]


def _fill(pipeline: PostgresPipeline, items: int) -> None:
    pipeline.source([
        f"INSERT INTO items SELECT i, 'item ' || i, i % 97, CASE WHEN i % 10 <> 0 THEN repeat('x', i % 40) END "
        f"FROM generate_series(1, {items}) AS i",
        "INSERT INTO pairs SELECT r, n, n * 1.25 FROM unnest(ARRAY['north', 'south', 'east']) AS r, "
        "generate_series(1, 1000) AS n",
        "INSERT INTO tokens SELECT md5(i::text)::uuid, i FROM generate_series(1, 2000) AS i",
        "INSERT INTO notes SELECT CASE WHEN i % 3 = 0 THEN 'dup' ELSE 'k' || (i % 7) END, i % 5 "
        "FROM generate_series(1, 2000) AS i",
    ])


def _query(pipeline: PostgresPipeline, statement: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        return conn.execute(statement, params).fetchall()


def _chunks(pipeline: PostgresPipeline) -> list[tuple]:
    return _query(pipeline, "SELECT source_table, count(*), count(done_at), coalesce(sum(rows), 0)::bigint "
                            "FROM cdc.bulk_load_chunks WHERE connector = %s GROUP BY 1 ORDER BY 1", (pipeline.name,))


def _assert_all_same(pipeline: PostgresPipeline) -> None:
    for table in ("items", "pairs", "tokens"):
        # Sorted whole: the helper orders by the first column only, which a composite key repeats.
        source, dest = sorted(pipeline.source_rows(table), key=repr), sorted(pipeline.dest_rows(table), key=repr)
        assert source and dest == source, f"table {table}: destination differs from source"
    assert Counter(pipeline.dest_rows("notes")) == Counter(pipeline.source_rows("notes"))
    assert pipeline.dest_rows("empty") == pipeline.source_rows("empty")


def _write(pipeline: PostgresPipeline, i: int, items: int) -> None:
    low, high = 1 + (i * 7919) % items, 1 + (i * 104_729) % items
    pipeline.source([
        f"INSERT INTO items VALUES ({100_000 + i}, 'during', {i}, NULL)",
        f"UPDATE items SET qty = qty + 1000, note = 'updated {i}' WHERE id = {low}",
        f"DELETE FROM items WHERE id = {high}",
        f"UPDATE items SET id = {200_000 + i} WHERE id = {1 + (i * 31) % items}",
        f"UPDATE pairs SET n = n + 5000 WHERE region = 'east' AND n = {1 + i % 1000}",
        f"UPDATE tokens SET v = -v WHERE v = {1 + i % 2000}",
        "INSERT INTO notes VALUES ('dup', 1), ('dup', 1)",
        "DELETE FROM notes WHERE ctid IN (SELECT ctid FROM notes WHERE kind = 'dup' LIMIT 1)",
        f"UPDATE notes SET amount = amount + 10 WHERE ctid IN (SELECT ctid FROM notes WHERE kind = 'k{i % 7}' LIMIT 1)",
    ])


def _catch_up(pipeline: PostgresPipeline, runs: int = 3) -> None:
    for _ in range(runs):
        pipeline.sync()
        try:
            _assert_all_same(pipeline)
            return
        except AssertionError:
            continue
    _assert_all_same(pipeline)


def test_tables_of_every_key_shape_load_while_the_source_is_written_and_end_exact(pg_pipeline: PostgresPipeline):
    pg_pipeline.source(TABLES)
    _fill(pg_pipeline, 20_000)
    tables = [f"{SOURCE_SCHEMA}.{name}" for name in ("items", "pairs", "tokens", "notes", "empty")]
    pg_pipeline.write_config(tables=tables, snapshot_chunk_rows=500)

    run = start_sync(pg_pipeline.name)
    writes = 0
    deadline = time.monotonic() + 240
    try:
        while not _query(pg_pipeline, "SELECT to_regclass('cdc.bulk_load_chunks') IS NOT NULL")[0][0] or \
                not _query(pg_pipeline, "SELECT count(done_at) FROM cdc.bulk_load_chunks")[0][0]:
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "the load did not start"
            time.sleep(0.02)
        while not _query(pg_pipeline, "SELECT bool_and(finished_at IS NOT NULL) FROM cdc.bulk_loads")[0][0]:
            assert time.monotonic() < deadline, "the load did not end"
            _write(pg_pipeline, writes, 20_000)
            writes += 1
    finally:
        _, err = run.communicate(timeout=600)
    assert run.returncode == 0, err
    assert writes > 5
    # Primary-key chunks of about 500 rows (the writes move some rows; the last chunk holds the rest), all done;
    # the table without a key is one chunk whose statement snapshot is kept.
    chunks = {table: (count, done, rows) for table, count, done, rows in _chunks(pg_pipeline)}
    assert all(count == done for count, done, _ in chunks.values())
    assert chunks["public.empty"] == (1, 1, 0) and chunks["public.notes"][:2] == (1, 1)
    assert 40 <= chunks["public.items"][0] <= 42 and 6 <= chunks["public.pairs"][0] <= 7
    assert chunks["public.tokens"] == (4, 4, 2_000)
    # The keyless table's statement snapshot, unless the stream written during the load has passed it already
    # (then it retired, cleared in the batch that passed it).
    position = _query(pg_pipeline, "SELECT snapshot_position FROM cdc.bulk_load_chunks "
                                   "WHERE source_table = 'public.notes'")[0][0]
    assert position is None or set(position) == {"snapshot"}
    assert pg_pipeline.dest_primary_key("pairs") == ["region", "n"]
    assert pg_pipeline.dest_columns("tokens") == {"id": "uuid", "v": "integer"}
    _catch_up(pg_pipeline)


def test_a_load_killed_inside_a_chunk_goes_on_over_several_runs(pg_pipeline: PostgresPipeline, tmp_path: Path):
    pg_pipeline.source(TABLES)
    _fill(pg_pipeline, 6_000)
    tables = [f"{SOURCE_SCHEMA}.{name}" for name in ("items", "notes")]
    pg_pipeline.write_config(tables=tables, snapshot_chunk_rows=500)
    # items (12 chunks) comes first: the kill is inside the transaction of its first chunk.
    kill_at(pg_pipeline.name, "bulk_copy", tmp_path / "copy")
    assert _query(pg_pipeline, "SELECT count(done_at) FROM cdc.bulk_load_chunks") == [(0,)]
    assert pg_pipeline.dest_rows("items") == []
    pg_pipeline.source(["UPDATE items SET qty = -qty WHERE id <= 40", "INSERT INTO notes VALUES ('dup', 0)"])
    # A budget spent at once: each run copies one slice of chunks (8 here) and stops. An idle timeout shorter than
    # the wait for the engine's start does not end a run before its load. The next tables' first chunks are planned
    # together, with the first slice.
    pg_pipeline.write_config(tables=tables, snapshot_chunk_rows=500, max_seconds_per_run=0.01,
                             idle_timeout_seconds=0.5)
    done = []
    for _ in range(3):
        summary = pg_pipeline.sync()
        done.append((summary["snapshot_rows"], _chunks(pg_pipeline)))
    assert done == [(4_000, [("public.items", 12, 8, 4_000), ("public.notes", 1, 0, 0)]),
                    (2_000, [("public.items", 12, 12, 6_000), ("public.notes", 1, 0, 0)]),
                    (2_001, [("public.items", 12, 12, 6_000), ("public.notes", 1, 1, 2_001)])]
    pg_pipeline.write_config(tables=tables)
    pg_pipeline.source(["DELETE FROM items WHERE id > 5990", "INSERT INTO notes VALUES ('dup', 0)"])
    pg_pipeline.sync()
    pg_pipeline.assert_same("items")
    assert Counter(pg_pipeline.dest_rows("notes")) == Counter(pg_pipeline.source_rows("notes"))
    stats = _query(pg_pipeline, "SELECT snapshot_rows, inserts, updates, deletes, redelivered FROM cdc.stats "
                                "WHERE connector = %s", (pg_pipeline.name,))
    # The keyed table's updates made before its chunks were read are replayed as upserts (its rows already held
    # them); the keyless table's insert made before its snapshot is skipped as re-delivered, the later one applied.
    assert stats == [(8_001, 1, 40, 10, 1)]


def test_chunk_bounds_with_backslashes_under_standard_conforming_strings_off(pg_pipeline: PostgresPipeline):
    # With it off, a backslash in a plain string constant escapes: 'k\1100' would read as 'kH0'.
    pg_pipeline.source_server.execute(
        f'ALTER DATABASE "{pg_pipeline.source_db}" SET standard_conforming_strings = off')
    pg_pipeline.source(["CREATE TABLE items (id text PRIMARY KEY, n integer)",
                        "INSERT INTO items SELECT 'k' || chr(92) || i, i FROM generate_series(1000, 1999) AS i"])
    pg_pipeline.write_config(snapshot_chunk_rows=100)

    pg_pipeline.sync()

    assert _chunks(pg_pipeline) == [("public.items", 10, 10, 1_000)]
    pg_pipeline.assert_same("items")
