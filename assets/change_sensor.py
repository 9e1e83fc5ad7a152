"""The change sensors: launch `sync_<name>` only when the connector has work (cdc_pipeline/ops/pending.py checks the
source without a JVM), never two runs at once, none while paused, none while a failed connector is held (stopped
under error_strategy exit, backing off under retry and skip). One sensor per connector, or one for them all
(`cdc_changes`) with more than ONE_SENSOR_BEYOND_CONNECTORS connectors whose trigger is `changes`."""

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Sequence

import psycopg
from dagster import (
    AssetKey,
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets import observations
from assets.schedules import ACTIVE_RUN_STATUSES
from assets.table_assets import table_asset_key
from cdc_pipeline import control
from cdc_pipeline.ops import auto_server, lag, pending, pipeline_server
from cdc_pipeline.config import ConnectorConfig, DestinationConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline.ops.tables import ReplicatedTable
from resources.debezium_runner import ENGINE_OWN, ENGINE_SERVED, ENGINE_TAG, TRIGGER_TAG, standing_limit
from resources.destination import DestinationResource

log = logging.getLogger(__name__)

# The sensor's minimum interval: under Dagster's daemon, which goes over its sensors every 5 s at most, it is evaluated
# at each pass (a minimum of 5 s would skip every other pass that comes a little early). Between two checks of the
# source, every check_interval_seconds, an evaluation only looks whether a run of the connector ended, and checks at
# once if one did, so a run that ended on its budget with work waiting is followed by the next one.
RUN_END_POLL_SECONDS = 4
# A check due within this long is made now rather than at the daemon's next pass, 5 s later.
CHECK_DUE_SLACK_SECONDS = 1.0
# Statuses of a run that ended.
ENDED_RUN_STATUSES = [DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED]


# Connectors whose trigger is `changes` beyond which one sensor, `cdc_changes`, checks them all instead of one sensor
# each: the daemon evaluates this many sensors at once (dagster.yaml's sensors.num_workers), and each evaluation
# costs it a tick and a cursor written to the instance's storage, with many connectors most of its CPU
# (docs/triggers.md, "Many connectors on one machine").
ONE_SENSOR_BEYOND_CONNECTORS = 4
CHANGES_SENSOR_NAME = "cdc_changes"
# The checks one evaluation of `cdc_changes` makes at once (each a query of the destination and one of the source).
CHECK_THREADS = 8
# A check of `cdc_changes` that has not answered within this long counts as a failed check, and the connector is not
# checked again before its backoff has passed: a source that hangs holds every connector's pass this long, once per
# backoff (Dagster ends an evaluation after 60 s; a MariaDB check reads the binlog for 5 s at most).
CHECK_TIMEOUT_SECONDS = 15.0
# A pass that takes longer is logged with where its time went (the daemon's next pass waits for it).
SLOW_PASS_SECONDS = 10.0


@dataclass(frozen=True)
class Watched:
    """A connector a change sensor checks: its sync job and the table assets it records observations of."""

    connector: ConnectorConfig
    job: JobDefinition
    tables: Sequence[ReplicatedTable] = ()

    @property
    def table_keys(self) -> list[AssetKey]:
        return [table_asset_key(table) for table in self.tables]


def build_change_sensor(connector: ConnectorConfig, job: JobDefinition,
                        tables: Sequence[ReplicatedTable] = ()) -> SensorDefinition:
    """`sync_<name>_on_changes`: checks the source every `check_interval_seconds`, and at once when a run of the
    connector ends (a run that ended on its budget, `max_seconds_per_run`, while changes kept coming is followed by the
    next one without waiting for the interval). A connector whose check finds nothing, whose runs a pipeline server
    serves and whose `standing_run` is on gets a standing run (it streams on between changes) while the run queue has
    room for it (`_standing`).

    Its cursor counts the checks that failed in a row (the destination or the source did not answer): the first
    launches a run, whose failure the UI shows; the next ones launch one only after the same backoff as failed runs.
    Every check also records the connector's lag, the tables' freshness and their source tables' rows
    (`assets/observations.py`), for the `tables` of the definitions.
    """
    watched = Watched(connector, job, tables)

    @sensor(name=f"{job.name}_on_changes", job=job,
            minimum_interval_seconds=min(connector.check_interval_seconds, RUN_END_POLL_SECONDS),
            default_status=DefaultSensorStatus.RUNNING if connector.trigger == "changes"
            else DefaultSensorStatus.STOPPED,
            description=f"Launches {job.name} when its source holds changes it has not applied (or its bulk snapshot "
                        f"is not finished), checked without a JVM every {connector.check_interval_seconds} s "
                        "(check_interval_seconds) and at once when a run of it ended; skips while a run is in progress, the "
                        "connector is paused, or a failed connector is stopped (error_strategy exit) or backing off. "
                        "With its runs served by a pipeline server and standing_run on, launches a standing run when "
                        "none runs and the run queue has room. "
                        "Records the connector's lag behind its source and its tables' freshness at every check.")
    def change_sensor(context: SensorEvaluationContext, destination: DestinationResource):
        cursor = json.loads(context.cursor) if context.cursor else {}
        (outcome,) = _evaluate(context, [watched], {connector.name: cursor}, destination)
        if outcome.run_request is None and outcome.cursor is None and not outcome.events:
            return SkipReason(outcome.skip)  # not due: nothing checked, nothing recorded
        return SensorResult(run_requests=[outcome.run_request] if outcome.run_request else None,
                            skip_reason=SkipReason(outcome.skip) if outcome.run_request is None else None,
                            cursor=json.dumps(outcome.cursor) if outcome.cursor is not None else None,
                            asset_events=outcome.events)

    return change_sensor


def build_changes_sensor(watched: Sequence[Watched]) -> SensorDefinition:
    """`cdc_changes`: the change sensor of every connector in `watched` (those whose trigger is `changes`, when there
    are more than ONE_SENSOR_BEYOND_CONNECTORS of them), each checked as its own sensor would be, the due checks at
    once (CHECK_THREADS), with one tick and one cursor per pass (its cursor holds each connector's)."""
    watched = list(watched)
    names = ", ".join(entry.connector.name for entry in watched)

    @sensor(name=CHANGES_SENSOR_NAME, jobs=[entry.job for entry in watched],
            minimum_interval_seconds=min(min(entry.connector.check_interval_seconds for entry in watched),
                                         RUN_END_POLL_SECONDS),
            default_status=DefaultSensorStatus.RUNNING,
            description=f"Launches the sync job of each of its {len(watched)} connectors ({names[:300]}) when its "
                        "source holds changes the connector has not applied (or its bulk snapshot is not finished), "
                        "checked without a JVM every check_interval_seconds and at once when a run of it ended; skips "
                        "a connector while its run is in progress, it is paused, or it failed and is stopped "
                        "(error_strategy exit) or backing off. Records each connector's lag and its tables' "
                        "freshness. One sensor for many connectors: one tick of the daemon per pass.")
    def changes_sensor(context: SensorEvaluationContext, destination: DestinationResource):
        stored = json.loads(context.cursor).get("connectors", {}) if context.cursor else {}
        outcomes = _evaluate(context, watched, stored, destination)
        cursors = {outcome.name: outcome.cursor if outcome.cursor is not None else stored.get(outcome.name, {})
                   for outcome in outcomes}
        requests = [outcome.run_request for outcome in outcomes if outcome.run_request is not None]
        events = [event for outcome in outcomes for event in outcome.events]
        skips = [outcome.skip for outcome in outcomes if outcome.run_request is None]
        return SensorResult(run_requests=requests or None,
                            skip_reason=None if requests else SkipReason(_summary(skips)),
                            cursor=json.dumps({"connectors": cursors}), asset_events=events)

    return changes_sensor


def _summary(skips: list[str], shown: int = 10) -> str:
    """The skips of one pass in one message (Dagster shows it on the tick), the first `shown` of them in full."""
    more = f"; and {len(skips) - shown} more connectors" if len(skips) > shown else ""
    return "; ".join(skips[:shown]) + more


@dataclass
class _Outcome:
    """What one evaluation decided for a connector: a run or why not, its new cursor (None: unchanged) and the
    asset events it records."""

    name: str
    run_request: RunRequest | None = None
    skip: str = ""
    cursor: dict | None = None
    events: list = field(default_factory=list)
    job_name: str = ""
    may_stand: bool = False  # no work, and a standing run may be launched if the run queue has room (`_standing`)


def _evaluate(context: SensorEvaluationContext, watched: Sequence[Watched], cursors: dict[str, dict],
              destination: DestinationResource) -> list[_Outcome]:
    """Each connector's decision at this pass, in `watched`'s order: a skip while its run is in progress or until its
    next check is due, else its source checked (the due checks at once) and a run launched when it has work."""
    started = time.monotonic()
    active = _active_runs(context, watched)
    due: list[Watched] = []
    outcomes: dict[str, _Outcome] = {}
    ended = _ended_runs(context, watched, cursors, active)
    runs_read = time.monotonic()
    for entry in watched:
        name = entry.connector.name
        run = active.get(entry.job.name)
        if run is not None:
            outcomes[name] = _Outcome(name, skip=f"run {run.run_id} of {entry.job.name} is still "
                                                 f"{run.status.value.lower()}",
                                      events=observations.table_events(context.instance, entry.connector,
                                                                       entry.table_keys, None))
            continue
        waiting = _next_check_skip(entry.connector, cursors.get(name, {}), ended.get(entry.job.name))
        if waiting is not None:
            outcomes[name] = _Outcome(name, skip=waiting)
        else:
            due.append(entry)
    checked = _check_all(due, destination.destination()) if due else {}
    checks_done = time.monotonic()
    for entry in due:
        found, measured, _ = checked[entry.connector.name]
        outcomes[entry.connector.name] = _after_check(context, entry, cursors.get(entry.connector.name, {}), found,
                                                      measured)
    _standing(context, [outcome for outcome in outcomes.values() if outcome.may_stand],
              sum(1 for outcome in outcomes.values() if outcome.run_request is not None))
    if time.monotonic() - started > SLOW_PASS_SECONDS:
        slowest = max(checked.items(), key=lambda item: item[1][2], default=None)
        log.warning("a pass of the change sensor over %d connectors took %.1f s: the instance's runs read in %.1f s, "
                    "%d checks in %.1f s%s, the observations in %.1f s", len(watched), time.monotonic() - started,
                    runs_read - started, len(due), checks_done - runs_read,
                    f" (the slowest, connector {slowest[0]}'s, {slowest[1][2]:.1f} s)" if slowest else "",
                    time.monotonic() - checks_done)
    return [outcomes[entry.connector.name] for entry in watched]


def _standing(context: SensorEvaluationContext, idle: Sequence[_Outcome], launched: int) -> None:
    """Turns the skips of `idle` connectors (no work, no run, their runs served, `standing_run` on) into launches
    of standing runs, in order, while the runs queued and in progress (and the `launched` ones of this pass) leave
    room (`standing_limit`): a run that streams on between changes, so that the next change is applied at once."""
    if not idle:
        return
    limit = standing_limit(context.instance)
    room = limit - context.instance.get_runs_count(filters=RunsFilter(statuses=ACTIVE_RUN_STATUSES)) - launched
    for outcome in idle[:max(0, room)]:
        outcome.run_request = RunRequest(run_key=f"standing-{outcome.name}-{time.time_ns()}",
                                         job_name=outcome.job_name, tags={
                                             TRIGGER_TAG: f"standing: {outcome.skip}"[:200],
                                             ENGINE_TAG: ENGINE_SERVED})


def _active_runs(context: SensorEvaluationContext, watched: Sequence[Watched]) -> dict[str, Any]:
    """The run in progress (queued to canceling) of each watched job that has one: one query of the instance."""
    jobs = {entry.job.name for entry in watched}
    runs = context.instance.get_runs(filters=RunsFilter(
        job_name=next(iter(jobs)) if len(jobs) == 1 else None, statuses=ACTIVE_RUN_STATUSES))
    return {run.job_name: run for run in reversed(runs) if run.job_name in jobs}


def _ended_runs(context: SensorEvaluationContext, watched: Sequence[Watched], cursors: dict[str, dict],
                active: dict[str, Any]) -> dict[str, float]:
    """When the latest run of each watched job that ended since its connector's last check ended (for the
    connectors whose next check is not due yet): one query of the instance."""
    waiting = {entry.job.name: _checked_at(cursors.get(entry.connector.name, {})) for entry in watched
               if entry.job.name not in active and _due_in(entry.connector, cursors.get(entry.connector.name, {}))
               > CHECK_DUE_SLACK_SECONDS}
    if not waiting:
        return {}
    records = context.instance.get_run_records(filters=RunsFilter(
        job_name=next(iter(waiting)) if len(waiting) == 1 else None, statuses=ENDED_RUN_STATUSES,
        updated_after=datetime.fromtimestamp(min(waiting.values()), timezone.utc)), limit=max(100, 10 * len(waiting)))
    ended: dict[str, float] = {}
    for record in records:
        job, at = record.dagster_run.job_name, record.update_timestamp.timestamp()
        if job in waiting and at > waiting[job]:
            ended[job] = max(at, ended.get(job, 0.0))
    return ended


def _checked_at(cursor: dict) -> float:
    return float(cursor.get("checked_at", 0))


def _due_in(connector: ConnectorConfig, cursor: dict) -> float:
    return _checked_at(cursor) + connector.check_interval_seconds - time.time()


def _next_check_skip(connector: ConnectorConfig, cursor: dict, run_ended_at: float | None) -> str | None:
    """Why the connector is not checked at this pass, until its next check, check_interval_seconds after the last
    one that answered, or after a check that did not answer in time once its backoff has passed; None when it is
    due, or when a run of the connector ended since its last check that answered (at once: work may wait that the
    run left)."""
    if run_ended_at is not None:
        return None
    retry_at = float(cursor.get("retry_at", 0))
    if cursor.get("timed_out") and time.time() < retry_at:
        return (f"the check of connector {connector.name} did not answer within {CHECK_TIMEOUT_SECONDS:.0f} s "
                f"{cursor.get('failed_checks', 1)} times in a row; checked again at "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(retry_at))} UTC (backoff)")
    due_in = _due_in(connector, cursor)
    if due_in <= CHECK_DUE_SLACK_SECONDS:
        return None
    return (f"next change check of connector {connector.name} in {due_in:.0f} s (check_interval_seconds), or at "
            "once when a run of it ends")


