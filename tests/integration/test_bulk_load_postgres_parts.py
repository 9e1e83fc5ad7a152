"""A PostgreSQL table without a key loaded in parts: its heap cut by block ranges (ctid), the parts copied by
several tasks at once under one exported snapshot, and a load that failed inside the table copied again from its
first part (its parts read under another snapshot would copy a row moved between parts twice, or not at all)."""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest

from cdc_pipeline.errors import CdcError
from tests.helpers.postgres_source import SOURCE_SCHEMA, PostgresPipeline


pytestmark = pytest.mark.integration

# About 3.5 MB of heap: past three parts of PART_BYTES_AT_LEAST (1 MB).
ROWS = 40_000
KEYLESS = [
    "CREATE TABLE notes (kind text, amount integer, body varchar(40))",
    "ALTER TABLE notes REPLICA IDENTITY FULL",
    f"INSERT INTO notes SELECT 'k' || (i % 7), i % 1000, repeat('n', i % 40) FROM generate_series(1, {ROWS}) AS i",
    "ANALYZE notes",
]


def _chunks(pipeline: PostgresPipeline) -> list[tuple]:
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        return conn.execute("SELECT lower_bound, upper_bound, done_at IS NOT NULL, rows, snapshot_position "
                            "FROM cdc.bulk_load_chunks WHERE connector = %s ORDER BY id", (pipeline.name,)).fetchall()


def _assert_same(pipeline: PostgresPipeline) -> None:
    assert Counter(pipeline.dest_rows("notes")) == Counter(pipeline.source_rows("notes"))


def test_a_table_without_a_key_is_copied_in_parts_under_one_snapshot(pg_pipeline: PostgresPipeline):
    pg_pipeline.source(KEYLESS)
    pg_pipeline.write_config(tables=[f"{SOURCE_SCHEMA}.notes"], snapshot_chunk_rows=5_000)

    summary = pg_pipeline.sync()

    chunks = _chunks(pg_pipeline)
    assert len(chunks) >= 3, chunks
    # Block ranges that meet end to end, the first and the last open.
    bounds = [(lower, upper) for lower, upper, *_ in chunks]
    assert bounds[0][0] is None and bounds[-1][1] is None
    assert all(upper == lower for (_, upper), (lower, _) in zip(bounds, bounds[1:]))
    assert all(done for _, _, done, _, _ in chunks)
    assert sum(rows for *_, rows, _ in chunks) == ROWS == summary["snapshot_rows"]
    # One snapshot for every part (kept until the stream passes it, then cleared from all).
    assert len({str(position) for *_, position in chunks}) == 1
    _assert_same(pg_pipeline)

    pg_pipeline.source(["UPDATE notes SET amount = -amount WHERE kind = 'k3'", "DELETE FROM notes WHERE kind = 'k5'"])
    pg_pipeline.sync()
    _assert_same(pg_pipeline)


def test_a_table_copied_in_part_by_a_failed_run_is_copied_again_from_its_first_part(pg_pipeline: PostgresPipeline):
    pg_pipeline.source(KEYLESS)
    pg_pipeline.write_config(tables=[f"{SOURCE_SCHEMA}.notes"], snapshot_chunk_rows=5_000)
    # The destination refuses a value found only in the last rows of the heap: that part fails, the others commit.
    pg_pipeline.source(f"UPDATE notes SET amount = -1 WHERE ctid >= '({_last_block(pg_pipeline)},0)'::tid")
    _refuse_negative_amounts(pg_pipeline, True)
    with pytest.raises(CdcError, match="notes_amount_check"):
        pg_pipeline.sync()
    chunks = _chunks(pg_pipeline)
    done = [row for row in chunks if row[2]]
    assert 1 <= len(done) < len(chunks), chunks
    assert 0 < len(pg_pipeline.dest_rows("notes")) < ROWS

    _refuse_negative_amounts(pg_pipeline, False)
    # Rows move between parts meanwhile (an UPDATE writes the new row where there is room, at the heap's end).
    pg_pipeline.source(["UPDATE notes SET body = 'moved' WHERE kind = 'k2'", "DELETE FROM notes WHERE kind = 'k6'"])
    summary = pg_pipeline.sync()

    _assert_same(pg_pipeline)
    assert all(row[2] for row in _chunks(pg_pipeline))
    with psycopg.connect(pg_pipeline.dest_dsn, autocommit=True) as conn:
        stats = conn.execute("SELECT snapshot_rows FROM cdc.stats WHERE connector = %s",
                             (pg_pipeline.name,)).fetchone()[0]
    # The rows the failed run copied are not counted twice.
    assert stats == summary["snapshot_rows"] == len(pg_pipeline.source_rows("notes"))


