"""Events set aside as dead letters, and which failures are an event's.

Under the `skip` error strategy each step on its own path runs in a savepoint (`apply_or_set_aside`); a DML step
that fails is narrowed down to the events that fail, which go to the dead letters (`cdc.dead_letters`, in the
batch's transaction, naming their source transaction: `transaction_of`) and count as bad events, while the rest of
the batch applies. A failure is an event's when it is Spark's (`SPARK_ERRORS`: `spark_failure` reads the event its
message names) or the destination's refusal of a value; the connection's, or the bookkeeping's, fails the batch.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from typing import Callable

import psycopg
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from cdc_pipeline import control
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.decode.events import BEGIN, DATA_CHANGE, SCHEMA_CHANGE, TRUNCATE, EventRef, index_entry_of
from cdc_pipeline.errors import CdcError, ConversionError, StagingMismatchError, TableOwnerError
from cdc_pipeline.sink.destination_tables import DestinationTables
from cdc_pipeline.sink.plan import DML_COUNTERS, BatchPlan, DdlStep, DmlStep, SnapshotStep, TruncateStep

log = logging.getLogger(__name__)

SKIP = "skip"
# Spark's failures: PySpark's own exceptions, or Py4JJavaError from a call made through py4j directly.
SPARK_ERRORS = (PySparkException, Py4JJavaError)
# What a step may fail with because of its events (a value the destination refuses, a conversion, a transform).
SKIPPABLE_ERRORS = (psycopg.Error, CdcError, *SPARK_ERRORS)
# The message of Spark's raise_error (a malformed event line) and the seq it names.
_RAISED_IN_SPARK = re.compile(r"\[USER_RAISED_EXCEPTION\] (.*?)(?: SQLSTATE: \w+)?$", re.MULTILINE)
_SEQ_IN_MESSAGE = re.compile(r"\(seq (\d+)\b")

ApplyStep = Callable[[psycopg.Cursor, BatchPlan, "DdlStep | DmlStep | TruncateStep | SnapshotStep"], None]
"""A step's own path (`steps.StepPath.apply`)."""


def spark_failure(error: BaseException) -> tuple[str, int | None]:
    """What a failed Spark job says in one line (the message an expression raised, if one did), and the seq of the
    event it names, if any."""
    if isinstance(error, Py4JJavaError):
        text = str(error.java_exception.getMessage() or error.java_exception.toString())
    else:
        text = str(error)
    raised = _RAISED_IN_SPARK.search(text)
    message = raised.group(1) if raised else text.strip().splitlines()[0] if text.strip() else repr(error)
    seq = _SEQ_IN_MESSAGE.search(message)
    return message, int(seq.group(1)) if seq else None