def _check_all(due: Sequence[Watched], destination: DestinationConfig) -> dict[str, tuple[Any, Any, float]]:
    """Each due connector's check (its Pending, or the error that ended it), its lag (None when not measured) and
    the seconds they took: at once, CHECK_THREADS at a time; one that has not answered within CHECK_TIMEOUT_SECONDS
    counts as failed."""
    if len(due) == 1:
        return {due[0].connector.name: _check(due[0].connector, destination)}
    pool = ThreadPoolExecutor(max_workers=min(CHECK_THREADS, len(due)), thread_name_prefix="cdc-change-check")
    try:
        futures = {entry.connector.name: pool.submit(_check, entry.connector, destination) for entry in due}
        wait(futures.values(), timeout=CHECK_TIMEOUT_SECONDS)
        return {name: future.result() if future.done() else (
                    CheckTimedOut(f"the check of connector {name} did not answer within "
                                  f"{CHECK_TIMEOUT_SECONDS:.0f} s"),
                    None, CHECK_TIMEOUT_SECONDS)
                for name, future in futures.items()}
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _check(connector: ConnectorConfig, destination: DestinationConfig) -> tuple[Any, Any, float]:
    """The connector's Pending (or the error its check raised), its lag behind its source (None when it cannot be
    measured) and the seconds they took."""
    started = time.monotonic()
    try:
        found = pending.check(connector, destination)
    except (psycopg.Error, CdcError) as exc:
        log.warning("cannot check connector %s for changes: %s", connector.name, exc)
        return exc, None, time.monotonic() - started
    try:
        measured = lag.measure(connector, destination)
    except (psycopg.Error, CdcError) as exc:
        log.warning("cannot measure the lag of connector %s: %s", connector.name, exc)
        measured = None
    return found, measured, time.monotonic() - started


