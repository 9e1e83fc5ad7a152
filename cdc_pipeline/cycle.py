"""One fetch cycle of a connector, as steps: open the session, fetch, parse, convert, apply, mark complete.

Dagster's job calls these steps one op each; nothing here imports Dagster. The session holds the run lock
(one cycle per connector at a time), the destination connection and the running Debezium engine.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import psycopg
from pyspark.sql import SparkSession

from cdc_pipeline import control
from cdc_pipeline.apply import BatchApplier, BatchPlan, attach_dml_frames, plan_batch
from cdc_pipeline.config import ConnectorConfig, DestinationConfig
from cdc_pipeline.errors import CdcError, RunnerError
from cdc_pipeline.events import ParsedBatch, parse_events
from cdc_pipeline.runner import DebeziumRunner, FetchedBatch, debezium_properties, group_batches, merge_batches
from cdc_pipeline.spark import batch_dataframe

log = logging.getLogger(__name__)

ENGINE_START_TIMEOUT_SECONDS = 120.0
FETCH_WAIT_SECONDS = 0.5


@dataclass
class CycleStats:
    """The numbers of one fetch cycle, with the time spent in each phase."""

    batches: int = 0
    counts: control.BatchCounts = field(default_factory=control.BatchCounts)
    started_at: float = field(default_factory=time.monotonic)
    first_fetch_at: float | None = None
    last_commit_at: float | None = None
    finished_at: float | None = None
    phase_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return (self.finished_at or time.monotonic()) - self.started_at

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + time.monotonic() - started

    def pipeline_rate(self) -> float:
        """Events per second from the first fetched batch to the last destination commit."""
        if self.first_fetch_at is None or self.last_commit_at is None or self.last_commit_at <= self.first_fetch_at:
            return 0.0
        return self.counts.events / (self.last_commit_at - self.first_fetch_at)

    def as_dict(self) -> dict[str, Any]:
        events = self.counts.events
        return {
            "batches": self.batches,
            **self.counts.as_dict(),
            "seconds": round(self.seconds, 3),
            "events_per_second": round(events / self.seconds, 1) if self.seconds > 0 else 0.0,
            "pipeline_events_per_second": round(self.pipeline_rate(), 1),
            **{f"{phase}_seconds": round(value, 3) for phase, value in self.phase_seconds.items()},
        }


class ConnectorSession:
    """The live parts of one connector's fetch cycle: destination connection, run lock, Debezium engine."""

    def __init__(self, connector: ConnectorConfig, destination: DestinationConfig, spark: SparkSession) -> None:
        self.connector = connector
        self.destination = destination
        self.spark = spark
        self.conn: psycopg.Connection | None = None
        self.runner: DebeziumRunner | None = None
        self.cycle_stats = CycleStats()
        self.applied_offset: dict[str, Any] | None = None
        self._locked = False

    @property
    def control_schema(self) -> str:
        return self.destination.control_schema

    def open(self) -> "ConnectorSession":
        """Connects, takes the run lock, marks the connector initializing and starts its engine."""
        try:
            self.conn = psycopg.connect(self.destination.dsn.reveal(), autocommit=True)
        except psycopg.Error as exc:
            raise CdcError(f"cannot connect to the destination PostgreSQL: {exc}", connector=self.connector.name) from exc
        control.ensure_control_schema(self.conn, self.control_schema)
        control.acquire_run_lock(self.conn, self.connector.name)
        self._locked = True
        self._set_state(control.INITIALIZING, clear_error=True)
        self.applied_offset = control.read_applied_offset(self.conn, self.control_schema, self.connector.name)
        self.runner = DebeziumRunner(self.spark, self.connector.name,
                                     debezium_properties(self.connector, self.destination))
        self.runner.start()
        self.cycle_stats = CycleStats()
        self._set_state(control.SYNCING)
        return self

    def close(self, error: BaseException | None = None) -> None:
        """Stops the engine (its offsets flush), records the final state and error, releases the lock."""
        stop_error: BaseException | None = None
        if self.runner is not None:
            try:
                self.runner.stop()
            except Exception as exc:  # py4j surfaces Java exceptions as several types; none may skip the cleanup
                stop_error = exc
                log.error("Stopping the Debezium engine of %s failed: %s", self.connector.name, exc)
            engine_error = self.runner.last_error
            if error is None and engine_error:
                error = RunnerError(engine_error, connector=self.connector.name)
            self.runner = None
        if self.conn is not None and not self.conn.closed:
            try:
                # A cycle refused for want of the lock leaves the running cycle's state alone.
                if self._locked:
                    message = None if error is None else str(error)
                    self._set_state(control.STOPPED, last_error=message, clear_error=error is None)
                    control.release_run_lock(self.conn, self.connector.name)
                    self._locked = False
            finally:
                self.conn.close()
        if stop_error is not None and error is None:
            raise RunnerError(f"stopping the Debezium engine failed: {stop_error}", connector=self.connector.name)

    def __enter__(self) -> "ConnectorSession":
        try:
            return self.open()
        except BaseException as exc:
            self.close(exc)
            raise

    def __exit__(self, exc_type: Any, exc: BaseException | None, traceback: Any) -> None:
        self.close(exc)

    def _set_state(self, state: str, **kwargs: Any) -> None:
        assert self.conn is not None
        control.set_state(self.conn, self.control_schema, self.connector.name, self.connector.type, state, **kwargs)

    def applier(self) -> BatchApplier:
        assert self.conn is not None
        return BatchApplier(self.conn, self.connector, self.control_schema)


