"""The bulk snapshot of many small tables: their chunks share Spark jobs, a run killed amid them resumes exact, and a
small table keeps its indexes through its load (the ones across rows wait for the stream as any table's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from pyspark import SparkContext

from cdc_pipeline.bulk_load import slices
from tests.helpers.mariadb_source import Pipeline
from tests.helpers.runs import kill_at

pytestmark = pytest.mark.integration


def _tables(pipeline: Pipeline, count: int) -> tuple[list[str], int]:
    """`count` small keyed tables of 50 rows and more (t00 holds 50, t01 51, ...); returns their names and rows."""
    names = [f"t{i:02d}" for i in range(count)]
    statements = []
    for i, name in enumerate(names):
        statements += [f"CREATE TABLE {name} (id INT PRIMARY KEY, name VARCHAR(32), qty INT)",
                       f"INSERT INTO {name} SELECT seq, CONCAT('n', seq), seq % 7 FROM seq_1_to_{50 + i}"]
    pipeline.source(statements)
    return names, sum(50 + i for i in range(count))


def _index_oid(pipeline: Pipeline, table: str, index: str) -> int | None:
    rows = pipeline.dest_query("SELECT c.oid::bigint FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                               "WHERE n.nspname = %s AND c.relname = %s", (pipeline.dest_schema, index))
    return rows[0][0] if rows else None


def _cli(pipeline: Pipeline, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "cdc_pipeline.ops.cli", *args], env={**os.environ, **pipeline.env},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_small_tables_share_spark_jobs_and_keep_their_indexes(pipeline: Pipeline):
    names, rows = _tables(pipeline, 40)
    summary = pipeline.sync()
    assert summary["snapshot_rows"] == rows
    pipeline.assert_same(*names)
    # 40 one-chunk tables, 32 chunks a job on the suite's two cores: two jobs, not one a table.
    tracker = SparkContext._active_spark_context.statusTracker()
    assert len(tracker.getJobIdsForGroup(slices.slice_job_group(pipeline.name))) == 2

    schema = pipeline.dest_schema
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:  # indexes made by hand
        conn.execute(f'CREATE INDEX t00_qty ON "{schema}".t00 (qty)')
        conn.execute(f'CREATE UNIQUE INDEX t01_name ON "{schema}".t01 (name)')
    kept, unique = _index_oid(pipeline, "t00", "t00_qty"), _index_oid(pipeline, "t01", "t01_name")
    _cli(pipeline, "restart", pipeline.name, "always")
    _cli(pipeline, "requests", pipeline.name, "--serve")
    pipeline.source(["UPDATE t01 SET name = CONCAT(name, '-x') WHERE id <= 3"])
    assert pipeline.sync()["snapshot_rows"] == rows
    pipeline.assert_same(*names)
    # The plain index was kept through the load; the unique one was withheld, then made again by the stream.
    assert _index_oid(pipeline, "t00", "t00_qty") == kept
    assert _index_oid(pipeline, "t01", "t01_name") not in (None, unique)
    assert pipeline.dest_query("SELECT count(*) FROM cdc.deferred_constraints WHERE connector = %s",
                               (pipeline.name,)) == [(0,)]


def test_a_run_killed_amid_many_small_tables_resumes_exact(pipeline: Pipeline, tmp_path: Path):
    # 70 tables: two jobs of 32 chunks run at once; the kill follows the first one's end, the third never began.
    names, rows = _tables(pipeline, 70)
    kill_at(pipeline.name, "bulk_slice", tmp_path / "slice", env=pipeline.env)
    ((done, planned),) = pipeline.dest_query("SELECT count(done_at), count(*) FROM cdc.bulk_load_chunks "
                                             "WHERE connector = %s", (pipeline.name,))
    assert 32 <= done <= 64 and planned == 70
    # Changes that keep every table's row count, whether its chunk was read before or after them.
    pipeline.source(["UPDATE t00 SET qty = -1 WHERE id < 5", "UPDATE t69 SET name = 'later' WHERE id > 10",
                     "DELETE FROM t40 WHERE id = 1", "INSERT INTO t40 VALUES (1000, 'late', 0)"])
    pipeline.sync()
    pipeline.assert_same(*names)
    # Every chunk copied once: the chunks the killed run committed were not copied again.
    assert pipeline.stats(["snapshot_rows"]) == {"snapshot_rows": rows}
