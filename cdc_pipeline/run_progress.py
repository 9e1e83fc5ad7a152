"""What waits where while a run goes on: Debezium's queue, the runner's queue, the groups parsed ahead, the group
being applied, and each stage's rate over the last seconds.

The JVM counts what passes through it (`DebeziumRunner.progress`), the cycle counts per group (`StageCounters`),
and a thread of the run (`ProgressReporter`) samples both every `SAMPLE_SECONDS`: it writes the sample to the
control schema's `run_progress` row on a connection of its own (never inside a batch's transaction), logs it every
`LOG_SECONDS` while the run streams, and keeps the peaks that the cycle's summary reports. Nothing is done per event.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import psycopg

from cdc_pipeline import control
from cdc_pipeline.config import DestinationConfig
from cdc_pipeline.errors import CdcError

log = logging.getLogger(__name__)


def process_started_epoch() -> float | None:
    """When this process started (Linux: its start in clock ticks since boot, read against the clock since boot
    now), or None. Not from /proc/stat's `btime`: the boot time in whole seconds would put the start up to a second
    early."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return None


SAMPLE_SECONDS = 2.0  # how often a run samples its queues and writes its progress row
LOG_SECONDS = 10.0  # how often a streaming run logs them
IDLE_LOG_SECONDS = 60.0  # ... and one that parsed and applied nothing since its last line (a quiet standing run)
RATE_SECONDS = 10.0  # the window of each stage's rate
# How long the run's end waits for a sample in progress (a destination that stopped answering holds its write).
STOP_WAIT_SECONDS = 10.0
# The stages whose rates are given, and the counter of each sample they are taken from.
RATE_STAGES = (("captured", "captured_events"), ("parsed", "parsed_events"), ("applied", "applied_events"))


@dataclass
class StageCounters:
    """What the cycle's Python stages have done in this run, counted once a group (read by the reporter's thread)."""

    parsed_groups: int = 0
    parsed_events: int = 0
    applied_groups: int = 0
    applied_events: int = 0
    applying_events: int = 0  # the events of the group being applied, 0 when none is
    applying_since: float | None = None  # when its apply began (epoch seconds)

    def parsed(self, events: int) -> None:
        self.parsed_events += events
        self.parsed_groups += 1

    def applying(self, events: int) -> None:
        self.applying_events = events
        self.applying_since = time.time()

    def applied(self, events: int) -> None:
        self.applying_since = None
        self.applying_events = 0
        self.applied_events += events
        self.applied_groups += 1

    def snapshot(self, now: float) -> dict[str, Any]:
        """The counters now, with the group being applied (its number in the run, events, since when) and the
        groups parsed ahead of it (parsed, perhaps converted, waiting for their apply)."""
        since = self.applying_since
        applying = None if since is None else {"group": self.applied_groups + 1, "events": self.applying_events,
                                               "since": since, "seconds": round(max(0.0, now - since), 1)}
        ahead = self.parsed_groups - self.applied_groups - (0 if applying is None else 1)
        return {"parsed_events": self.parsed_events, "applied_events": self.applied_events,
                "applied_groups": self.applied_groups, "groups_ahead": max(0, ahead), "applying": applying}


def stage_rates(samples: deque[tuple[float, dict[str, Any]]], window: float = RATE_SECONDS,
                least: float = SAMPLE_SECONDS / 2) -> dict[str, float]:
    """Each stage's events per second between the oldest sample of the last `window` seconds and the newest (none
    when those are less than `least` seconds apart: the last sample of a short run, taken just after another, would
    make a few events a huge rate)."""
    if len(samples) < 2:
        return {}
    last_at, last = samples[-1]
    first_at, first = next((at, sample) for at, sample in samples if at >= last_at - window - 0.5)
    if last_at - first_at < least:
        return {}
    return {stage: round(max(0, int(last.get(key) or 0) - int(first.get(key) or 0)) / (last_at - first_at), 1)
            for stage, key in RATE_STAGES}


# The summary items of the peaks: (item, path into a sample).
PEAKS = (
    ("queue_peak_debezium_events", ("engine_queue", "events")),
    ("queue_peak_runner_events", ("queued_events",)),
    ("queue_peak_in_flight_events", ("in_flight_events",)),
    ("queue_peak_groups_ahead", ("groups_ahead",)),
    ("rate_peak_captured_events_per_second", ("rates", "captured")),
    ("rate_peak_parsed_events_per_second", ("rates", "parsed")),
    ("rate_peak_applied_events_per_second", ("rates", "applied")),
)


