"""Rows of multi-MB values (issue #39) and `cdc-pipeline sync` runs that move them in a small heap: the values a
MariaDB table's rows are made of, the connectors file's `spark:` of a small JVM, a run's summary, and the md5 of
every value on both sides."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from tests.helpers.mariadb_source import Pipeline
from tests.helpers.postgres_source import PostgresPipeline
from tests.helpers.runs import start_sync

# Every byte value, 0x00 and 0x5c (a backslash) among them.
EVERY_BYTE = "X'" + bytes(range(256)).hex() + "'"


def small_heap(size: str) -> dict[str, Any]:
    """The connectors file's `spark:` of a sync whose whole JVM (Spark's driver and executors, Debezium) has this heap
    (Spark's own floor of 450 MB lowered)."""
    return {"conf": {"spark.driver.memory": size, "spark.testing.reservedMemory": str(64 << 20)}}


def sync_summary(name: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Runs `cdc-pipeline sync NAME --json` to its end; returns its summary (it must succeed)."""
    run = start_sync(name, "--json", env=env)
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


def mariadb_text(seq: str, repeat: int, letter: str = "a") -> str:
    """A MariaDB text expression of about 15 x `repeat` characters (tabs, newlines, backslashes, carriage returns, two-
    and three-byte characters), its own for each `seq`."""
    return f"CONCAT(REPEAT(CONCAT('{letter}\\tb\\nc\\\\d\\r é 中 ', {seq}), {repeat}), {seq})"


def mariadb_bytes(seq: str, repeat: int) -> str:
    """A MariaDB binary expression of 256 x `repeat` bytes (every byte value), its own for each `seq`."""
    return f"CONCAT(REPEAT({EVERY_BYTE}, {repeat}), {seq})"


def assert_same_mariadb_digests(pipeline: Pipeline, table: str, columns: str = "id, {md5}(body), {md5}(data), note",
                                order: str = "id") -> None:
    """The md5 of every value of `columns` (`{md5}` the function) in the destination equals the source's, row by row
    in `order`."""
    digests = "SELECT " + columns + " FROM {table} ORDER BY " + order
    source = pipeline.mariadb.query(digests.format(md5="MD5", table=table), database=pipeline.source_db)
    dest = pipeline.dest_query(digests.format(md5="md5", table=f'"{pipeline.source_db}".{table}'))
    assert [tuple(row) for row in dest] == [tuple(row) for row in source]


def postgres_values(mb: int, row: str = "r") -> str:
    """PostgreSQL expressions of a row's `body` text (tabs, backslashes, newlines, carriage returns, two- and
    three-byte characters), `data` bytea (every byte value) and `doc` jsonb, of about `mb` MB each, none of them
    compressible (TOAST stores them as they are), their own for each value of `row` (an integer expression of the
    FROM item's `r`)."""
    return ", ".join((_pieces(23_750 * mb, row, r"E'\t\\\n\r é 中'"),
                      _pieces(62_500 * mb, row, "''", "decode({}, 'hex')"),
                      _pieces(30_000 * mb, row, r"E'\n\"'", f"jsonb_build_object('r', {row}, 'v', {{}})")))


def _pieces(count: int, row: str, tail: str, wrap: str = "{}") -> str:
    """A scalar subquery of `count` pieces (an md5 of the row and the piece, then `tail`) joined."""
    joined = f"string_agg(md5((({row}) * 1000000 + i)::text) || {tail}, '')"
    return f"(SELECT {wrap.format(joined)} FROM generate_series(1, {count}) AS i)"


def assert_same_postgres_digests(pipeline: PostgresPipeline, table: str = "items",
                                 columns: str = "id, md5(body), md5(data), md5(doc::text)") -> None:
    """The md5 of every value of `columns` in the destination equals the source's, row by row in `id` order."""
    digests = f"SELECT {columns} FROM {table} ORDER BY id"
    with psycopg.connect(pipeline.source_dsn) as conn:
        source = conn.execute(digests).fetchall()
    assert pipeline.dest_query(digests) == source
