"""A DML step on its own path: a step after a schema change in its group, a keyless table's, one with transforms or
with a key move, a table's second step of the group, and any step whose group staging or merge round failed.

Its destination is prepared (`DestinationTables.prepare_dml`), then a keyed step's net changes are merged per key
(staged by Spark's tasks and merged by the destination, or, for `apply_copy: driver` and to name a value the merge
refused, collected and COPYed by the driver), with its key moves applied in source order (`key_moves`); a keyless
table's changes go to `keyless`. A failure names the column, the value and the event where it can.
"""

from __future__ import annotations

import json
import logging
from contextlib import nullcontext
from dataclasses import replace

import psycopg
from psycopg import sql
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_pipeline.capture.spark import collect_lines
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.convert.dml import (
    ColumnPlan,
    apply_error,
    compact_by_key,
    may_leave_values_out,
    unavailable_placeholder,
)
from cdc_pipeline.convert.dml_lines import DmlLines
from cdc_pipeline.errors import ConversionError, StagingMismatchError
from cdc_pipeline.mapping import objmap, transform_sql
from cdc_pipeline.sink import stage_copy
from cdc_pipeline.sink.dead_letters import SPARK_ERRORS, DeadLetters, spark_failure
from cdc_pipeline.sink.destination_tables import DestinationTables
from cdc_pipeline.sink.key_moves import key_moves, move_key
from cdc_pipeline.sink.keyless import apply_keyless
from cdc_pipeline.sink.merge_round import drop_superseded_sql, merge_sql
from cdc_pipeline.sink.plan import DmlStep, with_frame
from cdc_pipeline.sink.stage_copy import ExecutorStaging
from cdc_pipeline.sink.table_writes import (
    TemporaryStaging,
    copy_lines,
    match_columns,
    on_conflict,
    report_zero_dates,
)

log = logging.getLogger(__name__)


