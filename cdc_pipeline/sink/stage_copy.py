"""Keyed stream steps staged by Spark's tasks: the converted rows go from the executors straight into an unlogged
staging table of the destination (the runner's `StageCopyWriter`: COPY over JDBC, in the task that computed them),
and the driver merges them into their table inside the batch's own transaction. No row passes through Python.

A staging table belongs to one connector and one destination table's column list. Its columns are the step's
number, the Spark partition that wrote the row, the change's op, its zero dates written as NULL, the columns it
left out (unchanged TOASTed values, as a JSON array of destination names), the change's seq (its place in the
batch: the merge keeps each key's last change), then each column's converted value as text: the merge casts each
value to its column's type, so a staging table never needs the target's type (which the batch's transaction may be
changing) and never locks it.

Staged rows are committed by the tasks before the merge reads them, outside the batch's transaction, so they are
scratch: a staging table is emptied when a session first uses it and again before each batch, and a crashed run's
rows are never merged. The data and the applied position still commit together, in the batch's transaction.
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
    """The staging tables of one connector's session, and the COPY of a group's step lines into them by Spark's
    tasks: one Spark job for every step of a group (`write_group`), whatever the number of tables it touches."""

    def __init__(self, destination: DestinationConfig, control_schema: str, connector: str) -> None:
        self.destination = destination
        self.control_schema = control_schema
        self.connector = connector
        self._conn: psycopg.Connection | None = None
        self._ready: set[str] = set()  # created and emptied in this session
        self._written: set[str] = set()  # written since they were last emptied
        self._step = 0
        self._jdbc_target = jdbc_target(destination)  # the tasks' JDBC URL, user and password

    def table(self, schema: str, table: str, columns: list[str]) -> sql.Identifier:
        """The staging table for `columns` of `schema.table`, created (and emptied) on its first use this session."""
        return self.tables([(schema, table, columns)])[0]

    def tables(self, targets: list[tuple[str, str, list[str]]]) -> list[sql.Identifier]:
        """The staging tables for each (schema, table, columns); those not used yet this session are created (and
        emptied) together, in one round trip.

        Made on a connection of its own, so the tasks can write them at once: the batch's transaction is open."""
        identifiers, statements, created = [], [], []
        for schema, table, columns in targets:
            digest = hashlib.sha256(json.dumps([self.connector, schema, table, columns]).encode()).hexdigest()[:24]
            name = f"_stage_{digest}"
            identifier = sql.Identifier(self.control_schema, name)
            identifiers.append(identifier)
            if name not in self._ready:
                statements.extend(self._create_statements(identifier, schema, table, columns))
                created.append(name)
        if statements:
            self._connection().execute(sql.SQL("; ").join(statements))
            self._ready.update(created)
        return identifiers

    def _create_statements(self, identifier: sql.Identifier, schema: str, table: str, columns: list[str]
                           ) -> list[sql.Composed]:
        header = [sql.SQL("{} bigint NOT NULL").format(sql.Identifier(STEP)),
                  sql.SQL("{} integer NOT NULL").format(sql.Identifier(PARTITION)),
                  sql.SQL("{} text NOT NULL").format(sql.Identifier(OP)),
                  sql.SQL("{} integer NOT NULL").format(sql.Identifier(ZERO_DATES)),
                  sql.SQL("{} text NOT NULL").format(sql.Identifier(UNCHANGED)),
                  sql.SQL("{} bigint").format(sql.Identifier(SEQ))]
        return [
            sql.SQL("CREATE UNLOGGED TABLE IF NOT EXISTS {} ({})").format(
                identifier, sql.SQL(", ").join(header + [sql.SQL("{} text").format(sql.Identifier(column))
                                                         for column in columns])),
            # A staging table made before the seq was staged gets its column (nullable: it may hold rows until the
            # TRUNCATE below).
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} bigint").format(identifier, sql.Identifier(SEQ)),
            sql.SQL("COMMENT ON TABLE {} IS {}").format(identifier, sql.Literal(
                f"cdc-pipeline: rows staged by Spark's tasks for {self.connector} into {schema}.{table}")),
            sql.SQL("TRUNCATE {}").format(identifier)]

    def write(self, lines: DataFrame, staging: sql.Identifier, columns: list[str]) -> tuple[int, int]:
        """Has Spark's tasks COPY `lines` into `staging` under a new step number (see `write_group`); returns that
        number and how many rows the tasks committed."""
        return self.write_group([(lines, staging, columns)])[0]

    def write_group(self, parts: list[tuple[DataFrame, sql.Identifier, list[str]]]) -> list[tuple[int, int]]:
        """Has Spark's tasks COPY each part's `lines` (one string column: the `LINE_HEADER` fields and the values of
        its `columns`, tab-separated COPY text) into its staging table under a new step number, all in one Spark
        job; returns, per part, that number and how many rows the tasks committed (what its merge must find)."""
        tagged = [lines.toDF(_LINE).select(F.lit(str(index)), _LINE) for index, (lines, _, _) in enumerate(parts)]
        return self.write_tagged(tagged, [(staging, columns) for _, staging, columns in parts])

    def write_tagged(self, frames: list[DataFrame], targets: list[tuple[sql.Identifier, list[str]]]
                     ) -> list[tuple[int, int]]:
        """Has Spark's tasks COPY the rows of `frames` (two string columns: the index of the row's target in
        `targets`, and its line as `write_group` takes it) into each target's staging table, under a new step
        number per target, in one Spark job; returns, per target, that number and the rows the tasks committed.

        The frames' rows are one RDD (a union, coalesced to the default parallelism: a group of hundreds of small
        steps runs as a few tasks, not hundreds)."""
        if not targets:
            return []
        conn = self._connection()
        spark = frames[0].sparkSession
        jvm: Any = spark._jvm
        numbers, stagings, deletes, copies = [], [], [], []
        for staging, columns in targets:
            self._step += 1
            numbers.append(str(self._step))
            staging_name = staging.as_string(conn)
            self._written.add(staging_name)
            stagings.append(staging_name)
            deletes.append(sql.SQL("DELETE FROM {} WHERE {} = ? AND {} = ?").format(
                staging, sql.Identifier(STEP), sql.Identifier(PARTITION)).as_string(conn))
            copies.append(sql.SQL("COPY {} ({}) FROM STDIN").format(staging, sql.SQL(", ").join(
                map(sql.Identifier, [STEP, PARTITION, *LINE_HEADER, *columns]))).as_string(conn))
        rdds = [frame._jdf.queryExecution().toRdd().toJavaRDD() for frame in frames]
        context = spark.sparkContext
        if len(rdds) == 1:
            union = rdds[0]
        else:
            array = context._gateway.new_array(java_class(jvm, "org.apache.spark.api.java.JavaRDD"), len(rdds))
            for index, rdd in enumerate(rdds):
                array[index] = rdd
            union = context._jsc.union(array).coalesce(context.defaultParallelism)
        url, user, password = self._jdbc_target
        separator = "\0"
        staged = context._jsc.sc().collectionAccumulator(f"{self.connector} staged rows")
        writer = java_class(jvm, f"{JAVA_PACKAGE}.StageCopyWriter").forTargets(
            staged, url, user, password, separator.join(stagings), separator.join(numbers), separator.join(deletes),
            separator.join(copies))
        union.foreachPartition(writer)
        counts = [int(count) for count in str(writer.stagedCounts()).split(",")]
        return [(int(number), count) for number, count in zip(numbers, counts)]

    def clear(self) -> None:
        """Empties the staging tables written since the last time; between batches only (a batch's transaction
        that read one would hold the TRUNCATE up)."""
        if not self._written:
            return
        conn = self._connection()
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(
            sql.SQL(name) for name in sorted(self._written))))
        self._written.clear()

    def close(self, jvm: Any = None) -> None:
        """Empties the staging tables and closes the session's connection; with the driver's `jvm`, also the
        connections its tasks kept idle."""
        if jvm is not None:
            try:
                java_class(jvm, f"{JAVA_PACKAGE}.ExecutorJdbc").closeIdle()
            except Py4JError as exc:  # a JVM already gone has closed them
                log.debug("%s: could not close the tasks' idle connections: %s", self.connector, exc)
        if self._conn is not None:
            try:
                if not self._conn.closed and not self._conn.broken:
                    self.clear()
            except psycopg.Error as exc:
                log.warning("%s: could not empty the staging tables: %s", self.connector, exc)
            finally:
                self._conn.close()
                self._conn = None

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = self.destination.connect(self.connector)
        return self._conn
