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
from psycopg import sql
from pyspark.sql import DataFrame

from cdc_pipeline.config import DestinationConfig
from cdc_pipeline.capture.runner import JAVA_PACKAGE, jdbc_target

log = logging.getLogger(__name__)

STEP, PARTITION, OP, ZERO_DATES, UNCHANGED = "_cdc_step", "_cdc_part", "_cdc_op", "_cdc_zeros", "_cdc_unchanged"
SEQ = "_cdc_seq"
# The columns the stage's lines hold before the values, in order (the writer puts the step and partition first).
LINE_HEADER = (OP, ZERO_DATES, UNCHANGED, SEQ)


class ExecutorStaging:
    """The staging tables of one connector's session, and the COPY of a step's lines into one by Spark's tasks."""

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
        """The staging table for `columns` of `schema.table`, created (and emptied) on its first use this session.

        Made on a connection of its own, so the tasks can write it at once: the batch's transaction is open."""
        digest = hashlib.sha256(json.dumps([self.connector, schema, table, columns]).encode()).hexdigest()[:24]
        name = f"_stage_{digest}"
        identifier = sql.Identifier(self.control_schema, name)
        if name not in self._ready:
            header = [sql.SQL("{} bigint NOT NULL").format(sql.Identifier(STEP)),
                      sql.SQL("{} integer NOT NULL").format(sql.Identifier(PARTITION)),
                      sql.SQL("{} text NOT NULL").format(sql.Identifier(OP)),
                      sql.SQL("{} integer NOT NULL").format(sql.Identifier(ZERO_DATES)),
                      sql.SQL("{} text NOT NULL").format(sql.Identifier(UNCHANGED)),
                      sql.SQL("{} bigint").format(sql.Identifier(SEQ))]
            conn = self._connection()
            conn.execute(sql.SQL("CREATE UNLOGGED TABLE IF NOT EXISTS {} ({})").format(
                identifier, sql.SQL(", ").join(header + [sql.SQL("{} text").format(sql.Identifier(column))
                                                         for column in columns])))
            # A staging table made before the seq was staged gets its column (nullable: it may hold rows until the
            # TRUNCATE below).
            conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} bigint").format(
                identifier, sql.Identifier(SEQ)))
            conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(identifier, sql.Literal(
                f"cdc-pipeline: rows staged by Spark's tasks for {self.connector} into {schema}.{table}")))
            conn.execute(sql.SQL("TRUNCATE {}").format(identifier))
            self._ready.add(name)
        return identifier

    def write(self, lines: DataFrame, staging: sql.Identifier, columns: list[str]) -> tuple[int, int]:
        """Has Spark's tasks COPY `lines` (one string column: the `LINE_HEADER` fields and the values of
        `columns`, tab-separated COPY text) into `staging` under a new step number; returns that number and how
        many rows the tasks committed (what the merge must find)."""
        self._step += 1
        conn = self._connection()
        self._written.add(staging.as_string(conn))
        jvm: Any = lines.sparkSession._jvm
        url, user, password = self._jdbc_target
        delete = sql.SQL("DELETE FROM {} WHERE {} = ? AND {} = ?").format(
            staging, sql.Identifier(STEP), sql.Identifier(PARTITION))
        copy = sql.SQL("COPY {} ({}) FROM STDIN").format(staging, sql.SQL(", ").join(
            map(sql.Identifier, [STEP, PARTITION, *LINE_HEADER, *columns])))
        staged = lines.sparkSession.sparkContext._jsc.sc().longAccumulator(f"{self.connector} staged rows")
        writer = getattr(jvm, f"{JAVA_PACKAGE}.StageCopyWriter")(
            url, user, password, staging.as_string(conn), self._step, delete.as_string(conn), copy.as_string(conn),
            staged)
        lines._jdf.queryExecution().toRdd().toJavaRDD().foreachPartition(writer)
        return self._step, int(staged.value())

    def clear(self) -> None:
        """Empties the staging tables written since the last time; between batches only (a batch's transaction
        that read one would hold the TRUNCATE up)."""
        if not self._written:
            return
        conn = self._connection()
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(
            sql.SQL(name) for name in sorted(self._written))))
        self._written.clear()

    def close(self) -> None:
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
