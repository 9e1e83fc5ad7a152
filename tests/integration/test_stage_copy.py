"""Keyed steps staged by Spark's tasks (`apply_copy: executors`, the default) against the driver's COPY."""

from __future__ import annotations

from types import SimpleNamespace

import psycopg
import pytest
from psycopg import sql
from pyspark.sql import functions as F

from cdc_pipeline.config import DestinationConfig, Secret
from cdc_pipeline.mapping.transform_sql import staged_cast_type
from cdc_pipeline.sink.merge_round import drop_superseded_sql
from cdc_pipeline.sink.stage_copy import ExecutorStaging

ITEMS = """CREATE TABLE items (
    id INT PRIMARY KEY,
    name VARCHAR(40),
    amount DECIMAL(12,2),
    made DATETIME(3),
    note TEXT)"""


@pytest.mark.parametrize("text, cast_to", [
    ("character varying(64)", "text"),
    ("character(3)", "text"),
    ("character varying(64)[]", "character varying[]"),
    ("numeric(12,2)[]", "numeric[]"),
    ("bit(4)", "bit varying"),
    ("bit varying(8)", "bit varying"),
    ("numeric(12,2)", "numeric(12,2)"),
    ("timestamp(3) without time zone", "timestamp(3) without time zone"),
    ("geometry(Point,4326)", "geometry(Point,4326)"),
    ("integer", "integer"),
])
def test_staged_text_is_cast_without_a_modifier_that_would_cut_it_silently(text, cast_to):
    assert staged_cast_type(text) == cast_to


def _changes(pipeline) -> None:
    pipeline.source([
        "INSERT INTO items VALUES (1001, 'tab\\there', 1.5, '2024-02-29 23:59:59.999', 'line\\nbreak \\\\ back'), "
        "(1002, NULL, NULL, NULL, NULL)",
        "UPDATE items SET amount = amount * 2, name = CONCAT(name, ' ✓') WHERE id <= 40",
        "UPDATE items SET amount = amount + 1 WHERE id <= 20",
        "DELETE FROM items WHERE id BETWEEN 41 AND 60",
        "INSERT INTO items VALUES (45, 'again', 4.5, NULL, 'a key deleted and inserted again')",
        "UPDATE items SET id = 3000 WHERE id = 61",
        "DELETE FROM items WHERE id = 1002",
    ])


