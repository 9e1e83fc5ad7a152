"""A schema of many tables: a stream group touching all of them is one Spark job (a projection per shape of table,
not per table), every table ends exact, and a value the destination refuses in one table is still named, or set
aside under `skip`, while the other tables' changes of the group apply. MariaDB and PostgreSQL alike (a PostgreSQL
table's text may stay TOASTed in an update: Spark then keeps each key's last change, still in the one job)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

TABLES = 40


def _tables() -> list[str]:
    return [f"t{index:02d}" for index in range(TABLES)]


def _postgres(pipeline) -> bool:
    return not hasattr(pipeline, "mariadb")


def _configure(pipeline, **settings) -> None:
    schema = "public" if _postgres(pipeline) else pipeline.source_db
    pipeline.write_config(apply_batch_events=4096, tables=[f"{schema}.{table}" for table in _tables()], **settings)


def _create_and_load(pipeline) -> None:
    statements = []
    for table in _tables():
        statements += [f"CREATE TABLE {table} (id INT PRIMARY KEY, qty INT NOT NULL, note VARCHAR(20))",
                       f"INSERT INTO {table} SELECT g, g, CONCAT('n', g) FROM "
                       + ("generate_series(1, 5) AS g" if _postgres(pipeline) else "(SELECT seq AS g FROM seq_1_to_5) AS s")]
    pipeline.source(statements)
    pipeline.sync()


def _spread_changes(pipeline, poison_table: str | None = None) -> None:
    """Transactions of four changes on four tables, every table touched; a poison quantity in one table."""
    tables = _tables()
    statements = []
    for index, table in enumerate(tables):
        other, third, fourth = (tables[(index + step) % TABLES] for step in (7, 13, 29))
        qty = 5000 if table == poison_table else 100 + index
        changes = (f"UPDATE {table} SET qty = {qty}, note = 'u' WHERE id = 1; "
                   f"INSERT INTO {other} VALUES ({100 + index}, {index}, 'i'); DELETE FROM {third} WHERE id = 5; "
                   f"UPDATE {fourth} SET id = {200 + index} WHERE id = 2;")
        statements.append(f"BEGIN; {changes} COMMIT;" if _postgres(pipeline)
                          else f"BEGIN NOT ATOMIC START TRANSACTION; {changes} COMMIT; END")
    pipeline.source(statements)


def _spark_jobs(spark) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup())


# Counts the Spark jobs of a group, which a group cut short on a busy machine multiplies: run alone.
@pytest.mark.alone
def test_a_group_touching_many_tables_is_one_staging_job_and_every_table_ends_exact(any_source, spark):
    pipeline = any_source
    # No heartbeat falls inside the runs measured (a PostgreSQL heartbeat's write is an event of one more table).
    _configure(pipeline, **({"heartbeat_interval_seconds": 600} if _postgres(pipeline) else {}))
    _create_and_load(pipeline)
    _spread_changes(pipeline)
    jobs = _spark_jobs(spark)

    summary = pipeline.sync()

    assert summary["updates"] >= TABLES and summary["inserts"] >= TABLES and summary["deletes"] >= TABLES
    # One group: its staging job, and the few of a run (the engine's batches read, a cache); never one per table.
    assert _spark_jobs(spark) - jobs < TABLES // 4
    pipeline.assert_same(*_tables())

    # Later runs' groups (other seqs, other steps) compile no code: their lookup is data, not code. Spark's cache of
    # compiled code is bounded (`spark.sql.codegen.cache.maxEntries`) and shared by the suite's whole session, so
    # the first of them may compile again what earlier tests pushed out; the one after it must compile nothing.
    compilations = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    for step in (1, 2):
        # One transaction, so that each run's group holds every table, as the first run's did.
        updates = " ".join(f"UPDATE {table} SET qty = qty + {step} WHERE id = 3;" for table in _tables())
        pipeline.source([f"BEGIN; {updates} COMMIT;" if _postgres(pipeline)
                         else f"BEGIN NOT ATOMIC START TRANSACTION; {updates} COMMIT; END"])
        before = compilations.getCount()
        assert pipeline.sync()["updates"] == TABLES
    assert compilations.getCount() == before
    pipeline.assert_same(*_tables())


@pytest.mark.parametrize("strategy", ["exit", "skip"])
def test_a_refused_value_in_one_of_many_tables_is_named_or_set_aside(pipeline, strategy):
    _configure(pipeline, error_strategy=strategy)
    _create_and_load(pipeline)
    pipeline.destination.execute(f"ALTER TABLE {pipeline.dest_schema}.t17 ADD CONSTRAINT qty_limit CHECK (qty < 1000)",
                                 dbname=pipeline.dest_db)
    _spread_changes(pipeline, poison_table="t17")

    if strategy == "exit":
        with pytest.raises(Exception, match=r"t17[\s\S]*5000|5000[\s\S]*t17"):
            pipeline.sync()
        # The group holding the refused value was rolled back whole (groups before it may have committed): t17's
        # row and the changes of the same group's transactions around it are not there.
        assert pipeline.dest_rows("t17")[0] == (1, 1, "n1")
        return
    summary = pipeline.sync()
    assert summary["bad_events"] == 1
    letters = pipeline.dest_query("SELECT source_table, op FROM cdc.dead_letters")
    assert letters == [(f"{pipeline.source_db}.t17", "u")]
    pipeline.assert_same(*[table for table in _tables() if table != "t17"])
    assert pipeline.dest_rows("t17")[0] == (1, 1, "n1")
