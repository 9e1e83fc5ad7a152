"""The bulk snapshot of rows of values of several MB (issue #39): a MariaDB table of LONGTEXT and LONGBLOB values and a
PostgreSQL table of TOASTed text, bytea and jsonb values load exact, byte for byte, in a `cdc-pipeline sync` whose
JVM has a small heap. Chunks and fetches are sized by bytes: with the old sizing (one chunk of every row, a fetch of
10,000 rows) the same load runs out of that heap."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tests.helpers.mariadb_source import Pipeline
from tests.helpers.postgres_source import PostgresPipeline
from tests.helpers.runs import start_sync

pytestmark = pytest.mark.integration

MARIADB_ROWS = 20
POSTGRES_ROWS = 4
# Every byte value, 0x00 and 0x5c (a backslash) among them.
EVERY_BYTE = "X'" + bytes(range(256)).hex() + "'"


def small_heap(size: str) -> dict[str, Any]:
    """The connectors file's `spark:` of a sync whose whole JVM (Spark's driver and executors, Debezium) has this heap
    (Spark's own floor of 450 MB lowered)."""
    return {"conf": {"spark.driver.memory": size, "spark.testing.reservedMemory": str(64 << 20)}}


def _sync(name: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    run = start_sync(name, "--json", env=env)
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


def _chunks(pipeline: Any) -> list[int]:
    """The rows of each chunk of the load, in order."""
    return [rows for (rows,) in pipeline.dest_query(
        "SELECT rows FROM cdc.bulk_load_chunks WHERE connector = %s ORDER BY id", (pipeline.name,))]


def test_mariadb_rows_of_several_mb_load_exact_in_a_small_heap(pipeline: Pipeline):
    # About 3 MB of text (tabs, newlines, backslashes, two- and three-byte characters) and 4 MB of every byte value
    # a row, each row's own.
    pipeline.source([
        "CREATE TABLE wide (id INT PRIMARY KEY, body LONGTEXT, data LONGBLOB, note VARCHAR(20))",
        "INSERT INTO wide SELECT seq, CONCAT(REPEAT(CONCAT('a\\tb\\nc\\\\d\\r é 中 ', seq), 150000), seq), "
        f"CONCAT(REPEAT({EVERY_BYTE}, 16384), seq), IF(seq % 2, NULL, 'even') FROM seq_1_to_{MARIADB_ROWS}",
        "ANALYZE TABLE wide",  # the average row size the load sizes its chunks by, as InnoDB's statistics keep it
    ])
    pipeline.write_config(spark=small_heap("256m"))
    assert _sync(pipeline.name, pipeline.env)["snapshot_rows"] == MARIADB_ROWS
    digests = "SELECT id, {md5}(body), {md5}(data), note FROM {table} ORDER BY id"
    source = pipeline.mariadb.query(digests.format(md5="MD5", table="wide"), database=pipeline.source_db)
    dest = pipeline.dest_query(digests.format(md5="md5", table=f'"{pipeline.source_db}".wide'))
    assert [tuple(row) for row in dest] == [tuple(row) for row in source]
    # Rows of about 6.6 MB: 9 a chunk (64 MB), not one chunk of all.
    assert _chunks(pipeline) == [9, 9, 2]


def test_postgres_toasted_values_of_many_mb_load_exact(pg_pipeline: PostgresPipeline):
    # Per row about 8 MB of text (tabs, newlines, backslashes, multi-byte characters), 8 MB of bytea (every byte
    # value) and an 8 MB jsonb document, none of them compressible: TOAST stores them as they are, and the table's
    # size with its TOAST table says their size.
    def pieces(count: int, tail: str, wrap: str = "{}") -> str:
        """A scalar subquery of `count` pieces (an md5 of the row and the piece, then `tail`) joined."""
        joined = f"string_agg(md5((r * 1000000 + i)::text) || {tail}, '')"
        return f"(SELECT {wrap.format(joined)} FROM generate_series(1, {count}) AS i)"

    body = pieces(190_000, r"E'\t\\\n\r é 中'")
    data = pieces(500_000, "''", "decode({}, 'hex')")
    doc = pieces(240_000, r"E'\n\"'", "jsonb_build_object('r', r, 'v', {})")
    pg_pipeline.source([
        "CREATE TABLE items (id integer PRIMARY KEY, body text, data bytea, doc jsonb)",
        f"INSERT INTO items SELECT r, {body}, {data}, {doc} FROM generate_series(1, {POSTGRES_ROWS}) AS r",
        "ANALYZE items",
    ])
    # Spark's JDBC reader holds a row's COPY line (here 33 MB) a few times over as Java strings, per task.
    pg_pipeline.write_config(spark=small_heap("1g"))
    assert _sync(pg_pipeline.name)["snapshot_rows"] == POSTGRES_ROWS
    digests = "SELECT id, md5(body), md5(data), md5(doc::text) FROM items ORDER BY id"
    with psycopg.connect(pg_pipeline.source_dsn) as conn:
        source = conn.execute(digests).fetchall()
    assert pg_pipeline.dest_query(digests) == source
    # Rows of about 24 MB: 2 a chunk (64 MB), not one chunk of all.
    assert _chunks(pg_pipeline) == [2, 2]
