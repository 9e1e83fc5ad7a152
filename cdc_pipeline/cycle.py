"""One fetch cycle of a connector, as steps: open the session, fetch, parse, convert, apply, mark complete.

Dagster's job calls these steps one op each; nothing here imports Dagster. Fetch, parse and convert are lazy
(like Spark's transformations): apply drives them one group of batches at a time, so the engine keeps
capturing while a group is applied, and memory holds one group, not the whole cycle. The session holds the run lock
(one cycle per connector at a time), the destination connection and the running Debezium engine.
"""

from __future__ import annotations

import functools
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, Iterator, TypeVar

import psycopg
from pyspark.sql import SparkSession

from cdc_pipeline import control, objmap
from cdc_pipeline.apply import BatchApplier, BatchPlan, attach_dml_frames, plan_batch
from cdc_pipeline.config import ConnectorConfig, DestinationConfig
from cdc_pipeline.errors import CdcError, RunnerError
from cdc_pipeline.events import ParsedBatch, parse_events
from cdc_pipeline.runner import DebeziumRunner, FetchedBatch, debezium_properties, merge_batches
from cdc_pipeline.spark import batch_dataframe

log = logging.getLogger(__name__)

ENGINE_START_TIMEOUT_SECONDS = 120.0
FETCH_WAIT_SECONDS = 0.5
GROUP_WAIT_SECONDS = 0.05  # a group goes downstream when the engine has had nothing more for this long


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


def queue_capacity(connector: ConnectorConfig) -> int:
    """Runner batches the engine may capture ahead of the pipeline: two groups' worth, so it keeps capturing
    while a group is applied."""
    return max(4, 2 * -(-connector.apply_batch_events // connector.batch_size))


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
        self.object_map: objmap.ObjectMap | None = None
        self._locked = False

    @property
    def control_schema(self) -> str:
        return self.destination.control_schema

    def open(self) -> "ConnectorSession":
        """Connects, takes the run lock, marks the connector initializing, re-reads the mapping rules (renaming and
        retyping what they changed) and starts its engine."""
        try:
            self.conn = psycopg.connect(self.destination.dsn.reveal(), autocommit=True)
        except psycopg.Error as exc:
            raise CdcError(f"cannot connect to the destination PostgreSQL: {exc}", connector=self.connector.name) from exc
        control.ensure_control_schema(self.conn, self.control_schema)
        control.acquire_run_lock(self.conn, self.connector.name)
        self._locked = True
        self._set_state(control.INITIALIZING, clear_error=True)
        self.applied_offset = control.read_applied_offset(self.conn, self.control_schema, self.connector.name)
        self.object_map = objmap.reload_mapping(self.conn, self.control_schema, self.connector)
        self.runner = DebeziumRunner(self.spark, self.connector.name,
                                     debezium_properties(self.connector, self.destination),
                                     queue_capacity=queue_capacity(self.connector))
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
        return BatchApplier(self.conn, self.connector, self.control_schema, self.object_map)


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
    """Pops batches until the source is idle or the cycle's event or time budget is spent, lazily.

    Yields groups of consecutive batches of up to apply_batch_events events, each as soon as the engine has
    nothing more ready: the engine goes on capturing while the group is parsed and applied downstream.
    """
    runner = session.runner
    connector = session.connector
    stats = session.cycle_stats
    assert runner is not None
    group: list[FetchedBatch] = []
    group_events = events = 0
    started = time.monotonic()
    last_batch_at = started
    streaming_since: float | None = None
    while True:
        with stats.timed("fetch"):
            batch = runner.fetch(GROUP_WAIT_SECONDS if group else FETCH_WAIT_SECONDS)
        now = time.monotonic()
        if batch is not None:
            stats.first_fetch_at = stats.first_fetch_at or now
            if group and group_events + batch.size > connector.apply_batch_events:
                yield group
                group, group_events = [], 0
            group.append(batch)
            group_events += batch.size
            events += batch.size
            last_batch_at = now
            if events >= connector.max_events_per_run:
                log.info("%s: reached max_events_per_run (%d)", connector.name, connector.max_events_per_run)
                break
        elif group:
            yield group
            group, group_events = [], 0
            continue
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
    if group:
        yield group
    log.info("%s: fetched %d events", connector.name, events)


@lazy_step
def parse_batches(session: ConnectorSession, groups: Iterable[list[FetchedBatch]]) -> Iterator[ParsedBatch]:
    """Parses each group of fetched batches as one batch (one Spark job, one transaction), lazily."""
    for group in groups:
        with session.cycle_stats.timed("parse"):
            batch = merge_batches(group, session.spark._jvm)
            parsed = parse_events(batch_dataframe(session.spark, batch), batch)
        yield parsed


@lazy_step
def convert_ddl(session: ConnectorSession, parsed: Iterable[ParsedBatch]) -> Iterator[BatchPlan]:
    """Plans each batch into DDL and DML steps in source order (converting its schema changes), lazily."""
    for batch in parsed:
        with session.cycle_stats.timed("convert"):
            plan = plan_batch(batch, session.connector, session.applied_offset, session.object_map)
        yield plan


@lazy_step
def convert_dml(session: ConnectorSession, plans: Iterable[BatchPlan]) -> Iterator[BatchPlan]:
    """Gives each DML step its Spark rows and columns, lazily."""
    for plan in plans:
        with session.cycle_stats.timed("convert"):
            attach_dml_frames(plan)
        yield plan


def apply_batches(session: ConnectorSession, plans: Iterable[BatchPlan]) -> list[int]:
    """Applies each batch in its own destination transaction, in order; returns the applied runner batch ids.

    This drives the lazy steps before it: each batch is fetched, parsed and converted just before it applies.
    """
    stats = session.cycle_stats
    applier = session.applier()
    applied = []
    for plan in plans:
        with stats.timed("apply"):
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