def _after_check(context: SensorEvaluationContext, entry: Watched, cursor: dict, found: Any,
                 measured: Any) -> _Outcome:
    """The connector's decision once its source was checked (or its check failed)."""
    connector, name = entry.connector, entry.connector.name
    if isinstance(found, Exception):
        return _after_failed_check(entry, cursor, found, observations.table_events(
            context.instance, connector, entry.table_keys, None))
    events = _check_events(context, connector, found, measured, entry.tables, entry.table_keys)
    # A check that answers ends the failed checks' backoff.
    checked = {"checked_at": time.time()}
    if not found.work:
        return _Outcome(name, skip=found.reason, cursor=checked, events=events, job_name=entry.job.name,
                        may_stand=found.idle and connector.standing_run and connector.trigger == "changes"
                        and auto_server.will_serve(pipeline_server.served_config_path()))
    return _Outcome(name, run_request=RunRequest(
        run_key=f"changes-{name}-{time.time_ns()}", job_name=entry.job.name, tags={
            TRIGGER_TAG: found.reason[:200],
            ENGINE_TAG: ENGINE_SERVED if auto_server.will_serve(pipeline_server.served_config_path())
            else ENGINE_OWN}),
        cursor=checked, events=events)


def _check_events(context: SensorEvaluationContext, connector: ConnectorConfig, found: pending.Pending,
                  measured: Any, tables: Sequence[ReplicatedTable], table_keys: Sequence[AssetKey]) -> list:
    """The connector's lag (when its source can be measured), its tables' observations and freshness, and their
    source tables' rows."""
    events: list = []
    observation = observations.lag_observation(context.instance, connector, found, measured)
    if observation is not None:
        events.append(observation)
    events += observations.source_row_observations(context.instance, connector, tables)
    return events + observations.table_events(context.instance, connector, table_keys, found)