def fetch_batches(session: ConnectorSession) -> list[FetchedBatch]:
    """Pops batches until the source is idle or the cycle's event or time budget is spent."""
    with session.cycle_stats.timed("fetch"):
        return _fetch_batches(session, session.cycle_stats)


def _fetch_batches(session: ConnectorSession, stats: CycleStats) -> list[FetchedBatch]:
    runner = session.runner
    connector = session.connector
    assert runner is not None
    batches: list[FetchedBatch] = []
    events = 0
    started = time.monotonic()
    last_batch_at = started
    streaming_since: float | None = None
    while True:
        batch = runner.fetch(FETCH_WAIT_SECONDS)
        now = time.monotonic()
        if batch is not None:
            stats.first_fetch_at = stats.first_fetch_at or now
            batches.append(batch)
            events += batch.size
            last_batch_at = now
            if events >= connector.max_events_per_run:
                log.info("%s: reached max_events_per_run (%d)", connector.name, connector.max_events_per_run)
                break
        elif runner.is_streaming():
            # Idle counts from when streaming connected, not from engine start: the log reader may connect late.
            streaming_since = streaming_since or now
            if now - max(last_batch_at, streaming_since) >= connector.idle_timeout_seconds:
                break
        elif runner.state in ("STOPPED", "FAILED"):
            runner.raise_if_failed()
            break
        elif not runner.is_polling() and now - started > ENGINE_START_TIMEOUT_SECONDS:
            raise RunnerError(f"the Debezium engine did not start polling within {ENGINE_START_TIMEOUT_SECONDS:.0f} s "
                              f"(state {runner.state})", connector=connector.name)
        if now - started >= connector.max_seconds_per_run:
            log.info("%s: reached max_seconds_per_run (%s)", connector.name, connector.max_seconds_per_run)
            break
    log.info("%s: fetched %d batches, %d events", connector.name, len(batches), events)
    return batches


def parse_batches(session: ConnectorSession, batches: list[FetchedBatch]) -> list[ParsedBatch]:
    """Parses the fetched batches, consecutive ones joined up to apply_batch_events (one Spark job each)."""
    parsed = []
    with session.cycle_stats.timed("parse"):
        for group in group_batches(batches, session.connector.apply_batch_events):
            batch = merge_batches(group, session.spark._jvm)
            parsed.append(parse_events(batch_dataframe(session.spark, batch), batch))
    return parsed


def convert_ddl(session: ConnectorSession, parsed: list[ParsedBatch]) -> list[BatchPlan]:
    with session.cycle_stats.timed("convert"):
        return [plan_batch(batch, session.connector, session.applied_offset) for batch in parsed]


def convert_dml(session: ConnectorSession, plans: list[BatchPlan]) -> list[BatchPlan]:
    with session.cycle_stats.timed("convert"):
        for plan in plans:
            attach_dml_frames(plan)
    return plans


def apply_batches(session: ConnectorSession, plans: list[BatchPlan]) -> list[int]:
    """Applies each batch in its own destination transaction, in order; returns the applied runner batch ids."""
    stats = session.cycle_stats
    applier = session.applier()
    applied = []
    with stats.timed("apply"):
        for plan in plans:
            try:
                counts = applier.apply(plan)
            finally:
                plan.parsed.release()
            stats.last_commit_at = time.monotonic()
            stats.batches += 1
            stats.counts.add(counts)
            applied.extend(plan.parsed.batch.batch_ids)
    return applied


def mark_batches_complete(session: ConnectorSession, batch_ids: list[int]) -> int:
    """Marks applied batches complete so the engine's offset advances past them; returns the event count."""
    assert session.runner is not None
    return sum(session.runner.mark_complete(batch_id) for batch_id in batch_ids)
