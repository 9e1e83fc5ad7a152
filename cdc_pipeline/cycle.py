"""One fetch cycle of a connector, as steps: open the session, fetch, parse, convert, apply, mark complete.

Dagster's job calls these steps one op each; nothing here imports Dagster. Fetch, parse and convert are lazy
(like Spark's transformations): apply drives them one group of batches at a time, so the engine keeps
capturing while a group is applied, and memory holds one group, not the whole cycle. The session holds the run lock
(one cycle per connector at a time), the destination connection and the running Debezium engine.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import logging
import queue
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, Iterator, TypeVar

import psycopg
from pyspark.sql import SparkSession

from cdc_pipeline import control, faults, run_progress, sources
from cdc_pipeline.bulk_load import bookkeeping
from cdc_pipeline.bulk_load.engine import BulkLoader
from cdc_pipeline.run_progress import process_started_epoch
from cdc_pipeline.decode import offsets
from cdc_pipeline.mapping import objmap, rule_store
from cdc_pipeline.sink.apply import BatchApplier
from cdc_pipeline.sink.plan import BatchPlan, DmlStep, attach_dml_frames, plan_batch, snapshot_marker
from cdc_pipeline.config import ConnectorConfig, DestinationConfig
from cdc_pipeline.errors import CdcError, ConnectorPausedError, RunnerError
from cdc_pipeline.decode.events import (TRANSACTION, EventRef, ParsedBatch, has_data_changes, parse_index, row_events,
                                         StreamRedeliveries)
from cdc_pipeline.capture.runner import (
    NON_STREAMING_MODES,
    DebeziumRunner,
    FetchedBatch,
    debezium_properties,
    engine_failure,
    merge_batches,
    position_lost_failure,
)
from cdc_pipeline.convert.schema_infer import SCHEMA_FROM_EVENTS_TYPES
from cdc_pipeline.capture.spark import SparkStart, batch_dataframe, driver_death, driver_exit_code, working_on
from cdc_pipeline.fetch_phases import FetchCycle
from cdc_pipeline.sink.stage_copy import ExecutorStaging
from cdc_pipeline.sink import unseen_tables
from cdc_pipeline.sources.lost_position import LostPosition

log = logging.getLogger(__name__)

STATE_CHECK_SECONDS = 1.0  # how often a running cycle looks whether its connector was paused
RETRY = "retry"
# Snapshot modes that copy the tables' rows (when they take a snapshot at all): under the bulk snapshot engine the
# Debezium engine then takes the schema snapshot only, and the bulk load copies the rows.
ROW_COPYING_MODES = ("initial", "initial_only", "when_needed", "always")


@dataclass
class CycleStats:
    """The numbers of one fetch cycle, with the time spent in each phase."""

    batches: int = 0
    counts: control.BatchCounts = field(default_factory=control.BatchCounts)
    started_at: float = field(default_factory=time.monotonic)
    first_fetch_at: float | None = None
    last_commit_at: float | None = None
    last_commit_epoch: float | None = None
    first_row_epoch: float | None = None  # when the first row this cycle wrote moved (`rows_committed`)
    finished_at: float | None = None
    phase_seconds: dict[str, float] = field(default_factory=dict)
    bulk_snapshot_pending: bool = False  # the connector's bulk snapshot goes on in a later run
    budget_spent: bool = False  # the run ended at its budget with the stream not idle: the backlog goes on later
    groups_run_ahead: int = 0  # groups fetched, parsed and converted while the one before was applied

    @property
    def seconds(self) -> float:
        return (self.finished_at or time.monotonic()) - self.started_at

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.add_seconds(phase, time.monotonic() - started)

    def add_seconds(self, phase: str, seconds: float) -> None:
        """Counts seconds spent in a phase (`index`: making withheld keys and indexes, inside another phase)."""
        self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + seconds

    def pipeline_rate(self) -> float:
        """Events per second from the first fetched batch to the last destination commit."""
        if self.first_fetch_at is None or self.last_commit_at is None or self.last_commit_at <= self.first_fetch_at:
            return 0.0
        return self.counts.events / (self.last_commit_at - self.first_fetch_at)

    def lag_seconds(self) -> float | None:
        """Seconds from the source's commit of the cycle's last applied change to its apply."""
        if self.counts.last_source_ms is None or self.last_commit_epoch is None:
            return None
        return round(max(0.0, self.last_commit_epoch - self.counts.last_source_ms / 1000), 3)

    def rows_committed(self, sent_epoch: float | None = None) -> None:
        """Rows were committed (sent from `sent_epoch`, a load's chunks: when the first chunk's copy began; a group:
        now): the first time is kept."""
        self.first_row_epoch = self.first_row_epoch or sent_epoch or time.time()

    def first_row_seconds(self) -> float | None:
        """Seconds from this process's start to its first row moved (a run's fixed cost, as a user sees it): sent
        into the destination by a chunk of a load, or committed by a group of the stream."""
        started = process_started_epoch()
        if self.first_row_epoch is None or started is None:
            return None
        return round(self.first_row_epoch - started, 2)

    def as_dict(self) -> dict[str, Any]:
        events = self.counts.events
        lag = self.lag_seconds()
        first_row = self.first_row_seconds()
        return {
            "batches": self.batches,
            **self.counts.as_dict(),
            **({} if lag is None else {"lag_seconds": lag}),
            **({} if first_row is None else {"first_row_seconds": first_row}),
            **({} if self.first_row_epoch is None else {"first_row_epoch": round(self.first_row_epoch, 3)}),
            "seconds": round(self.seconds, 3),
            "events_per_second": round(events / self.seconds, 1) if self.seconds > 0 else 0.0,
            "pipeline_events_per_second": round(self.pipeline_rate(), 1),
            **({"bulk_snapshot_pending": True} if self.bulk_snapshot_pending else {}),
            **({"budget_spent": True} if self.budget_spent else {}),
            **({"groups_run_ahead": self.groups_run_ahead} if self.groups_run_ahead else {}),
            **{f"{phase}_seconds": round(value, 3) for phase, value in self.phase_seconds.items()},
        }


def queue_capacity(connector: ConnectorConfig) -> int:
    """Runner batches the engine may capture ahead of the pipeline: two groups' worth, so it keeps capturing
    while a group is applied."""
    return max(4, 2 * -(-connector.apply_batch_events // connector.batch_size))


# A group whose rows hold this many bytes is let go of at once once applied (`_apply_all`).
LARGE_GROUP_BYTES = 32 << 20
# Groups' worth of bytes the runner holds at most (queued and in flight): the group applied, the next one run ahead,
# and the one being gathered.
HELD_GROUPS = 3


def held_bytes(connector: ConnectorConfig) -> int:
    """The bytes of rows the runner holds at most, queued and in flight (`RunnerParameters.setHeldBytes`)."""
    return HELD_GROUPS * (connector.apply_batch_mb << 20)


class TransactionSpan:
    """A destination transaction that spans groups: the groups of one source transaction larger than a group's
    bounds, from its first to the one its END is in (`fetch_phases`). Each group applies in a savepoint inside it
    (`BatchApplier.apply`'s transaction nests), the applied position with it; the runner lets go of each group's
    rows (`DebeziumRunner.release`) but marks none complete until the span commits, so a kill anywhere inside it
    leaves the destination at the previous source commit and the engine gives the whole transaction again."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self._transaction = conn.transaction()
        self._transaction.__enter__()
        self.groups = 0
        self.events = 0
        self.batch_ids: list[int] = []
        self.started = time.monotonic()

    def add(self, batch: FetchedBatch) -> None:
        self.groups += 1
        self.events += batch.size
        self.batch_ids.extend(batch.batch_ids)

    def commit(self) -> None:
        self._transaction.__exit__(None, None, None)

    def rollback(self) -> None:
        """Undoes every group of the span (nothing of it was marked complete); a broken connection has undone it."""
        if self.conn.closed or self.conn.broken:
            return
        self._transaction.__exit__(psycopg.Rollback, psycopg.Rollback(), None)


class ConnectorSession:
    """The live parts of one connector's fetch cycle: destination connection, run lock, Debezium engine.

    Opening it honours the connector's persisted state: a paused connector starts no cycle; a restart request's
    snapshot mode, or a `start_offset` given to the run, takes effect before the engine starts.
    """

    def __init__(self, connector: ConnectorConfig, destination: DestinationConfig, spark: SparkSession | SparkStart,
                 start_offset: str | None = None, linger_seconds: float = 0.0,
                 linger_yields: Callable[[], bool] | None = None,
                 cancelled: threading.Event | None = None, stands: Callable[[], bool] | None = None) -> None:
        self.connector = connector
        self.destination = destination
        self._spark = spark
        self.start_offset = start_offset
        # A stream that applied a change ends only after this long without another (FetchCycle._linger_extra), unless
        # `linger_yields` says other work waits for the machine (the Dagster layer's: other runs queued).
        self.linger_seconds = linger_seconds
        self.linger_yields = linger_yields or (lambda: False)
        # A standing run (the Dagster layer's, for a served run): a quiet stream goes on until the run's budget while
        # this says so (FetchCycle._linger_extra), whether or not the run applied anything.
        self.stands = stands or (lambda: False)
        self.standing = stands is not None  # its budget counts from its first change (FetchCycle.stream_deadline)
        # Set when whoever asked for the cycle went away (a pipeline server's client): the cycle ends as a pause does.
        self.cancelled = cancelled
        self._conn: psycopg.Connection | None = None
        self._thread_conn = threading.local()  # the run-ahead thread's own connection (`run_ahead`)
        self.runner: DebeziumRunner | None = None
        self.cycle_stats = CycleStats()
        self.applied_offset: dict[str, Any] | None = None
        # Which streamed events this run was given before (`StreamRedeliveries`), made once the applied offset is read.
        self.redeliveries: StreamRedeliveries | None = None
        self.resumed_from: dict[str, Any] | None = None
        self.snapshot_mode = connector.snapshot_mode
        self._requested_mode: str | None = None
        self.object_map: objmap.ObjectMap | None = None
        self._locked = False
        self._phase: str | None = None
        self._last_transaction: Any = None
        self._state_checked_at = 0.0
        self._awaited_checked_at = 0.0
        self._next_run_awaited = False
        self.takes_data_snapshot = False  # Debezium's engine copies the rows (snapshot_engine: debezium) in this run
        self.snapshot_ended = False  # the last event of this run's engine snapshot was fetched
        self.bulk_load_pending = False  # a bulk snapshot is to run (or go on) before the stream is applied
        self.awaits_schema_snapshot = False  # ... once this run's engine has taken its schema snapshot
        self.snapshot_positions: dict[str, dict[str, Any]] = {}
        self.load_end: dict[str, Any] | None = None  # a finished load's end, until the stream has applied past it
        self.applied_batch_ids: list[int] = []
        self._completed_batch_ids: set[int] = set()
        self._staging: ExecutorStaging | None = None
        self.checked_end: dict[str, Any] | None = None  # the stream's idle end, recorded once all is applied
        self.stop_fetching = False  # the stream is to end at once (the run-ahead's consumer stopped)
        self.streaming = False  # the fetch step is in its stream phase
        self.stage_counters = run_progress.StageCounters()  # groups parsed and applied, for `progress`
        self.progress: run_progress.ProgressReporter | None = None  # samples the queues while the engine runs
        self.span: TransactionSpan | None = None  # the destination transaction of a source one spanning groups

    @property
    def conn(self) -> psycopg.Connection | None:
        """The destination connection of the calling thread: the run's own (which holds the run lock and applies
        the batches), or the run-ahead thread's (its phases and state reads, never inside a batch's transaction)."""
        return getattr(self._thread_conn, "conn", None) or self._conn

    @conn.setter
    def conn(self, value: psycopg.Connection | None) -> None:
        self._conn = value

    @property
    def spark(self) -> SparkSession:
        """The run's Spark session; one still starting (`SparkStart`) is waited for here, at its first use."""
        if isinstance(self._spark, SparkStart):
            self._spark = self._spark.session()
        return self._spark

    @property
    def jvm(self) -> Any:
        """The driver JVM (without waiting for a session still starting)."""
        return self._spark._jvm

    @property
    def control_schema(self) -> str:
        return self.destination.control_schema

    @property
    def streams(self) -> bool:
        """Whether the engine streams after its snapshot in this cycle's snapshot mode."""
        return self.snapshot_mode not in NON_STREAMING_MODES

    def open(self) -> "ConnectorSession":
        """Connects, takes the run lock, refuses a paused connector, applies a pending snapshot mode or start
        offset, marks the connector initializing, re-reads the mapping rules (renaming and retyping what they
        changed) and starts its engine."""
        name = self.connector.name
        self.conn = self.destination.connect(name)
        control.ensure_control_schema(self.conn, self.control_schema)
        if self.destination.operator_role:
            control.grant_operator(self.conn, self.control_schema, self.destination.operator_role)
        control.acquire_run_lock(self.conn, name)
        self._locked = True
        control.clear_run_progress(self.conn, self.control_schema, name)
        state = control.read_state(self.conn, self.control_schema, name) or {}
        self._refuse_if_halted(state.get("state"))
        if self.start_offset is not None:
            offset = offsets.parse_offset(self.start_offset, name, self.connector.type)
            offsets.move_offset(self.conn, self.control_schema, name, self.connector.type, self.connector.database,
                                offset)
            log.info("%s: replaying from offset %s", name, json.dumps(offset))
        self._requested_mode = state.get("next_snapshot_mode")
        self.snapshot_mode = self._snapshot_mode(self._requested_mode)
        stage = control.STAGE_SCHEMA_SYNC if self.snapshot_mode == "schemasync" else None
        if not self._set_state(control.INITIALIZING, stage=stage, clear_error=True):
            self._refuse_if_halted(control.PAUSED)
        # Recorded again when the cycle succeeds: a cycle killed or failed leaves none, so the next sync runs a cycle.
        control.record_run_digest(self.conn, self.control_schema, name, None)
        # A snapshot taken now starts over: none of its events is a re-delivery of what was applied before it
        # (the last row of an earlier snapshot has the same binlog position as the first rows of this one).
        # An offset taken inside a snapshot makes Debezium take that snapshot again from its start.
        in_snapshot = control.offset_in_snapshot(self.conn, self.control_schema, name)
        had_offset = control.has_offset(self.conn, self.control_schema, name)
        takes_snapshot = self.snapshot_mode == "always" or in_snapshot or not (
            had_offset
            # The bulk engine's load was begun: PostgreSQL's engine stores no offset before the first change it
            # streams (its slot holds the position), so none says so.
            or (self.connector.bulk_snapshot and self.connector.type in SCHEMA_FROM_EVENTS_TYPES
                and bookkeeping.has_load(self.conn, self.control_schema, name)))
        if not takes_snapshot:
            self._start_past_checked()
            takes_snapshot = self._snapshot_for_lost_position()
        self.takes_data_snapshot = takes_snapshot and not self.connector.bulk_snapshot \
            and self.snapshot_mode in ROW_COPYING_MODES
        self.applied_offset = None if takes_snapshot else control.read_applied_offset(self.conn, self.control_schema,
                                                                                       name)
        # Where the engine resumes: re-delivered events come from there on (see events.redelivery_test).
        self.resumed_from = None if takes_snapshot else control.read_engine_offset(self.conn, self.control_schema, name)
        self.redeliveries = StreamRedeliveries(self.applied_offset, self.resumed_from, connector=name)
        self.object_map = rule_store.reload_mapping(self.conn, self.control_schema, self.connector)
        engine_mode = (self._prepare_bulk_load(takes_snapshot, had_offset) if self.connector.bulk_snapshot
                       else self.snapshot_mode)
        connector = dataclasses.replace(self.connector, snapshot_mode=engine_mode)
        if takes_snapshot:
            sources.drop_lost_slot(connector)
        sources.prepare_capture(connector)
        # The engine needs the driver JVM only: it starts while a session still starting is being made.
        self.runner = DebeziumRunner(self._spark, name, debezium_properties(connector, self.destination),
                                     queue_capacity=queue_capacity(self.connector),
                                     held_bytes=held_bytes(self.connector), failure_error=self.engine_error)
        self.runner.start()
        self.progress = run_progress.ProgressReporter(self.destination, name, self.stage_counters,
                                                      self.runner.progress, lambda: self.streaming,
                                                      self.conn.info.backend_pid)
        self.progress.start()
        # Timed from here; keys and indexes made above (a load reconciled by an earlier run's stream) stay counted.
        self.cycle_stats = CycleStats(phase_seconds=self.cycle_stats.phase_seconds)
        self._set_state(control.SYNCING, phase=control.PHASE_FETCHING)
        return self

    def _snapshot_for_lost_position(self) -> bool:
        """Whether this cycle takes a new snapshot because the source no longer holds the engine's stored position
        (`sources.lost_position`): under `on_position_lost: snapshot` or `snapshot_mode: when_needed` it does (the
        cycle's mode becomes `always`); else the cycle fails before its engine starts, naming the command that
        recovers."""
        assert self.conn is not None
        name = self.connector.name
        lost = sources.lost_position(self.connector, control.read_engine_offset(self.conn, self.control_schema, name))
        if lost is None:
            return False
        if self.connector.on_position_lost != "snapshot" and self.snapshot_mode != "when_needed":
            raise lost.error(name)
        log.warning("%s; taking a new snapshot (%s)", lost.first_line(name).split("; recover with")[0],
                    "snapshot_mode: when_needed" if self.snapshot_mode == "when_needed" else
                    "on_position_lost: snapshot")
        self.snapshot_mode = "always"
        return True

    def engine_error(self, engine_text: str | None) -> CdcError:
        """The error of the failed engine: when Debezium says the source no longer holds the stored position, that
        first (the connector, the position, what the source holds, the command that recovers) and Debezium's text
        below; else Debezium's text and, for a known cause, what to do."""
        name = self.connector.name
        if not position_lost_failure(engine_text):
            return RunnerError(engine_failure(engine_text), connector=name)
        lost = sources.lost_position(self.connector, self.resumed_from) or LostPosition(
            json.dumps(self.resumed_from) if self.resumed_from else "(none stored)",
            "the engine's log reader found it gone (Debezium's words below)")
        return lost.error(name, engine_text)

    def _start_past_checked(self) -> None:
        """Moves the engine's stored offset on to the position a change check or an idle run recorded as read, when
        the source's package can start its engine there (`resume_offset`: MariaDB/MySQL, past other databases' events
        after the last change captured), so that a run does not read again what is known to hold nothing to capture.
        Not for an offset given to the run, nor while a bulk load runs or waits to be reconciled against the stream."""
        assert self.conn is not None
        resume = sources.module_for(self.connector.type).resume_offset
        schema, name = self.control_schema, self.connector.name
        if resume is None or self.start_offset is not None or not self.streams \
                or bookkeeping.running_load(self.conn, schema, name) is not None \
                or bookkeeping.unreconciled_end(self.conn, schema, name) is not None:
            return
        stored = control.read_engine_offset(self.conn, schema, name)
        try:
            moved = resume(self.connector, (control.read_state(self.conn, schema, name) or {}).get("source_checked"),
                           stored)
        except CdcError as exc:
            log.warning("%s: %s; the engine starts from its stored offset", name, exc.message)
            return
        if moved is not None:
            offsets.advance_engine_offset(self.conn, schema, name, moved)
            log.info("%s: the engine starts from %s, read by the change check up to there (its stored offset was %s)",
                     name, json.dumps(moved), json.dumps(stored))

    def _prepare_bulk_load(self, takes_snapshot: bool, has_offset: bool) -> str:
        """Under the bulk snapshot engine: begins a new load when this cycle's snapshot mode copies rows, and
        returns the snapshot mode the Debezium engine starts with (the schema only, when rows are copied).

        A new load starts the engine's position over (its offset and schema history are dropped): the load's
        chunks must all be read after the position the stream starts from.
        """
        assert self.conn is not None
        name, schema = self.connector.name, self.control_schema
        copies_rows = takes_snapshot and self.snapshot_mode in ROW_COPYING_MODES
        if not copies_rows:
            # A run that stopped after its batch passed the load's end and before reconciling it.
            self.load_end = bookkeeping.unreconciled_end(self.conn, schema, name)
            self.reconcile_load(self.applied_offset)
        if copies_rows:
            if has_offset:
                bookkeeping.forget_engine_position(self.conn, schema, name)
                has_offset = False
            bookkeeping.begin_load(self.conn, schema, name)
        self.bulk_load_pending = bookkeeping.running_load(self.conn, schema, name) is not None
        # The load waits for the engine's start (its schema snapshot, or its slot) when it begins now, and when the
        # engine has no position yet (a load begun by a run that failed before its engine started streaming).
        self.awaits_schema_snapshot = copies_rows or (self.bulk_load_pending and not has_offset)
        self.snapshot_positions = bookkeeping.snapshot_positions(self.conn, schema, name)
        if not copies_rows:
            # A load begun, and no offset yet: the engine streams from where its load began (for PostgreSQL, its
            # slot) and copies no rows.
            streams_only = not has_offset and self.snapshot_mode in ("initial", "when_needed")
            return "no_data" if streams_only else self.snapshot_mode
        return "schemasync" if self.snapshot_mode == "initial_only" else "no_data"

    def run_bulk_load(self, deadline: float) -> bool:
        """Runs (or goes on with) the connector's bulk snapshot until it is done (True) or the run's budget is
        spent or the connector paused (False). The batches applied so far are first marked complete, so that the
        engine's position, where the stream goes on from, is kept whatever happens to this run."""
        assert self.conn is not None and self.object_map is not None
        self.complete_applied_batches()
        if self.snapshot_mode != "schemasync":
            control.set_phase(self.conn, self.control_schema, self.connector.name, control.PHASE_LOADING,
                              stage=control.STAGE_SNAPSHOT)
        self._phase = control.PHASE_LOADING
        loader = BulkLoader(self.conn, self.connector, self.destination, self.spark, self.object_map)
        with self.cycle_stats.timed("load"):
            # Looked up at every slice: a slice is a Spark job (a tenth of a second at least), and a load of small
            # slices would otherwise go on for a second past its pause.
            done = loader.run(deadline, lambda: self.halted(every=0.0), self._count_loaded_rows,
                              self._count_index_seconds)
        self.bulk_load_pending = self.cycle_stats.bulk_snapshot_pending = not done
        if done:
            self.snapshot_positions = bookkeeping.snapshot_positions(self.conn, self.control_schema,
                                                                     self.connector.name)
            self.load_end = bookkeeping.unreconciled_end(self.conn, self.control_schema, self.connector.name)
            if self.streams:
                self.record_streaming()
        return done

    def tables_awaiting_creation(self) -> list[str]:
        """The tables the running load copies whose destination table its schema snapshot has not created yet."""
        assert self.conn is not None and self.object_map is not None
        return bookkeeping.tables_awaiting_creation(self.conn, self.control_schema, self.connector, self.object_map)

    def reconcile_load(self, offset: dict[str, Any] | None) -> None:
        """Once the stream has applied past the finished load's end (`offset`: the last applied change's, or a
        position before which every change is applied), the loaded tables show the source at one moment: their
        withheld constraints are made again and the tables that changed shape during the load are copied again
        (`bookkeeping.reconcile`; in a load that the next run begins)."""
        if self.load_end is None or self.conn is None or not sources.stream_passed(offset, self.load_end):
            return
        bookkeeping.reconcile(self.conn, self.destination, self.connector.name, offset, self._count_index_seconds)
        self.load_end = None

    def _count_index_seconds(self, seconds: float) -> None:
        self.cycle_stats.add_seconds("index", seconds)

    def _count_loaded_rows(self, rows: int, zero_dates: int, first_copy_epoch: float | None = None) -> None:
        stats = self.cycle_stats
        now = time.monotonic()
        stats.first_fetch_at = stats.first_fetch_at or now
        stats.last_commit_at = now
        stats.last_commit_epoch = time.time()
        if rows:
            stats.rows_committed(first_copy_epoch)
        stats.counts.events += rows
        stats.counts.snapshot_rows += rows
        stats.counts.zero_dates += zero_dates

    def complete_applied_batches(self) -> int:
        """Marks every applied batch not yet complete as complete (in order); returns their events."""
        return self.complete_batches(self.applied_batch_ids)

    def complete_batches(self, batch_ids: Iterable[int]) -> int:
        """Marks these applied batches complete (in order) unless they already are; returns their events."""
        assert self.runner is not None
        events = 0
        for batch_id in batch_ids:
            if batch_id not in self._completed_batch_ids:
                events += self.runner.mark_complete(batch_id)
                self._completed_batch_ids.add(batch_id)
        return events

    def rollback_span(self) -> set[int]:
        """Rolls back the destination transaction of a source transaction whose END did not come in this run: its
        batches, applied but never marked complete, are the engine's to give again; returns their ids."""
        span, self.span = self.span, None
        if span is None:
            return set()
        try:
            span.rollback()
        except psycopg.Error as exc:
            log.warning("%s: rolling back the groups of an unfinished source transaction failed: %s",
                        self.connector.name, exc)
        dropped = set(span.batch_ids)
        self.applied_batch_ids = [batch_id for batch_id in self.applied_batch_ids if batch_id not in dropped]
        log.info("%s: rolled back %d group(s) (%d events) of a source transaction whose end this run did not "
                 "fetch; the next run applies it again from its start", self.connector.name, span.groups, span.events)
        return dropped

    def writes_state(self) -> bool:
        """Whether the calling thread may write the connector's state row now: not on the run's own connection
        while a span is open (its lock would hold the run-ahead thread's phase writes, and that thread is what
        brings the span's end)."""
        return self.span is None or getattr(self._thread_conn, "conn", None) is not None

    def _refuse_if_halted(self, state: str | None) -> None:
        if state in control.HALTED_STATES:
            assert self.conn is not None
            control.release_run_lock(self.conn, self.connector.name)
            self._locked = False
            raise ConnectorPausedError(f"the connector is {state}: no fetch cycle starts until it is resumed "
                                       f"(cdc-pipeline resume {self.connector.name})", connector=self.connector.name)

    def _snapshot_mode(self, requested: str | None) -> str:
        """This cycle's snapshot mode: a restart request's, else the configured one; a schema sync happens once."""
        mode = requested or self.connector.snapshot_mode
        assert self.conn is not None
        if mode == "schemasync" and requested is None and control.has_offset(self.conn, self.control_schema,
                                                                             self.connector.name):
            return "no_data"
        return mode

    def close(self, error: BaseException | None = None) -> None:
        """Stops the engine (its offsets flush), records the final state and error, releases the lock.

        A cycle that succeeds leaves the connector syncing (a schema sync: `schema sync done`, paused for review)
        and consumes a restart request's snapshot mode; one that fails leaves it stopped with its error. A pause
        that came while the cycle ran is kept.
        """
        stop_error: BaseException | None = None
        self.rollback_span()
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        if driver_exit_code() is not None:
            # The driver JVM is gone, and the engine and the staging connections with it.
            self._staging = self.runner = None
        if self._staging is not None:
            self._staging.close(self.jvm)
            self._staging = None
        if self.runner is not None:
            try:
                self.runner.stop()
            except Exception as exc:  # py4j surfaces Java exceptions as several types; none may skip the cleanup
                stop_error = exc
                log.error("Stopping the Debezium engine of %s failed: %s", self.connector.name, exc)
            engine_error = self.runner.last_error
            if error is None and engine_error:
                error = self.engine_error(engine_error)
            self.runner = None
        if self.conn is not None and self.conn.broken and self._locked:
            # The destination went away: its session (and the run lock with it) is gone; record the outcome on a
            # new connection if the destination is back.
            self._locked = False
            self.conn.close()
            self._record_state_on_new_connection(error)
        if self.conn is not None and not self.conn.closed:
            try:
                # A cycle refused for want of the lock leaves the running cycle's state alone.
                if self._locked:
                    # A restart asked for while this cycle ran waits for the next cycle.
                    keep = control.HALTED_STATES + (() if self._requested_mode else (control.RESTARTING,))
                    if error is None:
                        if self.snapshot_mode == "schemasync":
                            self._set_state(control.SCHEMA_SYNC_DONE, stage=control.STAGE_SCHEMA_SYNC,
                                            clear_error=True, unless_in=keep)
                        else:
                            self._set_state(control.SYNCING, clear_error=True, unless_in=keep)
                        control.clear_failures(self.conn, self.control_schema, self.connector.name)
                        control.record_run_digest(self.conn, self.control_schema, self.connector.name,
                                                  control.run_digest(self.conn, self.control_schema,
                                                                     self.connector.name,
                                                                     self.connector.fingerprint(self.destination)))
                        if self._requested_mode:
                            control.clear_next_snapshot_mode(self.conn, self.control_schema, self.connector.name,
                                                             self._requested_mode)
                    else:
                        self._set_state(control.STOPPED, last_error=str(error), unless_in=keep)
                        control.record_failure(self.conn, self.control_schema, self.connector, str(error))
                    control.clear_run_progress(self.conn, self.control_schema, self.connector.name)
                    control.release_run_lock(self.conn, self.connector.name)
                    self._locked = False
            finally:
                self.conn.close()
        if stop_error is not None and error is None:
            raise RunnerError(f"stopping the Debezium engine failed: {stop_error}", connector=self.connector.name)

    def _record_state_on_new_connection(self, error: BaseException | None) -> None:
        try:
            with self.destination.connect(self.connector.name, connect_timeout=10) as conn:
                control.set_state(conn, self.control_schema, self.connector.name, self.connector.type, control.STOPPED,
                                  last_error=None if error is None else str(error), clear_error=error is None)
                if error is not None:
                    control.record_failure(conn, self.control_schema, self.connector, str(error))
        except (psycopg.Error, CdcError) as exc:
            log.error("%s: cannot record the connector's state, the destination is unreachable: %s",
                      self.connector.name, exc)

    def __enter__(self) -> "ConnectorSession":
        try:
            return self.open()
        except BaseException as exc:
            self.close(exc)
            raise

    def __exit__(self, exc_type: Any, exc: BaseException | None, traceback: Any) -> None:
        death = None if exc is None or isinstance(exc, CdcError) else driver_death(
            exc, self.connector.name, self.connector.apply_batch_mb)
        self.close(death or exc)
        if death is not None:
            raise death from None

    def _set_state(self, state: str, unless_in: tuple[str, ...] = control.HALTED_STATES, **kwargs: Any) -> bool:
        assert self.conn is not None
        return control.set_state(self.conn, self.control_schema, self.connector.name, self.connector.type, state,
                                 unless_in=unless_in, **kwargs)

    @contextmanager
    def phase(self, phase: str, timed_as: str) -> Iterator[None]:
        """Records what the cycle does now (when it changes) and times it as `timed_as`."""
        if phase != self._phase and self.conn is not None and self.writes_state():
            control.set_phase(self.conn, self.control_schema, self.connector.name, phase)
            self._phase = phase
        with self.cycle_stats.timed(timed_as):
            yield

    def halted(self, every: float = STATE_CHECK_SECONDS) -> bool:
        """Whether the connector was paused while this cycle runs (looked up at most once in `every` seconds), or the
        cycle was cancelled (`cancelled`)."""
        if self.cancelled is not None and self.cancelled.is_set():
            return True
        now = time.monotonic()
        if self.conn is None or now - self._state_checked_at < every:
            return False
        self._state_checked_at = now
        state = control.read_state(self.conn, self.control_schema, self.connector.name) or {}
        return state.get("state") in control.HALTED_STATES

    def next_run_awaited(self, every: float = STATE_CHECK_SECONDS) -> bool:
        """Whether a request served while this cycle runs waits for the connector's next run (a restart with a
        snapshot mode, a snapshot of tables), which the request sensor launches once this one ended, or a request
        waits to be served (a reload of the mapping rules waits for the running cycle), or a session waits for the
        run lock (`verify --repair`): a lingering or standing run
        then ends as soon as it is caught up (looked up at most once in `every` seconds)."""
        now = time.monotonic()
        if self.conn is None or now - self._awaited_checked_at < every:
            return self._next_run_awaited
        self._awaited_checked_at = now
        state = control.read_state(self.conn, self.control_schema, self.connector.name) or {}
        # (A run a restart launched keeps the state restarting until it ends.)
        self._next_run_awaited = (state.get("state") == control.RESTARTING and not self._requested_mode) or (
            not self.bulk_load_pending
            and bookkeeping.running_load(self.conn, self.control_schema, self.connector.name) is not None) or (
            control.requests_pending(self.conn, self.control_schema, self.connector.name)) or (
            control.run_lock_awaited(self.conn, self.connector.name))
        return self._next_run_awaited

    def count_transactions(self, plan: BatchPlan) -> None:
        """Adds to the plan's counts the source transactions its streamed events begin (one spanning batches
        counts once; re-delivered events count none)."""
        for ref in plan.parsed.refs:
            if ref.kind == TRANSACTION:
                continue
            key = _transaction_key(ref)
            if key is None or key == self._last_transaction:
                continue
            if ref.seq in plan.redelivered_seqs:
                continue
            self._last_transaction = key
            plan.counts.transactions += 1

    def record_stage(self, plan: BatchPlan) -> None:
        """The connector's stage after an applied batch: its last event tells snapshot from streaming."""
        if self.snapshot_mode == "schemasync" or plan.last_ref is None or self.conn is None or not self.writes_state():
            return
        stage = control.STAGE_SNAPSHOT if snapshot_marker(plan.last_ref) else control.STAGE_CDC
        control.set_phase(self.conn, self.control_schema, self.connector.name, self._phase, stage=stage)

    def source_slot(self) -> dict[str, Any] | None:
        """A PostgreSQL source's slot of the connector (the WAL it retains; the source's `slot_status`), logged
        with a warning when it retains much; None for other sources or when it cannot be read."""
        slot_status = sources.module_for(self.connector.type).slot_status
        if slot_status is None:
            return None
        try:
            slot = slot_status(self.connector)
        except CdcError as exc:
            log.warning("%s: cannot read the replication slot's state: %s", self.connector.name, exc)
            return None
        if slot and slot.get("warning"):
            log.warning("%s: %s", self.connector.name, slot["warning"])
        return slot

    def open_thread_connection(self) -> None:
        """A destination connection of the calling thread's own (see `conn`)."""
        self._thread_conn.conn = self.destination.connect(self.connector.name)

    def close_thread_connection(self) -> None:
        conn = getattr(self._thread_conn, "conn", None)
        self._thread_conn.conn = None
        if conn is not None:
            conn.close()

    def record_checked_end(self) -> None:
        """Records the stream's idle end (`checked_end`), once every batch fetched before it is applied."""
        if self.checked_end is not None:
            self.record_source_checked(self.checked_end)
            self._load_unseen_tables()
            self.checked_end = None

    def _load_unseen_tables(self) -> None:
        """At the stream's idle end: begins a load of the source tables the stream never created (`unseen_tables`: a
        database that came to match `databases`, a table created outside the binlog or added to `tables`), which the
        connector's next run copies while the others keep their rows. Under the bulk snapshot engine, once its first
        load was reconciled and no other load runs. A table created since the idle end is copied too, and its CREATE
        and changes streamed after the load's position apply over the copy as any load's do."""
        assert self.conn is not None
        schema, name = self.control_schema, self.connector.name
        if not self.connector.bulk_snapshot or not unseen_tables.creates_tables(self.connector) \
                or bookkeeping.running_load(self.conn, schema, name) is not None \
                or bookkeeping.reconciled_load(self.conn, schema, name) is None:
            return
        source = sources.module_for(self.connector.type)
        try:
            with source.connect(self.connector) as source_conn, source_conn.cursor() as cur:
                with self.conn.cursor() as dest:
                    unseen = unseen_tables.unseen_tables(dest, schema, self.connector, self.object_map, cur)
        except CdcError as exc:
            log.warning("%s: cannot look for source tables the stream never created: %s", name, exc.message)
            return
        if unseen:
            bookkeeping.begin_load(self.conn, schema, name, unseen)
            log.info("%s: %d source table(s) the stream never created (%s): the connector's next run copies them, the "
                     "other tables keep their rows", name, len(unseen), ", ".join(unseen[:10]) +
                     (", ..." if len(unseen) > 10 else ""))

    def may_run_ahead(self) -> bool:
        """Whether the next groups may be fetched, parsed and converted while the last one is applied: in the
        stream, with no load to reconcile (its positions and end are read and changed as groups apply) and no
        Debezium data snapshot (whose groups are let go one by one)."""
        return (self.connector.run_ahead and self.streaming and not self.bulk_load_pending and self.load_end is None
                and not self.snapshot_positions and not self.takes_data_snapshot)

    def record_source_checked(self, position: dict[str, Any]) -> None:
        """Every change of the source before `position` is applied (the batches fetched are; the caller knows)."""
        if self.conn is not None:
            control.record_source_checked(self.conn, self.control_schema, self.connector.name, position)
            self.reconcile_load(position)

    def record_streaming(self) -> None:
        """The engine streams from the source's log: the connector's stage is change data capture."""
        if self.conn is not None and self.writes_state():
            control.set_phase(self.conn, self.control_schema, self.connector.name, self._phase, stage=control.STAGE_CDC)

    def memory_report(self) -> dict[str, int]:
        """The runner JVM's heap and non-heap use, also kept in the connector's state."""
        if self.runner is None or self.conn is None:
            return {}
        memory = self.runner.memory_report()
        control.record_jvm_memory(self.conn, self.control_schema, self.connector.name, memory)
        return memory

    def in_data_snapshot(self) -> bool:
        """Whether Debezium's engine is still copying rows in its snapshot (snapshot_engine: debezium): MariaDB's
        cannot be resumed, so a run goes on until its last event came, whatever its budget. (Debezium's metric says
        the snapshot completed once its rows are in the engine's own queue, thousands before they reach ours.)"""
        return self.takes_data_snapshot and not self.snapshot_ended

    def bulk_snapshot_progress(self) -> list[dict[str, Any]]:
        """Per table of the connector's latest bulk snapshot: rows done, estimated total, rows/s, ETA."""
        if self.conn is None or not self.connector.bulk_snapshot:
            return []
        return bookkeeping.read_progress(self.conn, self.control_schema, self.connector.name)

    def applier(self) -> BatchApplier:
        assert self.conn is not None
        if self._staging is None and self.connector.apply_copy == "executors":
            self._staging = ExecutorStaging(self.destination, self.control_schema, self.connector.name)
        return BatchApplier(self.conn, self.connector, self.control_schema, self.object_map, self._staging)


def _transaction_key(ref: EventRef) -> Any:
    """What tells a streamed event's source transaction apart (None for snapshot events and other sources')."""
    offset = ref.offset or {}
    if "snapshot" in offset:
        return None
    for fields in (("file", "pos"), ("txId",), ("commit_lsn",), ("commit_scn",)):
        if all(offset.get(name) is not None for name in fields):
            return tuple(offset[name] for name in fields)
    return None


T = TypeVar("T")


class Stream(Generic[T]):
    """The output of a lazy step: iterating it runs the step, and the steps before it, one item at a time.

    Not itself an iterator, so that Dagster hands it from op to op as a value.
    """

    def __init__(self, items: Iterator[T]) -> None:
        self._items = items

    def __iter__(self) -> Iterator[T]:
        return self._items


def lazy_step(step: Callable[..., Iterator[T]]) -> Callable[..., Stream[T]]:
    @functools.wraps(step)
    def wrapper(*args: Any, **kwargs: Any) -> Stream[T]:
        return Stream(step(*args, **kwargs))
    return wrapper


@lazy_step
def fetch_batches(session: ConnectorSession) -> Iterator[list[FetchedBatch]]:
    """Pops batches, phase after phase (the schema snapshot, the bulk load, the stream: `fetch_phases`), until the
    source is idle or the cycle's budget is spent, lazily: groups of consecutive batches of up to
    apply_batch_events events, each as soon as the engine has nothing more ready."""
    yield from FetchCycle(session)


@lazy_step
def parse_batches(session: ConnectorSession, groups: Iterable[list[FetchedBatch]]) -> Iterator[ParsedBatch]:
    """Parses each group of fetched batches as one batch (one Spark job, one transaction), lazily."""
    for group in groups:
        with session.phase(control.PHASE_PARSING, "parse"):
            batch = merge_batches(group, session.jvm)
            # A group without data changes (the schema snapshot's) needs no Spark job, nor the session yet.
            parsed = (row_events(batch_dataframe(session.spark, batch), batch) if has_data_changes(batch)
                      else parse_index(batch))
        session.stage_counters.parsed(batch.size)
        yield parsed


@lazy_step
def convert_ddl(session: ConnectorSession, parsed: Iterable[ParsedBatch]) -> Iterator[BatchPlan]:
    """Plans each batch into DDL and DML steps in source order (converting its schema changes), lazily."""
    for batch in parsed:
        with session.phase(control.PHASE_CONVERTING, "convert"):
            # The run's re-delivery test holds the applied offset and the engine's resumed offset, kept across batches.
            plan = plan_batch(batch, session.connector, object_map=session.object_map,
                              snapshot_positions=session.snapshot_positions, redelivered=session.redeliveries)
            session.count_transactions(plan)
        yield plan


@lazy_step
def convert_dml(session: ConnectorSession, plans: Iterable[BatchPlan]) -> Iterator[BatchPlan]:
    """Gives each DML step its Spark rows and columns, lazily."""
    for plan in plans:
        with session.phase(control.PHASE_CONVERTING, "convert"):
            attach_dml_frames(plan)
        faults.pause_point(faults.CONVERTED)
        yield plan


def apply_batches(session: ConnectorSession, plans: Iterable[BatchPlan]) -> list[int]:
    """Applies each batch in its own destination transaction, in order; returns the applied runner batch ids.

    This drives the lazy steps before it: each batch is fetched, parsed and converted just before it applies.
    """
    applier = session.applier()
    applied: list[int] = []
    ahead = run_ahead(session, plans)
    try:
        _apply_all(session, applier, ahead, applied)
    finally:
        ahead.close()  # a failed apply stops the thread running ahead now, not when the traceback is freed
        if session.span is not None:
            # The stream ended (or failed) inside a source transaction: none of it stays applied.
            dropped = session.rollback_span()
            applied[:] = [batch_id for batch_id in applied if batch_id not in dropped]
            applier.forget_run_reads()
    session.record_checked_end()
    return applied


def _apply_all(session: ConnectorSession, applier: BatchApplier, plans: Iterable[BatchPlan],
               applied: list[int]) -> None:
    """Applies the plans (`apply_batches`), adding their runner batch ids to `applied`."""
    stats = session.cycle_stats
    for plan in plans:
        batch = plan.parsed.batch
        if batch.transaction_open and session.span is None:
            assert applier.conn is session.conn
            session.span = TransactionSpan(applier.conn)
        session.stage_counters.applying(plan.parsed.batch.size)
        with session.phase(control.PHASE_EXECUTING, "apply"), working_on(_group_work(plan)):
            try:
                counts = apply_with_retries(session, applier, plan)
            finally:
                plan.parsed.release()
                if plan.parsed.batch.bytes >= LARGE_GROUP_BYTES:
                    # Its rows stay in the JVM while Python objects (frames of its steps) refer to them, and
                    # those may be in reference cycles: freed now, a group of large values leaves no copy behind.
                    gc.collect()
            session.reconcile_load(plan.last_ref.offset if plan.last_ref else None)
        session.record_stage(plan)
        session.stage_counters.applied(plan.parsed.batch.size)
        stats.last_commit_at = time.monotonic()
        stats.last_commit_epoch = time.time()
        if counts.inserts or counts.updates or counts.deletes or counts.snapshot_rows:
            stats.rows_committed()
        stats.batches += 1
        stats.counts.add(counts)
        for table in plan.retired_positions:
            session.snapshot_positions.pop(table, None)
        applied.extend(plan.parsed.batch.batch_ids)
        session.applied_batch_ids.extend(plan.parsed.batch.batch_ids)
        if session.span is not None:
            span = session.span
            span.add(batch)
            if batch.transaction_open:
                # Its rows go, its offset waits for the span's commit.
                assert session.runner is not None
                for batch_id in batch.batch_ids:
                    session.runner.release(batch_id)
                continue
            span.commit()
            session.span = None
            log.info("%s: a source transaction of %d events spanned %d groups, committed as one in %.1f s",
                     session.connector.name, span.events, span.groups, time.monotonic() - span.started)
        if session.takes_data_snapshot and plan.last_ref is not None and snapshot_marker(plan.last_ref):
            # Debezium's snapshot of a large table outlasts any budget: its batches are let go as they are applied,
            # so the runner holds one group, not the whole table.
            session.complete_applied_batches()
        elif plan.last_ref is None or not control.inside_snapshot(plan.last_ref.offset):
            # A streamed group is let go (Debezium's offset committed) as soon as it is committed: the runner and
            # this process hold one group whatever the run's length, and a kill re-delivers that group at most.
            faults.pause_point(faults.GROUP_COMMITTED)
            session.complete_applied_batches()


def _group_work(plan: BatchPlan) -> str:
    """What applying the plan asks of the driver JVM, in words: its events, tables, first position and size."""
    refs = plan.parsed.refs
    tables = sorted({ref.source_table for ref in refs if ref.source_table})
    named = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more tables" if len(tables) > 5 else "")
    first = next((ref for ref in refs if ref.position), None)
    return (f"applying events {refs[0].seq}-{refs[-1].seq}" if refs else "applying a group") \
        + (f" of {named}" if named else "") + (f" from source position {json.dumps(first.position)}" if first else "") \
        + f" ({plan.parsed.batch.bytes / (1 << 20):.0f} MB of rows)"


# Groups a run holds at most while running ahead: the one being applied and the next, fetched, parsed, converted.
RUN_AHEAD_GROUPS = 2
_END = object()


def run_ahead(session: ConnectorSession, plans: Iterable[BatchPlan]) -> Iterator[BatchPlan]:
    """The plans, in order; once the stream may run ahead (`ConnectorSession.may_run_ahead`), the next group is
    fetched, parsed and converted in a thread of its own while the caller applies the last one.

    Order and exactness are kept: the caller still applies (and marks complete) one group after the other; the
    thread is at most one group ahead, and not past a group with schema changes until it is applied; it uses a
    connection of its own (the run's stays the batches' alone); the stream's idle end is recorded only after every
    group is applied (`checked_end`). A failure on either side stops both: the thread's is raised here, after the
    groups before it are applied."""
    iterator = iter(plans)
    while not session.may_run_ahead():
        try:
            plan = next(iterator)
        except StopIteration:
            return
        yield plan
    condition = threading.Condition()
    applied = produced = 0
    barrier = 0  # the groups applied before the thread goes on (after a group with schema changes)
    stopping = False
    handed: queue.Queue[Any] = queue.Queue()

    def produce() -> None:
        nonlocal produced, barrier
        try:
            session.open_thread_connection()
            while True:
                with condition:
                    condition.wait_for(lambda: stopping or (produced - applied < RUN_AHEAD_GROUPS
                                                            and applied >= barrier))
                    if stopping:
                        return
                try:
                    plan = next(iterator)
                except StopIteration:
                    handed.put(_END)
                    return
                produced += 1
                if any(not isinstance(step, DmlStep) for step in plan.steps):
                    barrier = produced
                handed.put(plan)
        except BaseException as exc:  # noqa: BLE001 - raised by the consumer, in order
            handed.put(exc)
        finally:
            session.close_thread_connection()

    thread = threading.Thread(target=produce, name=f"cdc-run-ahead-{session.connector.name}", daemon=True)
    thread.start()
    try:
        while True:
            item = handed.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            session.cycle_stats.groups_run_ahead += 1
            yield item
            with condition:
                applied += 1
                condition.notify_all()
    finally:
        with condition:
            stopping = True
            condition.notify_all()
        session.stop_fetching = True
        thread.join()


MAX_BACKOFF_SECONDS = 60.0


def apply_with_retries(session: ConnectorSession, applier: BatchApplier, plan: BatchPlan) -> control.BatchCounts:
    """Applies one batch; under the `retry` error strategy a failed batch (rolled back) is applied again, up to
    `retry_attempts` applications in all, waiting `retry_backoff_seconds` before the first retry and twice as
    long before each next one (at most a minute). Other strategies apply it once."""
    connector = session.connector
    attempts = connector.retry_attempts if connector.error_strategy == RETRY else 1
    for attempt in range(1, attempts + 1):
        try:
            return applier.apply(plan)
        except (psycopg.Error, CdcError) as exc:
            if applier.conn.closed or applier.conn.broken:
                raise CdcError(f"lost the connection to the destination PostgreSQL while applying batch "
                               f"{plan.batch_id}: {str(exc).strip()}; the batch was rolled back and is not marked "
                               "complete: the next run applies it", connector=connector.name) from exc
            if attempt == attempts:
                if attempts > 1:
                    raise CdcError(f"the batch failed {attempt} times (error_strategy retry, retry_attempts "
                                   f"{attempts}); last error: {exc}", connector=connector.name) from exc
                raise
            wait = min(connector.retry_backoff_seconds * 2 ** (attempt - 1), MAX_BACKOFF_SECONDS)
            log.warning("%s: applying batch %d failed (attempt %d of %d), retrying in %.1f s: %s", connector.name,
                        plan.batch_id, attempt, attempts, wait, exc)
            time.sleep(wait)
    raise AssertionError("unreachable")


def mark_batches_complete(session: ConnectorSession, batch_ids: list[int]) -> int:
    """Marks applied batches complete so the engine's offset advances past them; returns the event count."""
    assert session.runner is not None
    faults.pause_point(faults.COMMITTED)
    return session.complete_batches(batch_ids)


def cycle_summary(session: ConnectorSession, marked: int) -> dict[str, Any]:
    """What a finished cycle reports: the connector, the cycle's counts and timings, the events marked complete, and
    the peaks of its queues and stages' rates (`run_progress.PEAKS`)."""
    stats = session.cycle_stats
    stats.finished_at = time.monotonic()
    peaks = session.progress.summary() if session.progress is not None else {}
    return {"connector": session.connector.name, **stats.as_dict(), "marked_events": marked, **peaks}


def run_cycle(connector: ConnectorConfig, destination: DestinationConfig, spark: SparkSession | SparkStart,
              start_offset: str | None = None, linger: bool = False,
              cancelled: threading.Event | None = None, linger_yields: Callable[[], bool] | None = None,
              watch: Callable[[Iterable[BatchPlan]], Iterable[BatchPlan]] | None = None,
              stands: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Runs one fetch cycle of the connector in this process, as its `sync_<name>` job's steps do (fetch, parse,
    convert, apply, mark complete), without Dagster: what `cdc-pipeline sync` runs. Returns the cycle's summary.

    The session takes the connector's run lock, so a cycle run this way and a Dagster run never overlap; a failure
    is recorded as the connector's last error and raised. With `linger`, a stream that applied a change goes on
    until the connector's `linger_seconds` pass without another, as a Dagster run's does; without, it ends once
    caught up. Once `cancelled` is set the cycle ends as a pause does; `linger_yields`, `stands` and `watch` are the
    session's and `run_steps`'.
    """
    with ConnectorSession(connector, destination, spark, start_offset=start_offset,
                          linger_seconds=connector.linger_seconds if linger else 0.0, cancelled=cancelled,
                          linger_yields=linger_yields, stands=stands) as session:
        return run_steps(session, watch)


def run_steps(session: ConnectorSession,
              watch: Callable[[Iterable[BatchPlan]], Iterable[BatchPlan]] | None = None) -> dict[str, Any]:
    """Runs an open session's steps in order (fetch, parse, convert, apply, mark complete) and returns the cycle's
    summary; `watch` sees each batch's plan on its way to apply (an asset's per-table counts)."""
    plans: Iterable[BatchPlan] = convert_dml(session, convert_ddl(session, parse_batches(session,
                                                                                          fetch_batches(session))))
    marked = mark_batches_complete(session, apply_batches(session, watch(plans) if watch else plans))
    summary = cycle_summary(session, marked)
    session.memory_report()  # recorded in the connector's state, as the job's last step records it
    return summary