@pytest.mark.integration
@pytest.mark.parametrize("apply_copy", ["executors", "driver"])
def test_both_copiers_replicate_inserts_updates_deletes_and_key_changes(pipeline, apply_copy):
    pipeline.write_config(apply_copy=apply_copy)
    pipeline.source([ITEMS, "INSERT INTO items SELECT seq, CONCAT('item ', seq), seq / 4, "
                            "TIMESTAMP('2024-01-01') + INTERVAL seq SECOND, REPEAT('x', seq % 7) FROM seq_1_to_100"])
    pipeline.sync()
    _changes(pipeline)

    summary = pipeline.sync()

    assert (summary["inserts"], summary["deletes"]) == (4, 22)
    pipeline.assert_same("items")
    staged = pipeline.dest_query("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                                 "WHERE n.nspname = 'cdc' AND c.relkind = 'r' AND c.relname LIKE '\\_stage\\_%'")[0][0]
    assert staged == (1 if apply_copy == "executors" else 0)


@pytest.mark.integration
def test_rows_a_crashed_run_left_in_a_staging_table_are_never_merged(pipeline):
    pipeline.source([ITEMS, "INSERT INTO items SELECT seq, CONCAT('item ', seq), seq, NULL, 'x' FROM seq_1_to_10"])
    pipeline.sync()
    pipeline.source("UPDATE items SET note = 'streamed' WHERE id = 1")
    pipeline.sync()
    (staging,) = pipeline.dest_query("SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                                     "WHERE n.nspname = 'cdc' AND c.relkind = 'r' AND c.relname LIKE '\\_stage\\_%'")[0]
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        # What a run killed between its tasks' COPY and its merge leaves: rows of the first steps.
        conn.execute(sql.SQL("INSERT INTO {} SELECT step, part, 'c', 0, '[]', 7000 + 10 * step + part, 'stale', '1', "
                             "NULL, 'stale' FROM generate_series(1, 5) AS step, generate_series(0, 7) AS part").format(
            sql.Identifier("cdc", staging)))
    pipeline.source(["UPDATE items SET note = 'later' WHERE id = 2", "DELETE FROM items WHERE id = 3"])

    pipeline.sync()
    pipeline.assert_same("items")


def _staging(destination_pg, database: str) -> ExecutorStaging:
    """The staging table of a connector named after `database`, a new destination database with a `cdc` schema."""
    destination_pg.create_database(database)
    destination_pg.execute("CREATE SCHEMA cdc", dbname=database)
    return ExecutorStaging(DestinationConfig(dsn=Secret(destination_pg.dsn(database)), control_schema="cdc"),
                           "cdc", database)


@pytest.mark.integration
def test_a_task_attempt_done_again_replaces_its_rows_instead_of_adding_them(destination_pg, spark):
    database = "stage_attempts"
    staging = _staging(destination_pg, database)
    try:
        table = staging.table
        lines = spark.range(0, 1000, numPartitions=3).select(
            F.concat_ws("\t", F.lit("c"), F.lit("0"), F.lit("[]"), F.col("id").cast("string"),  # op, zeros, unchanged, seq
                        F.col("id").cast("string"), F.lit("n")))
        step, staged = staging.write(lines, ["id", "name"])
        assert staged == 1000
        staging._step = step - 1  # the same step again, as Spark running its tasks a second time would write it
        assert staging.write(lines, ["id", "name"]) == (step, 1000)

        with psycopg.connect(destination_pg.dsn(database)) as conn:
            counts = conn.execute(sql.SQL("SELECT _cdc_part, count(*), count(DISTINCT v1) FROM {} GROUP BY 1 "
                                          "ORDER BY 1").format(table)).fetchall()
        assert [count for _, count, _ in counts] == [333, 333, 334]
        assert all(count == distinct for _, count, distinct in counts)
    finally:
        staging.close()


@pytest.mark.integration
def test_superseded_changes_are_dropped_without_a_join_the_statistics_could_make_quadratic(destination_pg, spark):
    """Statistics gathered while a staging table held one step say the next step (a new number) has no rows: a
    self-join planned on them ran as a nested loop, a minute a group of 18,000 changes. The delete keeps each key's
    last change with no join at all."""
    database = "stage_superseded"
    staging = _staging(destination_pg, database)
    try:
        table = staging.table

        def lines(seqs, keys):  # op, zero dates, unchanged, seq; then id and name
            return spark.range(0, seqs, numPartitions=2).select(F.concat_ws(
                "\t", F.lit("u"), F.lit("0"), F.lit("[]"), F.col("id").cast("string"),
                (F.col("id") % keys).cast("string"), F.concat(F.lit("v"), F.col("id").cast("string"))))

        first, _ = staging.write(lines(3000, 3000), ["id", "name"])
        with psycopg.connect(destination_pg.dsn(database), autocommit=True) as conn:
            conn.execute(sql.SQL("ANALYZE {}").format(table))  # statistics of step `first` alone
        second, staged = staging.write(lines(6000, 2000), ["id", "name"])  # each key changed three times
        assert second != first and staged == 6000
        with psycopg.connect(destination_pg.dsn(database)) as conn, conn.cursor() as cur:
            key, name = SimpleNamespace(dest_name="id"), SimpleNamespace(dest_name="name")
            drop = drop_superseded_sql(table, second, [key], [key, name])  # type: ignore[arg-type]
            cur.execute(drop)
            kept = cur.execute(sql.SQL("SELECT v1, v2 FROM {} WHERE _cdc_step = %s ORDER BY v1::int").format(
                table), (second,)).fetchall()
            plan = "\n".join(row[0] for row in cur.execute(
                sql.SQL("EXPLAIN ") + drop).fetchall())
        assert kept == [(str(key), f"v{key + 4000}") for key in range(2000)], "each key's last change, by seq"
        assert "Join" not in plan and "Nested Loop" not in plan, plan
    finally:
        staging.close()
