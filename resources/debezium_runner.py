"""The Debezium runner resource: each connector's engine, started by the first step of its cycle in a run and always
stopped after the run."""


import logging
import os
import time
from contextlib import ExitStack, contextmanager
from typing import Any, Iterator, Optional

from dagster import ConfigurableResource, DagsterInstance, DagsterRunStatus, InitResourceContext, RunsFilter
from dagster._core.storage.dagster_run import IN_PROGRESS_RUN_STATUSES
from pydantic import Field, PrivateAttr

from cdc_pipeline.config import load_config
from cdc_pipeline.cycle import ConnectorSession
from cdc_pipeline.errors import CdcError
from cdc_pipeline.ops import preflight
from cdc_pipeline.ops import auto_server
from cdc_pipeline.ops.pipeline_server import SERVER_ENV, served_config_path, served_sync
from cdc_pipeline.ops.tables import TableChanges
from resources.replay import ReplayResource
from resources.spark_session import SparkSessionResource

# The run tag naming a sync run's connector (the run queue allows one run per value).
CONNECTOR_TAG = "cdc/connector"
# The run tag saying where a run's engine runs: ENGINE_OWN, a driver JVM of the run's own (the jobs' default), or
# ENGINE_SERVED, a pipeline server's (set by the change sensor when the server answers it). dagster.yaml limits the
# runs with a JVM of their own apart, so that runs served by a server, which hold none, can be more.
ENGINE_TAG = "cdc/engine"
ENGINE_OWN = "own"
ENGINE_SERVED = "served"
# The run tag of the runs the change sensor launches (why it launched the run); those of them whose cycle is served
# may stand (`StandingRoom`): the sensor launches the next one when a run ends.
TRIGGER_TAG = "cdc/trigger"
# How often a lingering run asks the instance about its run queue (counts of its runs).
QUEUE_CHECK_SECONDS = 2.0
# Dagster's run tag for a run's place in the queue (higher first, 0 without it); verify runs are below sync runs.
PRIORITY_TAG = "dagster/priority"
# The queued runs a lingering run looks at (their tags): a queue longer than this is full of runs waiting anyway.
QUEUED_RUNS_READ = 200
# After a queued run has waited this long for a slot, every lingering run it could take the slot of yields, not only
# the longest running ones (which may be busy streaming, not lingering).
YIELD_ALL_AFTER_SECONDS = 10.0


class _AskedEvery:
    """A yes-or-no the instance answers, asked at most once in QUEUE_CHECK_SECONDS (the last answer in between)."""

    def __init__(self) -> None:
        self._checked_at = float("-inf")
        self._answer = False

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self._checked_at >= QUEUE_CHECK_SECONDS:
            self._checked_at = now
            self._answer = self._ask()
        return self._answer

    def _ask(self) -> bool:
        raise NotImplementedError