def _last_block(pipeline: PostgresPipeline) -> int:
    with psycopg.connect(pipeline.source_dsn, autocommit=True) as conn:
        return int(conn.execute("SELECT max((ctid::text::point)[0])::int FROM notes").fetchone()[0])


def _refuse_negative_amounts(pipeline: PostgresPipeline, refuse: bool) -> None:
    """A check on the destination table, made once the schema snapshot has made the table."""
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        if refuse:
            conn.execute("CREATE TABLE IF NOT EXISTS public.notes (kind text, amount integer, body varchar(40))")
            conn.execute("ALTER TABLE public.notes ADD CONSTRAINT notes_amount_check CHECK (amount >= 0)")
        else:
            conn.execute("ALTER TABLE public.notes DROP CONSTRAINT notes_amount_check")


def test_a_table_without_a_key_loads_exact_under_the_sources_idle_timeouts(pg_pipeline: PostgresPipeline):
    """A database's `idle_in_transaction_session_timeout` would end the session that exports the parts' snapshot
    while it waits for their copy (idle in its transaction): the parts that begin later (here already the first:
    Spark's job starts more than 2 s after the export) could not import it, and the load would fail and start over
    at every run. Its `idle_session_timeout` would end the load's planning session between two slices. The load's
    sessions lift both for themselves (`postgres.LIFT_IDLE_LIMITS`)."""
    pg_pipeline.source(KEYLESS)
    with psycopg.connect(pg_pipeline.source_dsn, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{pg_pipeline.source_db}" SET idle_in_transaction_session_timeout = \'2s\'')
        conn.execute(f'ALTER DATABASE "{pg_pipeline.source_db}" SET idle_session_timeout = \'2s\'')
    pg_pipeline.write_config(tables=[f"{SOURCE_SCHEMA}.notes"], snapshot_chunk_rows=5_000)

    summary = pg_pipeline.sync()

    chunks = _chunks(pg_pipeline)
    assert len(chunks) >= 3 and all(done for _, _, done, _, _ in chunks), chunks
    assert len({str(position) for *_, position in chunks}) == 1, "one snapshot for every part"
    assert summary["snapshot_rows"] == ROWS
    _assert_same(pg_pipeline)

    pg_pipeline.source(["UPDATE notes SET amount = -amount WHERE kind = 'k3'", "DELETE FROM notes WHERE kind = 'k5'"])
    pg_pipeline.sync()
    _assert_same(pg_pipeline)


def test_the_session_holding_the_parts_snapshot_ends_when_their_copy_cannot_start(pg_pipeline: PostgresPipeline,
                                                                                   monkeypatch):
    from cdc_pipeline.bulk_load import copy_plan

    def refused(self, parts, snapshot=None):
        raise CdcError("the copier cannot be made", connector=self.connector.name)

    pg_pipeline.source(KEYLESS)
    pg_pipeline.write_config(tables=[f"{SOURCE_SCHEMA}.notes"], snapshot_chunk_rows=5_000)
    with monkeypatch.context() as patched, pytest.raises(CdcError, match="the copier cannot be made") as failed:
        patched.setattr(copy_plan.CopyPlanner, "source_copier", refused)
        pg_pipeline.sync()
    with psycopg.connect(pg_pipeline.source_dsn, autocommit=True) as conn:
        held = conn.execute("SELECT pid, state, query FROM pg_stat_activity WHERE datname = %s AND application_name "
                            "= %s", (pg_pipeline.source_db, f"cdc-pipeline {pg_pipeline.name}")).fetchall()
    assert held == [], f"source sessions left open after {failed.value}"

    pg_pipeline.sync()
    _assert_same(pg_pipeline)