class DeadLetters:
    """The applying batch's events (`batch_refs`) and those set aside as dead letters (`set_aside_seqs`)."""

    def __init__(self, conn: psycopg.Connection, connector: ConnectorConfig, control_schema: str,
                 tables: DestinationTables) -> None:
        self.conn = conn
        self.connector = connector
        self.control_schema = control_schema
        self.tables = tables
        self.batch_refs: list[EventRef] = []
        self.set_aside_seqs: set[int] = set()

    def begin(self, refs: list[EventRef]) -> None:
        """A batch of these events begins: none of them is set aside yet."""
        self.batch_refs = refs
        self.set_aside_seqs = set()

    def event(self, seq: int | None) -> EventRef | None:
        """The applying batch's event of this seq (failure paths only: a scan of the batch's index)."""
        return next((ref for ref in self.batch_refs if ref.seq == seq), None)

    def step_refs(self, step: DmlStep) -> list[EventRef]:
        """The step's data changes, in source order (those set aside left out)."""
        return [ref for ref in self.batch_refs
                if ref.kind == DATA_CHANGE and ref.source_table == step.source_table
                and step.first_seq <= ref.seq <= step.last_seq and ref.seq not in self.set_aside_seqs]

    def apply_or_set_aside(self, cur: psycopg.Cursor, plan: BatchPlan,
                           step: DdlStep | DmlStep | TruncateStep | SnapshotStep, apply_step: ApplyStep) -> None:
        """Applies the step on its own path (`apply_step`) in a savepoint; sets aside the events it fails on."""
        error = self._try_in_savepoint(cur, plan, step, lambda: apply_step(cur, plan, step))
        if error is None:
            return
        if isinstance(step, DmlStep):
            refs = [ref for ref in plan.parsed.refs if ref.kind == DATA_CHANGE and ref.source_table == step.source_table
                    and ref.schema_id == step.schema_id and step.first_seq <= ref.seq <= step.last_seq
                    and ref.seq not in self.set_aside_seqs]
            self._set_aside_failures(cur, plan, step, refs, error, apply_step)
        else:
            self.set_aside(cur, plan, step.ref, error)

    def _raise_unless_event_error(self, error: BaseException, step: object) -> None:
        """Errors of the destination connection or of the snapshot's bookkeeping are not an event's: they fail
        the batch under every strategy."""
        if self.conn.closed or self.conn.broken or isinstance(error, (psycopg.OperationalError, StagingMismatchError,
                                                                       TableOwnerError)) \
                or isinstance(step, SnapshotStep):
            raise error

    def _set_aside_failures(self, cur: psycopg.Cursor, plan: BatchPlan, step: DmlStep, refs: list[EventRef],
                            error: BaseException, apply_step: ApplyStep) -> None:
        """Applies what it can of a failed DML step, in source order, and sets aside the events that fail.

        The step's events are halved, each half applied in its own savepoint (first half first, so order holds),
        and a failing half is halved again, down to single events: a poison event among n costs about 2 log2(n)
        Spark jobs, on this failure path only.
        """
        if len(refs) <= 1:
            if refs:
                self.set_aside(cur, plan, refs[0], error)
            return
        half = len(refs) // 2
        for part in (refs[:half], refs[half:]):
            sub_step = DmlStep(step.source_table, step.schema_id, part[0].seq, part[-1].seq,
                               ops=Counter(ref.op for ref in part), last_ref=part[-1], fields=step.fields,
                               frame=step.frame.where(F.col("seq").between(part[0].seq, part[-1].seq))
                               if step.frame is not None else None)
            error = self._try_in_savepoint(cur, plan, sub_step, lambda: apply_step(cur, plan, sub_step))
            if error is not None:
                self._set_aside_failures(cur, plan, sub_step, [ref for ref in part if ref.seq not in
                                                               self.set_aside_seqs], error, apply_step)

    def _try_in_savepoint(self, cur: psycopg.Cursor, plan: BatchPlan, step: object, apply: Callable[[], None]
                          ) -> BaseException | None:
        """Runs `apply` in a savepoint (a failure undoes it only); returns the event error it failed with, or None.

        An error naming its event (a malformed line: `ConversionError.seq`) sets that event aside at once and
        tries again without it.
        """
        while True:
            try:
                with self.tables.savepoint():
                    apply()
                return None
            except SKIPPABLE_ERRORS as exc:
                self._raise_unless_event_error(exc, step)
                ref = self.event(exc.seq) if isinstance(exc, ConversionError) else None
                if ref is None or ref.seq in self.set_aside_seqs:
                    return exc
                self.set_aside(cur, plan, ref, exc)

    def set_aside(self, cur: psycopg.Cursor, plan: BatchPlan, ref: EventRef, error: BaseException) -> None:
        """Moves one event to the dead letters (same transaction) and counts it as a bad event, not as applied."""
        if ref.kind == DATA_CHANGE:
            raw_event = plan.parsed.data_line(ref.seq)
            schema = plan.parsed.batch.schemas.get(ref.schema_id or "")
            value_schema = json.dumps(schema) if schema is not None else None
        else:
            raw_event, value_schema = json.dumps(index_entry_of(ref), default=str), None
        message = str(error)
        self.set_aside_seqs.add(ref.seq)
        # The rest of its source transaction applies without it: the letter names the transaction.
        position = {**ref.position, **({"transaction": transaction} if (transaction := self.transaction_of(ref))
                                       else {})}
        letter_id = control.add_dead_letter(cur, self.control_schema, control.DeadLetter(
            connector=self.connector.name, source_table=ref.source_table, op=ref.op, position=position,
            raw_event=raw_event, value_schema=value_schema, error=message))
        counter = {DATA_CHANGE: DML_COUNTERS.get(ref.op or ""), SCHEMA_CHANGE: "ddls",
                   TRUNCATE: "truncates"}.get(ref.kind) or "other_events"
        setattr(plan.counts, counter, max(0, getattr(plan.counts, counter) - 1))
        plan.counts.bad_events += 1
        log.warning("%s: event %d of the batch (table %s, op %s, position %s) set aside as dead letter %d%s: %s",
                    self.connector.name, ref.seq, ref.source_table, ref.op, position, letter_id,
                    f"; the rest of source transaction {position['transaction']} applies without it"
                    if "transaction" in position else "", message)

    def transaction_of(self, ref: EventRef) -> str | None:
        """The id of the source transaction an event of the applying batch is in (its BEGIN's, when in the batch)."""
        begin = None
        for other in self.batch_refs:
            if other.seq >= ref.seq:
                break
            if other.transaction is not None:
                status, transaction = other.transaction
                begin = transaction if status == BEGIN else None
        return begin