class RunQueueWait(_AskedEvery):
    """Whether runs wait in the instance's run queue for the slot a lingering run of `connector` holds: a queued run of
    the same connector (one run per connector at a time); any queued run while the runs in progress fill
    `run_queue.max_concurrent_runs`; or a queued run under a tag limit (`tag_concurrency_limits`) that this run's
    `tags` count against, while the runs in progress fill it (runs with a driver JVM of their own wait for one another,
    not for served ones). Under a full limit only as many sync runs yield as the queued runs lack slots, the longest
    running first, and all of them once a queued run has waited YIELD_ALL_AFTER_SECONDS. Only queued runs of this
    run's priority or higher count (the tag `dagster/priority`, 0 without it): a sync run does not end its linger for
    a verify run, which the queue starts after sync runs anyway. The session's `linger_yields`: such a run then ends
    as soon as it is caught up, so a change of another connector does not wait behind it. Asked of the instance at
    most once in QUEUE_CHECK_SECONDS."""

    def __init__(self, instance: DagsterInstance, connector: str, tags: Optional[dict[str, str]] = None) -> None:
        self.instance = instance
        self.connector = connector
        # None without a run queue (an in-process or ephemeral instance): only the connector's own queued run counts.
        queue = instance.get_concurrency_config().run_queue_config
        self.max_concurrent_runs = queue.max_concurrent_runs if queue is not None else None
        self.tag_limits = _tag_limits(queue.tag_concurrency_limits if queue is not None else (), tags or {})
        self.priority = run_priority(tags or {})
        super().__init__()

    def _ask(self) -> bool:
        if not self.instance.get_runs_count(filters=RunsFilter(statuses=[DagsterRunStatus.QUEUED])):
            return False
        now = time.time()
        queued = [(record.dagster_run.tags, now - record.create_timestamp.timestamp())
                  for record in self.instance.get_run_records(filters=RunsFilter(statuses=[DagsterRunStatus.QUEUED]),
                                                              limit=QUEUED_RUNS_READ)
                  if run_priority(record.dagster_run.tags) >= self.priority]
        if not queued:
            return False
        if any(tags.get(CONNECTOR_TAG) == self.connector for tags, _ in queued):
            return True
        in_progress = self.instance.get_run_records(filters=RunsFilter(statuses=list(IN_PROGRESS_RUN_STATUSES)))
        # A queued run of a connector whose run is in progress waits for that run, not for a slot.
        running = {record.dagster_run.tags[CONNECTOR_TAG] for record in in_progress
                   if CONNECTOR_TAG in record.dagster_run.tags}
        queued = [(tags, waited) for tags, waited in queued if tags.get(CONNECTOR_TAG) not in running]
        limit = self.max_concurrent_runs
        if limit is not None and 0 <= limit and self._among_first_to_yield(in_progress, queued, limit):
            return True
        return any(self._among_first_to_yield(
            [record for record in in_progress if _tagged(record.dagster_run.tags, tag)],
            [(tags, waited) for tags, waited in queued if _tagged(tags, tag)], tag_limit)
            for tag, tag_limit in self.tag_limits)

    def _among_first_to_yield(self, in_progress: list[Any], queued: list[tuple[dict[str, str], float]],
                              limit: int) -> bool:
        """Whether this run is one of those that make room for the `queued` runs (their tags, and the seconds they
        have waited) under a `limit` that the runs `in_progress` fill: as many sync runs as the queued runs lack
        slots, the longest running first, so that one queued run does not end every run that lingers; every one of
        them once a queued run has waited YIELD_ALL_AFTER_SECONDS (the first ones may be busy, not lingering)."""
        lacking = len(queued) - max(0, limit - len(in_progress))
        if lacking <= 0:
            return False
        if max(waited for _, waited in queued) >= YIELD_ALL_AFTER_SECONDS:
            return True
        return self.connector in _longest_running(in_progress, lacking)


class StandingRoom(_AskedEvery):
    """Whether a served run of `connector` may stand, streaming on between changes until its budget (the session's
    `stands`): while the runs queued and in progress number at most `standing_limit`; past it, as many runs stop
    standing as are too many, the longest running first. Asked of the instance at most once in QUEUE_CHECK_SECONDS.
    Changes of connectors without a run thus find a slot free rather than wait for a standing run to yield."""

    def __init__(self, instance: DagsterInstance, connector: str) -> None:
        self.instance = instance
        self.connector = connector
        self.limit = standing_limit(instance)
        super().__init__()

    def _ask(self) -> bool:
        in_progress = self.instance.get_run_records(filters=RunsFilter(statuses=list(IN_PROGRESS_RUN_STATUSES)))
        queued = self.instance.get_runs_count(filters=RunsFilter(statuses=[DagsterRunStatus.QUEUED]))
        over = len(in_progress) + queued - self.limit
        if over <= 0:
            return True
        return self.connector not in _longest_running(in_progress, over)


def _longest_running(in_progress: list[Any], count: int) -> list[str]:
    """The connectors of the `count` sync runs among `in_progress` (run records) that started first."""
    sync_runs = sorted((record for record in in_progress if CONNECTOR_TAG in record.dagster_run.tags),
                       key=lambda record: (record.start_time or float("inf"), record.dagster_run.run_id))
    return [record.dagster_run.tags[CONNECTOR_TAG] for record in sync_runs[:count]]


