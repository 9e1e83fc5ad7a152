"""The bulk snapshot of rows of values of several MB (issue #39): a MariaDB table of LONGTEXT and LONGBLOB values and a
PostgreSQL table of TOASTed text, bytea and jsonb values load exact, byte for byte, in a `cdc-pipeline sync` whose
JVM has a small heap. Chunks and fetches are sized by bytes: with the old sizing (one chunk of every row, a fetch of
10,000 rows) the same load runs out of that heap."""

from __future__ import annotations

from typing import Any

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

pytestmark = pytest.mark.integration

MARIADB_ROWS = 20
POSTGRES_ROWS = 4


def _chunks(pipeline: Any) -> list[int]:
    """The rows of each chunk of the load, in order."""
    return [rows for (rows,) in pipeline.dest_query(
        "SELECT rows FROM cdc.bulk_load_chunks WHERE connector = %s ORDER BY id", (pipeline.name,))]


def test_mariadb_rows_of_several_mb_load_exact_in_a_small_heap(pipeline: Pipeline):
    # About 3 MB of text (tabs, newlines, backslashes, two- and three-byte characters) and 4 MB of every byte value
    # a row, each row's own.
    pipeline.source([
        "CREATE TABLE wide (id INT PRIMARY KEY, body LONGTEXT, data LONGBLOB, note VARCHAR(20))",
        f"INSERT INTO wide SELECT seq, {mariadb_text('seq', 150000)}, {mariadb_bytes('seq', 16384)}, "
        f"IF(seq % 2, NULL, 'even') FROM seq_1_to_{MARIADB_ROWS}",
        "ANALYZE TABLE wide",  # the average row size the load sizes its chunks by, as InnoDB's statistics keep it
    ])
    pipeline.write_config(spark=small_heap("256m"))
    assert sync_summary(pipeline.name, pipeline.env)["snapshot_rows"] == MARIADB_ROWS
    assert_same_mariadb_digests(pipeline, "wide")
    # Rows of about 6.6 MB: 9 a chunk (64 MB), not one chunk of all.
    assert _chunks(pipeline) == [9, 9, 2]


def test_postgres_toasted_values_of_many_mb_load_exact(pg_pipeline: PostgresPipeline):
    # Per row about 8 MB of text (tabs, newlines, backslashes, multi-byte characters), 8 MB of bytea (every byte
    # value) and an 8 MB jsonb document, none of them compressible: TOAST stores them as they are, and the table's
    # size with its TOAST table says their size.
    pg_pipeline.source([
        "CREATE TABLE items (id integer PRIMARY KEY, body text, data bytea, doc jsonb)",
        f"INSERT INTO items SELECT r, {postgres_values(8)} FROM generate_series(1, {POSTGRES_ROWS}) AS r",
        "ANALYZE items",
    ])
    # Spark's JDBC reader holds a row's COPY line (here 33 MB) a few times over as Java strings, per task.
    pg_pipeline.write_config(spark=small_heap("1g"))
    assert sync_summary(pg_pipeline.name)["snapshot_rows"] == POSTGRES_ROWS
    assert_same_postgres_digests(pg_pipeline)
    # Rows of about 24 MB: 2 a chunk (64 MB), not one chunk of all.
    assert _chunks(pg_pipeline) == [2, 2]