class DmlStepPath:
    """Applies DML steps one at a time, each on its own path."""

    def __init__(self, conn: psycopg.Connection, connector: ConnectorConfig, tables: DestinationTables,
                 staging: ExecutorStaging | None, lines: DmlLines, dead_letters: DeadLetters) -> None:
        self.conn = conn
        self.connector = connector
        self.tables = tables
        # With staging, Spark's tasks COPY a keyed step's rows into the destination (`stage_copy`); without, the
        # driver collects them and COPYs them.
        self.staging = staging
        self.lines = lines
        self.temporary = TemporaryStaging()
        self.dead_letters = dead_letters

    def apply(self, cur: psycopg.Cursor, step: DmlStep) -> int:
        """Applies the step (its events set aside left out); returns how many zero dates were written as NULL."""
        with_frame(step)
        if self.dead_letters.set_aside_seqs and step.frame is not None:
            step = replace(step, frame=step.frame.where(~F.col("seq").isin(sorted(self.dead_letters.set_aside_seqs))))
        prepared = self.tables.prepare_dml(cur, step)
        schema, table, columns, transforms, key = (prepared.schema, prepared.table, prepared.columns,
                                                   prepared.transforms, prepared.key)
        position = step.last_ref.position if step.last_ref else None
        try:
            # With transforms, a savepoint: a transform failing on a value is then traced to its column and event.
            with self.conn.transaction() if transforms else nullcontext():
                if key:
                    return self._apply_keyed(cur, schema, table, step, columns, key, transforms)
                return apply_keyless(cur, self.connector, self.temporary, schema, table, step, columns, transforms)
        except SPARK_ERRORS as exc:
            message, seq = spark_failure(exc)
            ref = self.dead_letters.event(seq)
            if ref is None:
                raise ConversionError(f"cannot convert changes to {schema}.{table} (events {step.first_seq}.."
                                      f"{step.last_seq} of the batch): {message}", connector=self.connector.name,
                                      table=step.source_table, position=position) from exc
            # The event's own table, from the runner's index: a malformed line has none of its own.
            named = ConversionError(f"cannot convert event {seq} of the batch (op {ref.op}): {message}",
                                    connector=self.connector.name, table=ref.source_table, position=ref.position)
            named.seq = seq
            raise named from exc
        except psycopg.Error as exc:
            refs = {ref.seq: ref for ref in self.dead_letters.batch_refs}
            failed = transforms and transform_sql.transform_error(
                cur, step.frame, columns, transforms, connector=self.connector.name, table=step.source_table,
                target=f"{schema}.{table}", refs=refs)
            if failed:
                raise failed from exc
            raise apply_error(exc, step.frame, columns, connector=self.connector.name, table=step.source_table,
                              target=f"{schema}.{table}", seqs=(step.first_seq, step.last_seq),
                              position=position, refs=refs) from exc

    def _apply_keyed(self, cur: psycopg.Cursor, schema: str, table: str, step: DmlStep, columns: list[ColumnPlan],
                     key: list[str], transforms: dict[str, objmap.Transform]) -> int:
        """Merges the step's net changes per key; returns how many zero dates were written as NULL.

        A key update whose new row leaves TOASTed values out (`key_moves`) has its values nowhere in the batch: the
        destination's row of the old key holds them. The step is then applied in source order: the changes before
        each such key update merged, the update applied to the old row (`move_key`), the changes after it merged.
        """
        moves = key_moves(step, self.dead_letters.step_refs, columns, key, unavailable_placeholder(self.connector))
        if not moves:
            return self._merge_keyed_any(cur, schema, table, step, columns, key, transforms)
        seqs = [ref.seq for ref in self.dead_letters.step_refs(step)]
        zero_dates_written, first = 0, step.first_seq
        for move in moves:
            zero_dates_written += self._merge_seq_range(cur, schema, table, step, first, move.delete_seq - 1, seqs,
                                                        columns, key, transforms)
            zero_dates_written += move_key(cur, self.connector.name, schema, table, step, move, columns, key,
                                           transforms)
            first = move.create_seq + 1
        return zero_dates_written + self._merge_seq_range(cur, schema, table, step, first, step.last_seq, seqs,
                                                          columns, key, transforms)

    def _merge_keyed_any(self, cur: psycopg.Cursor, schema: str, table: str, step: DmlStep,
                         columns: list[ColumnPlan], key: list[str], transforms: dict[str, objmap.Transform]) -> int:
        if self.staging is not None:
            return self._merge_keyed_staged(cur, schema, table, step, columns, key, transforms)
        return self._merge_keyed(cur, schema, table, step, columns, key, transforms)

    def _merge_seq_range(self, cur: psycopg.Cursor, schema: str, table: str, step: DmlStep, first: int, last: int,
                         seqs: list[int], columns: list[ColumnPlan], key: list[str],
                         transforms: dict[str, objmap.Transform]) -> int:
        """Merges the step's changes from seq `first` to `last` (none: nothing to do)."""
        if not any(first <= seq <= last for seq in seqs):
            return 0
        part = replace(step, first_seq=first, last_seq=last, frame=step.frame.where(F.col("seq").between(first, last)))
        return self._merge_keyed_any(cur, schema, table, part, columns, key, transforms)

    def _merge_keyed(self, cur: psycopg.Cursor, schema: str, table: str, step: DmlStep, columns: list[ColumnPlan],
                     key: list[str], transforms: dict[str, objmap.Transform]) -> int:
        """Deletes and upserts the net changes per key; returns how many zero dates were written as NULL.

        A column an update left out (an unchanged TOASTed value, sent as a placeholder) is not written: the
        destination keeps its stored value. Transformed columns are staged as text and transformed in the merge.
        """
        compacted, key_columns, placeholder = self._net_changes(schema, table, step, columns, key)
        lines = collect_lines(compacted.select(self.lines.merge(columns, key_columns, placeholder)))
        upserts: dict[tuple[str, ...], list[str]] = {}
        deletes: list[str] = []
        zero_dates_written = 0
        for line in lines:
            header, copy_text = line.split("\t", 1)
            op, zeros, unchanged = header.split(" ", 2)
            if op == "d":
                deletes.append(copy_text)
                continue
            zero_dates_written += int(zeros)
            upserts.setdefault(tuple(json.loads(unchanged)) if unchanged != "[]" else (), []).append(copy_text)
        target = sql.Identifier(schema, table)
        key_names = [column.dest_name for column in key_columns]
        values = transform_sql.staged_values(columns, transforms, "s")
        if deletes:
            staging = self.temporary.create(cur, target, key_names, transforms)
            copy_lines(cur, staging, key_names, deletes)
            cur.execute(sql.SQL("DELETE FROM {t} AS t USING {s} AS s WHERE {match}").format(
                t=target, s=staging, match=match_columns(key_names, "t", values)))
        names = [column.dest_name for column in columns]
        for unchanged, lines in upserts.items():
            staging = self.temporary.create(cur, target, names, transforms)
            copy_lines(cur, staging, names, lines)
            written = [name for name in names if name not in unchanged]
            cur.execute(sql.SQL(
                "INSERT INTO {t} AS t ({cols}) SELECT {values} FROM {s} AS s ON CONFLICT ({key}) {action}").format(
                t=target, s=staging, cols=sql.SQL(", ").join(map(sql.Identifier, written)),
                values=sql.SQL(", ").join(values[name] for name in written),
                key=sql.SQL(", ").join(map(sql.Identifier, key_names)), action=on_conflict(written, key_names)))
        return report_zero_dates(self.connector.name, step, zero_dates_written)

    def _net_changes(self, schema: str, table: str, step: DmlStep, columns: list[ColumnPlan], key: list[str],
                     compact: bool = True) -> tuple[DataFrame, list[ColumnPlan], str | None]:
        """The step's last change per key (lazily, in Spark; with `compact` false, every change, for a merge that
        keeps each key's last itself), the key's columns and the TOAST placeholder."""
        by_dest = {column.dest_name: column for column in columns}
        missing = [name for name in key if name not in by_dest]
        if missing:
            raise ConversionError(f"primary key column(s) {missing} of {schema}.{table} are not in the change events",
                                  connector=self.connector.name, table=step.source_table)
        key_columns = [by_dest[name] for name in key]
        placeholder = unavailable_placeholder(self.connector)
        if not compact or set(step.ops) <= {"c", "r"}:
            # Inserts and snapshot reads alone never repeat a key: no compaction (and no shuffle) needed.
            return step.frame, key_columns, placeholder
        return (compact_by_key(step.frame, [column.source_name for column in key_columns], columns, placeholder),
                key_columns, placeholder)

    def _merge_keyed_staged(self, cur: psycopg.Cursor, schema: str, table: str, step: DmlStep,
                            columns: list[ColumnPlan], key: list[str], transforms: dict[str, objmap.Transform]) -> int:
        """`_merge_keyed` with the rows staged by Spark's tasks (`stage_copy`): the net changes never reach Python.

        PostgreSQL refusing a value in the merge (a cast, a constraint) says less than a COPY into the table does
        (which names the column, the value and its line), so the merge is undone (a savepoint) and the step is
        applied again through the driver (`_merge_keyed`), whose COPY fails with the column, value and event.

        Each key's last change is kept by the destination (`drop_superseded_sql`), from every change staged with its
        seq: Spark's compaction would cost the job a shuffle. Only where a change may leave a TOASTed value out does
        Spark compact (`compact_by_key`), which takes such a value from an earlier change of the key.
        """
        assert self.staging is not None
        in_spark = may_leave_values_out(columns, unavailable_placeholder(self.connector))
        compacted, key_columns, placeholder = self._net_changes(schema, table, step, columns, key, compact=in_spark)
        names = [column.dest_name for column in columns]
        staging = self.staging.table
        number, staged = self.staging.write(compacted.select(self.lines.stage(columns, key_columns, placeholder)),
                                            names)
        self._check_staged_rows(cur, step, staging, number, staged)
        try:
            with self.conn.transaction():
                if not in_spark and not set(step.ops) <= {"c", "r"}:
                    cur.execute(drop_superseded_sql(staging, number, key_columns, columns))
                return self._merge_staged(cur, schema, table, step, staging, number, columns, key_columns, transforms)
        except psycopg.Error as exc:
            if self.conn.broken or isinstance(exc, psycopg.OperationalError):
                raise
            log.info("%s: the merge into %s.%s refused a staged value (%s); applying the step through the driver "
                     "to name it", self.connector.name, schema, table, exc.diag.message_primary or exc)
            return self._merge_keyed(cur, schema, table, step, columns, key, transforms)

    def _check_staged_rows(self, cur: psycopg.Cursor, step: DmlStep, staging: sql.Identifier, number: int,
                           staged: int) -> None:
        """Raises StagingMismatchError unless the batch's transaction sees exactly the rows the tasks committed for
        step `number`: a merge that saw fewer would drop changes while the position commits."""
        seen = cur.execute(sql.SQL("SELECT pg_catalog.count(*) FROM {} WHERE {} = {}").format(
            staging, sql.Identifier(stage_copy.STEP), sql.Literal(number))).fetchone()[0]
        if seen != staged:
            raise StagingMismatchError(
                f"the merge sees {seen} of the {staged} rows Spark's tasks staged in {staging.as_string(cur)} "
                f"(events {step.first_seq}..{step.last_seq} of the batch): the batch is not applied",
                connector=self.connector.name, table=step.source_table,
                position=step.last_ref.position if step.last_ref else None)

    def _merge_staged(self, cur: psycopg.Cursor, schema: str, table: str, step: DmlStep, staging: sql.Identifier,
                      number: int, columns: list[ColumnPlan], key_columns: list[ColumnPlan],
                      transforms: dict[str, objmap.Transform]) -> int:
        """Deletes and upserts the staged net changes of step `number`; returns the zero dates written as NULL."""
        unchanged_column = sql.Identifier("s", stage_copy.UNCHANGED)
        cur.execute(sql.SQL("SELECT {u}, sum(s.{z}) FROM {s} AS s WHERE s.{step} = {n} AND s.{op} <> 'd' "
                            "GROUP BY {u}").format(
            u=unchanged_column, z=sql.Identifier(stage_copy.ZERO_DATES), s=staging,
            step=sql.Identifier(stage_copy.STEP), n=sql.Literal(number), op=sql.Identifier(stage_copy.OP)))
        groups = cur.fetchall()
        for statement in merge_sql(schema, table, step, staging, number, columns, key_columns, transforms,
                                   [unchanged_text for unchanged_text, _ in groups]):
            cur.execute(statement)
        return report_zero_dates(self.connector.name, step, sum(int(zero_dates) for _, zero_dates in groups))