def standing_limit(instance: DagsterInstance) -> int:
    """How many runs, queued and in progress, leave room for standing runs: half the run queue's
    max_concurrent_runs (at least 1); none where the instance's run queue has no limit (a run queue without a limit
    has no room to keep free) or the instance has none (a run in process: no sensor launches the next)."""
    queue = instance.get_concurrency_config().run_queue_config
    limit = queue.max_concurrent_runs if queue is not None else None
    if limit is None or limit <= 0:
        return 0
    return max(1, limit // 2)


def _tagged(tags: dict[str, str], tag: dict[str, str]) -> bool:
    return all(tags.get(key) == value for key, value in tag.items())


def run_priority(tags: dict[str, str]) -> int:
    """A run's place in Dagster's queue by its tags (`dagster/priority`: higher first; 0 without it or unreadable)."""
    try:
        return int(tags.get(PRIORITY_TAG, 0))
    except (TypeError, ValueError):
        return 0


def _tag_limits(limits: Any, tags: dict[str, str]) -> list[tuple[dict[str, str], int]]:
    """The run queue's tag limits that a run of `tags` counts against, each as the tag its runs share and the limit:
    a limit on the run's value of a tag, or one per unique value (`applyLimitPerUniqueValue`). The connector's own
    limit is left out (RunQueueWait asks about the connector's queued runs in any case)."""
    counted = []
    for limit in limits or ():
        key, value = limit.get("key"), limit.get("value")
        if key not in tags or key == CONNECTOR_TAG or limit.get("limit") is None:
            continue
        per_value = isinstance(value, dict) and value.get("applyLimitPerUniqueValue")
        if per_value or value == tags[key]:
            counted.append(({key: tags[key]}, int(limit["limit"])))
    return counted


def _log_line(log: Any, level: int, message: str) -> None:
    """A served cycle's log line in the step's Dagster log (DEBUG lines left out)."""
    if level >= logging.ERROR:
        log.error(message)
    elif level >= logging.WARNING:
        log.warning(message)
    elif level >= logging.INFO:
        log.info(message)


class DebeziumRunnerResource(ConfigurableResource):
    """Starts a connector's embedded Debezium engine in the Spark driver JVM when its cycle's first step runs.

    One resource serves every connector (Dagster's resource keys are global): each step names its connector. The
    first step of a connector's cycle checks a connector that never ran (`preflight.require_ready`: a source or
    destination that lacks a setting or privilege fails the step before the JVM starts), connects to the
    destination, takes the connector's run lock and starts the engine; teardown stops each engine the run started
    (flushing the offsets of completed batches), records the connector's final state and its error if any, and
    releases the lock, also when the run fails. Nothing starts at setup: Dagster also initializes a run's resources
    where no step runs (the `dagster job execute` command does so again after the run ends), and one run must start
    one engine per connector.
    """

    config_path: Optional[str] = Field(default=None, description="Connectors file; default $CDC_PIPELINE_CONFIG.")
    spark: SparkSessionResource
    replay: ReplayResource

    _sessions: dict[str, ConnectorSession] = PrivateAttr(default_factory=dict)
    # Cycles a pipeline server ran for this run (`served`): their summaries, and sessions that only read the
    # destination for the run's materializations.
    _served: dict[str, dict] = PrivateAttr(default_factory=dict)
    _readers: dict[str, ConnectorSession] = PrivateAttr(default_factory=dict)
    _instance: Optional[DagsterInstance] = PrivateAttr(default=None)
    _run_tags: dict[str, str] = PrivateAttr(default_factory=dict)
    _errors: dict[str, BaseException] = PrivateAttr(default_factory=dict)
    _table_changes: dict[str, TableChanges] = PrivateAttr(default_factory=dict)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._instance = context.instance
        self._run_tags = dict(context.run.tags) if context.run is not None else {}

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        sessions, self._sessions = self._sessions, {}
        readers, self._readers = self._readers, {}
        with ExitStack() as closing:
            for name, session in sessions.items():
                closing.callback(session.close, self._errors.get(name))
            for reader in readers.values():
                if reader.conn is not None:
                    closing.callback(reader.conn.close)

    def served(self, connector: str, log: Any = None) -> Optional[dict]:
        """The summary of `connector`'s cycle when a pipeline server ran it for this run (CDC_PIPELINE_SERVER names
        it and it listens; when it names none, the server started for this connectors file's runs, `auto_server`):
        asked once, by the cycle's first step, which waits for the cycle's end; None when the cycle runs here, cold.
        The server serves the connector's requests, checks it and takes its run lock as a
        cold run does; its log lines go to `log` (the step's Dagster log)."""
        if connector in self._served:
            return self._served[connector]
        if connector in self._sessions:
            return None
        started = None  # CDC_PIPELINE_SERVER's, which `served_sync` reads
        if not os.environ.get(SERVER_ENV):
            # None configured: the server started for this connectors file's runs (started now if none answers).
            started = auto_server.ensure(served_config_path())
            if started is None:
                return None
        summary = served_sync(
            connector, start_offset=self.replay.start_offset, linger=True,
            linger_yields=RunQueueWait(self._instance, connector, self._run_tags)
            if self._instance is not None else None,
            on_log=None if log is None else lambda level, _name, message: _log_line(log, level, message),
            server=started, stands=self._stands(connector))
        if summary is not None:
            self._served[connector] = summary
        return summary

    def _stands(self, connector: str) -> Optional[StandingRoom]:
        """A served run's `stands`: for a run the change sensor launched (the tag TRIGGER_TAG; not one launched from
        the UI, a schedule or in process, which no sensor follows), of a connector whose `standing_run` is on and
        whose trigger is `changes`, in an instance whose run queue has room for standing runs (not for a replay from
        a `start_offset`)."""
        if self._instance is None or self.replay.start_offset is not None or TRIGGER_TAG not in self._run_tags:
            return None
        connector_config = load_config(self.config_path).connector(connector)
        if not (connector_config.standing_run and connector_config.trigger == "changes") \
                or standing_limit(self._instance) == 0:
            return None
        return StandingRoom(self._instance, connector)

    def served_summary(self, connector: str) -> Optional[dict]:
        """The summary of the served cycle of `connector` in this run, if a server ran it."""
        return self._served.get(connector)

    def reader(self, connector: str) -> ConnectorSession:
        """A session of `connector` that only reads the destination (no engine, no run lock): what a served
        cycle's materializations read."""
        if connector not in self._readers:
            config = load_config(self.config_path)
            # No Spark: a reader runs no step.
            reader = ConnectorSession(config.connector(connector), config.destination, None)  # type: ignore[arg-type]
            reader.conn = config.destination.connect(connector)
            self._readers[connector] = reader
        return self._readers[connector]

    def session(self, connector: str) -> ConnectorSession:
        """The run's session of `connector`, opened (engine started) on first use."""
        if connector not in self._sessions:
            if self.replay.start_offset is not None and self._sessions:
                raise CdcError("start_offset replays one connector: launch its sync job alone", connector=connector)
            config = load_config(self.config_path)
            connector_config = config.connector(connector)
            preflight.require_ready(connector_config, config.destination)
            # A Dagster run streams on while changes keep coming (linger_seconds), the sensor launching the next,
            # unless runs wait in the queue for its slot.
            session = ConnectorSession(connector_config, config.destination, self.spark.get_session(),
                                       start_offset=self.replay.start_offset,
                                       linger_seconds=connector_config.linger_seconds,
                                       linger_yields=RunQueueWait(self._instance, connector, self._run_tags)
                                       if self._instance is not None else None)
            try:
                session.open()
            except BaseException as exc:
                session.close(exc)
                raise
            self._sessions[connector] = session
        return self._sessions[connector]

    def table_changes(self, connector: str) -> TableChanges:
        """What the run's cycle of `connector` applied per table, counted as its batches are applied."""
        return self._table_changes.setdefault(connector, TableChanges())

    @contextmanager
    def step(self, connector: str) -> Iterator[ConnectorSession]:
        """Runs one step of `connector`'s cycle; a failure is kept so teardown records it as its last error."""
        try:
            yield self.session(connector)
        except BaseException as exc:
            self._errors[connector] = exc
            raise