def _after_failed_check(entry: Watched, cursor: dict, error: Exception, events: list) -> _Outcome:
    """A run when the failed checks' backoff has passed (at once after the first), else a skip saying when."""
    connector, name = entry.connector, entry.connector.name
    failures, retry_at = int(cursor.get("failed_checks", 0)) + 1, float(cursor.get("retry_at", 0))
    now = time.time()
    message = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
    if now < retry_at:
        return _Outcome(name, skip=f"the check of connector {name} failed {failures} times in a row: {message}; next "
                                   f"run at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(retry_at))} UTC (backoff)",
                        cursor=_failed_cursor(failures, retry_at, error), events=events)
    # Every failed check counts, but only a launched run moves the next launch further away.
    backoff = control.backoff_seconds(connector, failures)
    return _Outcome(name, run_request=RunRequest(run_key=f"check-failed-{name}-{time.time_ns()}",
                                                 job_name=entry.job.name,
                                                 tags={TRIGGER_TAG: f"the check failed: {message}"[:200]}),
                    cursor=_failed_cursor(failures, now + backoff, error), events=events)


def _failed_cursor(failures: int, retry_at: float, error: Exception) -> dict:
    """The cursor after a failed check: a check that did not answer in time (`timed_out`) is not made again before
    `retry_at`."""
    cursor: dict[str, Any] = {"failed_checks": failures, "retry_at": retry_at}
    if isinstance(error, CheckTimedOut):
        cursor["timed_out"] = True
    return cursor


class CheckTimedOut(CdcError):
    """A check of `cdc_changes` that did not answer within CHECK_TIMEOUT_SECONDS (it goes on in its thread)."""
