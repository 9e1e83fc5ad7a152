"""The stream of rows of values of several MB (issue #39): MariaDB rows of LONGTEXT and LONGBLOB values updated,
inserted and deleted, and PostgreSQL rows of TOASTed text, bytea and jsonb values of tens of MB (their unchanged-TOAST
placeholder among them), applied exact, byte for byte, by a `cdc-pipeline sync` whose JVM has a small heap. A stream
whose driver JVM runs out of heap fails saying so, and the next run with enough heap applies every change once."""

from __future__ import annotations

import pytest

from tests.helpers.large_values import (
    assert_same_mariadb_digests,
    assert_same_postgres_digests,
    mariadb_bytes,
    mariadb_text,
    postgres_values,
    small_heap,
    sync_summary,
)
from tests.helpers.mariadb_source import Pipeline
from tests.helpers.postgres_source import PostgresPipeline
from tests.helpers.runs import start_sync

pytestmark = pytest.mark.integration

WIDE = "CREATE TABLE wide (id INT PRIMARY KEY, body LONGTEXT, data LONGBLOB, note VARCHAR(20))"


def _wide_rows(first: int, last: int, letter: str = "a") -> str:
    """Rows `first`..`last` of `wide`: about 2.6 MB of text and 4 MB of every byte value each, each row's own."""
    return (f"SELECT seq, {mariadb_text('seq', 150000, letter)}, {mariadb_bytes('seq', 16384)}, "
            f"IF(seq % 2, NULL, 'even') FROM seq_{first}_to_{last}")


def test_mariadb_rows_of_several_mb_updated_stream_exact_in_a_small_heap(pipeline: Pipeline):
    pipeline.source([WIDE, f"INSERT INTO wide {_wide_rows(1, 3)}"])
    pipeline.write_config(apply_batch_mb=16, spark=small_heap("768m"), idle_timeout_seconds=0.5)
    assert sync_summary(pipeline.name, pipeline.env)["snapshot_rows"] == 3
    # Every row's values replaced by others of the same size (an update's event carries both: about 13 MB), in one
    # transaction of more than two groups; then rows inserted and deleted.
    pipeline.source([
        "UPDATE wide SET body = REPLACE(body, 'a', 'z'), data = REVERSE(data), note = 'updated'",
        f"INSERT INTO wide {_wide_rows(4, 6, letter='n')}",
        "DELETE FROM wide WHERE id IN (2, 5)",
    ])

    summary = sync_summary(pipeline.name, pipeline.env)

    assert (summary["inserts"], summary["updates"], summary["deletes"]) == (3, 3, 2)
    assert_same_mariadb_digests(pipeline, "wide")
    assert [id_ for (id_,) in pipeline.dest_query(f'SELECT id FROM "{pipeline.source_db}".wide ORDER BY id')] == [
        1, 3, 4, 6]


def test_postgres_toasted_values_of_tens_of_mb_stream_exact(pg_pipeline: PostgresPipeline):
    # A row of about 21 MB: 7 MB each of text, bytea and jsonb, TOASTed as they are. The idle timeout is short (the
    # heartbeat as often as the fixture's), so that the run is quiet for longer than it while its walsender decodes
    # the row's transaction and then Debezium decodes the event: the first run after the insert still applies it.
    pg_pipeline.source(["CREATE TABLE items (id integer PRIMARY KEY, note text, body text, data bytea, doc jsonb)"])
    pg_pipeline.write_config(apply_batch_mb=16, spark=small_heap("1g"), idle_timeout_seconds=0.4,
                             heartbeat_interval_seconds=1)
    sync_summary(pg_pipeline.name)
    pg_pipeline.source([f"INSERT INTO items SELECT r, 'new', {postgres_values(7)} FROM generate_series(1, 1) AS r"])

    assert sync_summary(pg_pipeline.name)["inserts"] == 1
    assert_same_postgres_digests(pg_pipeline, columns="id, note, md5(body), md5(data), md5(doc::text)")

    pg_pipeline.source([
        # Only `note` changes: the big values arrive as Debezium's placeholder, the destination keeps its own.
        "UPDATE items SET note = 'noted' WHERE id = 1",
        # Then new big values of the same size.
        f"UPDATE items SET (note, body, data, doc) = (SELECT 'replaced', {postgres_values(7, row='r + 10')} "
        "FROM (VALUES (1)) AS v (r)) WHERE id = 1",
    ])

    assert sync_summary(pg_pipeline.name)["updates"] == 2
    assert_same_postgres_digests(pg_pipeline, columns="id, note, md5(body), md5(data), md5(doc::text)")


def test_a_stream_out_of_heap_fails_saying_so_and_the_next_run_applies_it_exact(pipeline: Pipeline):
    # A keyless table: a change applied twice would be two rows.
    pipeline.source(["CREATE TABLE wide (id INT, body LONGTEXT, data LONGBLOB, note VARCHAR(20))"])
    pipeline.write_config(apply_batch_mb=64, spark=small_heap("256m"), idle_timeout_seconds=0.5)
    sync_summary(pipeline.name, pipeline.env)
    # 5 rows (33 MB): 4 ran the 256 MB heap out as well, 3 did not.
    pipeline.source([f"INSERT INTO wide {_wide_rows(1, 5)}"])

    run = start_sync(pipeline.name, env=pipeline.env)
    _, err = run.communicate(timeout=600)

    assert run.returncode == 1, err[-4000:]
    message = err.strip().splitlines()[-1]
    assert "ran out of memory" in message and pipeline.name in message, message
    assert "spark.driver.memory (it was 256m)" in message and "apply_batch_mb (it was 64)" in message, message
    assert "Connection refused" not in err

    pipeline.write_config(apply_batch_mb=16, spark=small_heap("640m"), idle_timeout_seconds=0.5)
    sync_summary(pipeline.name, pipeline.env)

    assert_same_mariadb_digests(pipeline, "wide")
