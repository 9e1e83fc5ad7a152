"""The bulk snapshot engine (snapshot_engine: spark) against real servers: tables copied in chunks by Spark, over
several runs when one run's budget does not hold them, killed between and inside chunks, with the source written
during the load; keys of every shape; the hand-over to the stream exact for tables with and without a key."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from conftest import Pipeline, kill_at, kill_when

pytestmark = pytest.mark.integration

KEYED = "CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(64), price DECIMAL(12,2), qty INT, " \
        "changed DATETIME(3), note TEXT)"
KEYLESS = "CREATE TABLE events (kind VARCHAR(20), amount INT)"


def _fill(pipeline: Pipeline, rows: int, start: int = 1) -> None:
    """Inserts `rows` rows into `items` (ids from `start`) in one statement (MariaDB's sequence tables)."""
    pipeline.source(
        "INSERT INTO items SELECT seq, CONCAT('item ', seq), seq * 1.25, seq % 97, "
        "TIMESTAMP('2024-01-01') + INTERVAL seq SECOND, IF(seq % 10 = 0, NULL, REPEAT('x', seq % 50)) "
        f"FROM seq_{start}_to_{start + rows - 1}")


def _keyless_rows(pipeline: Pipeline, rows: int) -> None:
    pipeline.source("INSERT INTO events SELECT IF(seq % 3 = 0, 'dup', CONCAT('k', seq % 7)), seq % 5 "
                    f"FROM seq_1_to_{rows}")


def _chunks(pipeline: Pipeline) -> list[tuple]:
    return pipeline.dest_query("SELECT source_table, count(*), count(done_at), coalesce(sum(rows), 0) "
                               "FROM cdc.bulk_load_chunks WHERE connector = %s GROUP BY 1 ORDER BY 1",
                               (pipeline.name,))


def test_tables_copy_in_chunks_then_stream(pipeline: Pipeline):
    pipeline.source([KEYED, KEYLESS])
    _fill(pipeline, 5_000)
    _keyless_rows(pipeline, 3_000)
    pipeline.write_config(snapshot_chunk_rows=700)
    summary = pipeline.sync()
    assert summary["snapshot_rows"] == 8_000
    pipeline.assert_same("items")
    assert Counter(pipeline.dest_rows("events")) == Counter(pipeline.source_rows("events"))
    # 5,000 keyed rows in chunks of 700 (the last holds the rest); the keyless table is one chunk.
    assert _chunks(pipeline) == [(f"{pipeline.source_db}.events", 1, 1, 3_000),
                                 (f"{pipeline.source_db}.items", 8, 8, 5_000)]
    assert pipeline.stats(["snapshot_rows"]) == {"snapshot_rows": 8_000}
    pipeline.source(["INSERT INTO items (id, name) VALUES (100000, 'new')", "UPDATE items SET qty = -1 WHERE id < 10",
                     "DELETE FROM items WHERE id BETWEEN 10 AND 20", "INSERT INTO events VALUES ('dup', 0)",
                     "DELETE FROM events WHERE kind = 'k1' LIMIT 5"])
    pipeline.sync()
    pipeline.assert_same("items")
    assert Counter(pipeline.dest_rows("events")) == Counter(pipeline.source_rows("events"))
