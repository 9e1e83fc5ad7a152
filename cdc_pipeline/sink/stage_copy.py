"""Keyed stream steps staged by Spark's tasks: the converted rows go from the executors straight into the
connector's unlogged staging table in the destination (the runner's `StageCopyWriter`: one COPY over JDBC per task,
in the task that computed them), and the driver merges them into their tables inside the batch's own transaction.
No row passes through Python.

One staging table serves every destination table of a connector, so a group of steps on hundreds of tables is one
Spark job and one COPY per task. Its columns are the step's number (each step of a session has its own), the Spark
partition that wrote the row, the change's op, its zero dates written as NULL, the columns it left out (unchanged
TOASTed values, as a JSON array of destination names), the change's seq (its place in the batch: the merge keeps
each key's last change), then the step's columns' converted values as text, by position (`v1`, `v2`, ...: a step
of n columns fills the first n, the rest stay NULL; the table widens as wider steps come). The merge casts each
value to its column's type, so the staging table never needs a target's type (which the batch's transaction may be
changing) and never locks a target.

Staged rows are committed by the tasks before the merge reads them, outside the batch's transaction, so they are
scratch: the staging table is emptied when a session first uses it and again before each batch, and a crashed
run's rows are never merged. The data and the applied position still commit together, in the batch's transaction.

While a destination transaction spans groups (`cycle.TransactionSpan`) it holds the staging table read until its
commit: the table is then `held` and neither emptied nor altered (a TRUNCATE or ALTER on the staging connection
would wait for that transaction for ever). Step numbers keep each merge to its own rows; a step wider than the
table goes to a new staging table (`<name>_<n>`), and the tables left behind are dropped at the next emptying.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import psycopg
from py4j.protocol import Py4JError
from psycopg import sql
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_pipeline.config import DestinationConfig
from cdc_pipeline.capture.runner import JAVA_PACKAGE, java_class, jdbc_target

log = logging.getLogger(__name__)

STEP, PARTITION, OP, ZERO_DATES, UNCHANGED = "_cdc_step", "_cdc_part", "_cdc_op", "_cdc_zeros", "_cdc_unchanged"
SEQ = "_cdc_seq"
# The columns the stage's lines hold before the values, in order (the writer puts the step and partition first).
LINE_HEADER = (OP, ZERO_DATES, UNCHANGED, SEQ)
_LINE = "_cdc_line"


class ExecutorStaging:
    """The connector's staging table in one session, and the COPY of a group's step lines into it by Spark's tasks:
    one Spark job for every step of a group (`write_tagged`), whatever the number of tables it touches."""

    def __init__(self, destination: DestinationConfig, control_schema: str, connector: str) -> None:
        self.destination = destination
        self.control_schema = control_schema
        self.connector = connector
        digest = hashlib.sha256(json.dumps([connector]).encode()).hexdigest()[:24]
        self._base = f"_stage_{digest}"
        self._name = self._base
        self.table = sql.Identifier(control_schema, self._name)
        self.held = False  # a spanning destination transaction read the table: no TRUNCATE, no ALTER now
        self._generation = 0  # the staging tables made in this session beside the first (`held`)
        self._retired: list[sql.Identifier] = []  # staging tables left behind, dropped at the next emptying
        self._conn: psycopg.Connection | None = None
        self._width = 0  # value columns the table has had this session (0: not yet made and emptied)
        self._written = False  # written since it was last emptied
        self._step = 0
        self._jdbc_target = jdbc_target(destination)  # the tasks' JDBC URL, user and password

    @staticmethod
    def value_column(index: int) -> str:
        """The staging table's column of a step's column `index` (from 0)."""
        return f"v{index + 1}"

    @classmethod
    def value_columns(cls, columns: list[str]) -> dict[str, str]:
        """Each of a step's columns (destination names, in its lines' order) -> its staging column."""
        return {column: cls.value_column(index) for index, column in enumerate(columns)}

    def ensure_width(self, width: int) -> None:
        """Makes the staging table (and empties it) on the session's first use; gives it at least `width` value
        columns. Made on a connection of its own, so the tasks can write it at once; before a batch's transaction
        reads it (an ALTER would wait for that transaction's lock)."""
        if width <= self._width and self._width:
            return
        statements = []
        if self._width and self.held:
            # A spanning transaction holds the table read: the wider step goes to a new one.
            self._retired.append(self.table)
            self._generation += 1
            self._name = f"{self._base}_{self._generation}"
            self.table = sql.Identifier(self.control_schema, self._name)
            width, self._width = max(width, self._width), 0
        if not self._width:
            if not self._generation:
                statements += [sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(self.control_schema, name))
                               for name in self._leftovers()]
            header = [sql.SQL("{} bigint NOT NULL").format(sql.Identifier(STEP)),
                      sql.SQL("{} integer NOT NULL").format(sql.Identifier(PARTITION)),
                      sql.SQL("{} text NOT NULL").format(sql.Identifier(OP)),
                      sql.SQL("{} integer NOT NULL").format(sql.Identifier(ZERO_DATES)),
                      sql.SQL("{} text NOT NULL").format(sql.Identifier(UNCHANGED)),
                      sql.SQL("{} bigint").format(sql.Identifier(SEQ))]
            statements += [
                sql.SQL("CREATE UNLOGGED TABLE IF NOT EXISTS {} ({})").format(self.table, sql.SQL(", ").join(header)),
                # Each statement of a merge reads one step's rows.
                sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({})").format(
                    sql.Identifier(f"{self._name}_step"), self.table, sql.Identifier(STEP)),
                sql.SQL("COMMENT ON TABLE {} IS {}").format(self.table, sql.Literal(
                    f"cdc-pipeline: rows staged by Spark's tasks for connector {self.connector}")),
                sql.SQL("TRUNCATE {}").format(self.table)]
        width = max(width, 1)
        statements.append(sql.SQL("ALTER TABLE {} {}").format(self.table, sql.SQL(", ").join(
            sql.SQL("ADD COLUMN IF NOT EXISTS {} text").format(sql.Identifier(self.value_column(index)))
            for index in range(width))))
        self._connection().execute(sql.SQL("; ").join(statements))
        self._width = max(self._width, width)

    def write(self, lines: DataFrame, columns: list[str]) -> tuple[int, int]:
        """Has Spark's tasks COPY `lines` (one string column: the `LINE_HEADER` fields and the values of `columns`,
        tab-separated COPY text) into the staging table under a new step number; returns that number and how many
        rows the tasks committed (what the merge must find)."""
        tagged = lines.toDF(_LINE).select(F.lit("0"), _LINE)
        return self.write_tagged([(tagged, len(columns))], [len(columns)])[0]

    def write_tagged(self, frames: list[tuple[DataFrame, int]], targets: list[int]) -> list[tuple[int, int]]:
        """Has Spark's tasks COPY the rows of `frames` into the staging table, in one Spark job, each target (a
        step, given by its number of columns) under a new step number; returns, per target, that number and the
        rows the tasks committed.

        Each frame has two string columns: the index of the row's target in `targets`, and its line as `write`
        takes it, of the number of columns the frame gives. The frames' rows are one RDD (a union, coalesced to the
        default parallelism: a group of hundreds of small steps runs as a few tasks, not hundreds)."""
        if not targets:
            return []
        width = max(targets)
        self.ensure_width(width)
        conn = self._connection()
        spark = frames[0][0].sparkSession
        jvm: Any = spark._jvm
        numbers = [self._step + 1 + index for index in range(len(targets))]
        self._step += len(targets)
        self._written = True
        rdds = []
        for frame, columns in frames:
            if columns < width:
                # Short lines end with NULLs up to the group's width (a text literal: not written into the code).
                frame = frame.toDF("_cdc_target", _LINE).select(
                    "_cdc_target", F.concat(F.col(_LINE), F.lit("\t\\N" * (width - columns))))
            rdds.append(frame._jdf.queryExecution().toRdd().toJavaRDD())
        context = spark.sparkContext
        if len(rdds) == 1:
            union = rdds[0]
        else:
            array = context._gateway.new_array(java_class(jvm, "org.apache.spark.api.java.JavaRDD"), len(rdds))
            for index, rdd in enumerate(rdds):
                array[index] = rdd
            union = context._jsc.union(array).coalesce(context.defaultParallelism)
        url, user, password = self._jdbc_target
        delete = sql.SQL("DELETE FROM {} WHERE {} BETWEEN ? AND ? AND {} = ?").format(
            self.table, sql.Identifier(STEP), sql.Identifier(PARTITION))
        copy = sql.SQL("COPY {} ({}) FROM STDIN").format(self.table, sql.SQL(", ").join(map(sql.Identifier, [
            STEP, PARTITION, *LINE_HEADER, *(self.value_column(index) for index in range(width))])))
        staged = context._jsc.sc().collectionAccumulator(f"{self.connector} staged rows")
        writer = getattr(jvm, f"{JAVA_PACKAGE}.StageCopyWriter")(
            staged, url, user, password, self.table.as_string(conn), ",".join(map(str, numbers)),
            delete.as_string(conn), copy.as_string(conn))
        union.foreachPartition(writer)
        counts = [int(count) for count in str(writer.stagedCounts()).split(",")]
        return list(zip(numbers, counts))

    def _leftovers(self) -> list[str]:
        """The staging tables an earlier session of the connector made beside its first (`held`) and left."""
        rows = self._connection().execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'r' AND c.relname ~ %s",
            (self.control_schema, f"^{self._base}_[0-9]+$")).fetchall()
        return [row[0] for row in rows]

    def clear(self) -> None:
        """Empties the staging table if it was written since the last time, and drops the tables left behind;
        between batches only (a batch's transaction that read it would hold the TRUNCATE up), and not while
        `held`."""
        if self.held or not (self._written or self._retired):
            return
        statements = [sql.SQL("DROP TABLE IF EXISTS {}").format(table) for table in self._retired]
        if self._written:
            statements.append(sql.SQL("TRUNCATE {}").format(self.table))
        self._connection().execute(sql.SQL("; ").join(statements))
        self._written = False
        self._retired = []

    def close(self, jvm: Any = None) -> None:
        """Empties the staging table and closes the session's connection; with the driver's `jvm`, also the
        connections its tasks kept idle."""
        if jvm is not None:
            try:
                java_class(jvm, f"{JAVA_PACKAGE}.ExecutorJdbc").closeIdle()
            except Py4JError as exc:  # a JVM already gone has closed them
                log.debug("%s: could not close the tasks' idle connections: %s", self.connector, exc)
        if self._conn is not None:
            self.held = False
            try:
                if not self._conn.closed and not self._conn.broken:
                    self.clear()
            except psycopg.Error as exc:
                log.warning("%s: could not empty the staging table: %s", self.connector, exc)
            finally:
                self._conn.close()
                self._conn = None

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = self.destination.connect(self.connector)
        return self._conn