def _dig(sample: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = sample
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


class ProgressReporter:
    """Samples a run's queues and rates every `SAMPLE_SECONDS` in a thread of its own, from the engine's start to
    the run's end (`start`, `stop`); `summary` gives their peaks.

    `jvm_sample` is the runner's `progress` (None when the JVM cannot be read), `streaming` tells whether the run
    is in its stream (only then is a line logged); `session_pid` is the backend pid of the session holding the run
    lock, written with each sample so that a reader tells this run's row from one an earlier run left."""

    def __init__(self, destination: DestinationConfig, connector: str, counters: StageCounters,
                 jvm_sample: Callable[[], dict[str, Any] | None], streaming: Callable[[], bool],
                 session_pid: int) -> None:
        self._destination = destination
        self._session_pid = session_pid
        self._connector = connector
        self._counters = counters
        self._jvm_sample = jvm_sample
        self._streaming = streaming
        self._samples: deque[tuple[float, dict[str, Any]]] = deque()
        # Every item from the start, so that the connector asset's plots get a point from every run, a short one too.
        self._peaks: dict[str, float] = {item: 0 for item, _ in PEAKS}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection | None = None
        self._started_at = datetime.now(timezone.utc)
        self._logged_at = 0.0
        self._logged_counts: tuple[Any, ...] | None = None  # the counters of the last line logged
        self._write_failed = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"cdc-progress-{self._connector}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread and closes its connection; does nothing if never started. A thread still writing after
        `STOP_WAIT_SECONDS` is left behind (a daemon, with its connection): the run's end does not wait on it."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT_SECONDS)
            if self._thread.is_alive():
                log.warning("%s: the run's progress sampler did not stop within %.0f s; left behind", self._connector,
                            STOP_WAIT_SECONDS)
                return
            self._thread = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _run(self) -> None:
        while not self._stopping.wait(SAMPLE_SECONDS):
            progress = self.sample()
            self._write(progress)
            now = time.monotonic()
            moved = (progress.get("parsed_events"), progress.get("applied_events"), progress.get("applying_events"))
            every = LOG_SECONDS if moved != self._logged_counts or progress.get("applying_events") else IDLE_LOG_SECONDS
            if self._streaming() and now - self._logged_at >= every - SAMPLE_SECONDS / 2:
                self._logged_at, self._logged_counts = now, moved
                log.info("%s: %s", self._connector, "; ".join(progress_lines(progress)))

    def sample(self) -> dict[str, Any]:
        """Samples the queues and counters now (kept for the rates and peaks) and returns the progress."""
        with self._lock:
            now = time.monotonic()
            jvm = self._jvm_sample() or {}
            sample = {**jvm, **self._counters.snapshot(time.time()), "streaming": self._streaming(),
                      "session_pid": self._session_pid}
            self._samples.append((now, sample))
            while self._samples and self._samples[0][0] < now - RATE_SECONDS - SAMPLE_SECONDS:
                self._samples.popleft()
            sample["rates"] = stage_rates(self._samples)
            for item, path in PEAKS:
                value = _dig(sample, path)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._peaks[item] = max(self._peaks.get(item, 0), value)
            return sample

    def summary(self) -> dict[str, float]:
        """The peaks of the run's samples (a last sample taken now), as the cycle's summary items."""
        self.sample()
        with self._lock:
            return dict(self._peaks)

    def _write(self, progress: dict[str, Any]) -> None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._destination.connect(self._connector, connect_timeout=10)
            control.record_run_progress(self._conn, self._destination.control_schema, self._connector,
                                        self._started_at, progress)
            self._write_failed = False
        except (psycopg.Error, CdcError) as exc:
            if not self._write_failed:
                log.warning("%s: cannot record the run's progress (the run goes on): %s", self._connector, exc)
            self._write_failed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def read_live(conn: psycopg.Connection, schema: str, connector: str) -> dict[str, Any] | None:
    """The connector's running cycle's latest progress (`control.read_run_progress`), or None when no cycle runs
    now or the one running has sampled none yet: the row is the running cycle's only when the session that wrote it
    as its lock's holder holds the run lock now (a row an earlier run left says nothing of now, also in the moment
    between a new run taking the lock and clearing it)."""
    holder = control.run_lock_holder(conn, connector)
    if holder is None:
        return None
    progress = control.read_run_progress(conn, schema, connector)
    return progress if progress is not None and progress.get("session_pid") == holder else None


def _count(value: Any, unit: str, units: str | None = None) -> str:
    number = int(value)
    return f"{number:,} {unit if number == 1 else units or unit + 's'}"


def progress_lines(progress: dict[str, Any]) -> list[str]:
    """A run's progress in words, a line each: Debezium's queue, the runner's, the groups ahead, the group being
    applied, the stages' rates."""
    lines = []
    engine = progress.get("engine_queue")
    if engine:
        size = f", {engine['bytes'] / (1 << 20):.1f} of {engine['max_bytes'] >> 20} MB" if engine.get("max_bytes") \
            else ""
        lines.append(f"Debezium's queue: {int(engine['events']):,} of {int(engine['capacity']):,} events{size}")
    elif "queued_events" in progress:
        lines.append("Debezium's queue: not known (the connector registers no queue metrics yet)")
    if "queued_events" in progress:
        lines.append(f"runner's queue: {_count(progress['queued_events'], 'event')} in "
                     f"{_count(progress['queued_batches'], 'batch', 'batches')} waiting, "
                     f"{_count(progress['in_flight_events'], 'event')} fetched and not yet applied"
                     + (", the engine handing a batch over" if progress.get("handing_over") else ""))
    lines.append(f"groups parsed ahead: {int(progress.get('groups_ahead') or 0)}")
    applying = progress.get("applying")
    if applying:
        lines.append(f"applying group {applying['group']}: {_count(applying['events'], 'event')} for "
                     f"{applying['seconds']:.1f} s")
    else:
        lines.append(f"applying: none ({_count(progress.get('applied_groups') or 0, 'group')} applied)")
    rates = progress.get("rates") or {}
    if rates:
        lines.append(f"events/s over the last {RATE_SECONDS:.0f} s: " + ", ".join(
            f"{stage} {rates[stage]:,.1f}" for stage, _ in RATE_STAGES if stage in rates))
    return lines
