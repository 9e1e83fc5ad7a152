"""One change sensor per connector whose `trigger` is `changes`: launches `sync_<name>` only when the connector has
work (cdc_pipeline/ops/pending.py checks the source without a JVM), never two runs at once, none while paused, none
while a failed connector is held (stopped under error_strategy exit, backing off under retry and skip)."""

import json
import logging
import time
from datetime import datetime, timezone
from typing import Sequence

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
from assets.schedules import active_run_skip
from assets.table_assets import table_asset_key
from cdc_pipeline import control
from cdc_pipeline.ops import lag, pending, pipeline_server
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline.ops.tables import ReplicatedTable
from resources.debezium_runner import ENGINE_OWN, ENGINE_SERVED, ENGINE_TAG
from resources.destination import DestinationResource

log = logging.getLogger(__name__)

TRIGGER_TAG = "cdc/trigger"
# The sensor's minimum interval: under Dagster's daemon, which goes over its sensors every 5 s at most, it is evaluated
# at each pass (a minimum of 5 s would skip every other pass that comes a little early). Between two checks of the
# source, every check_interval_seconds, an evaluation only looks whether a run of the connector ended, and checks at
# once if one did, so a run that ended on its budget with work waiting is followed by the next one.
RUN_END_POLL_SECONDS = 4
# A check due within this long is made now rather than at the daemon's next pass, 5 s later.
CHECK_DUE_SLACK_SECONDS = 1.0
# Statuses of a run that ended.
ENDED_RUN_STATUSES = [DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED]


def build_change_sensor(connector: ConnectorConfig, job: JobDefinition,
                        tables: Sequence[ReplicatedTable] = ()) -> SensorDefinition:
    """`sync_<name>_on_changes`: checks the source every `check_interval_seconds`, and at once when a run of the
    connector ends (a run that ended on its budget, `max_seconds_per_run`, while changes kept coming is followed by the
    next one without waiting for the interval).

    Its cursor counts the checks that failed in a row (the destination or the source did not answer): the first
    launches a run, whose failure the UI shows; the next ones launch one only after the same backoff as failed runs.
    Every check also records the connector's lag, the tables' freshness and their source tables' rows
    (`assets/observations.py`), for the `tables` of the definitions.
    """
    table_keys = [table_asset_key(table) for table in tables]

    @sensor(name=f"{job.name}_on_changes", job=job,
            minimum_interval_seconds=min(connector.check_interval_seconds, RUN_END_POLL_SECONDS),
            default_status=DefaultSensorStatus.RUNNING if connector.trigger == "changes"
            else DefaultSensorStatus.STOPPED,
            description=f"Launches {job.name} when its source holds changes it has not applied (or its bulk snapshot "
                        f"is not finished), checked without a JVM every {connector.check_interval_seconds} s "
                        "(check_interval_seconds) and at once when a run of it ended; skips while a run is in progress, the "
                        "connector is paused, or a failed connector is stopped (error_strategy exit) or backing off. "
                        "Records the connector's lag behind its source and its tables' freshness at every check.")
    def change_sensor(context: SensorEvaluationContext, destination: DestinationResource):
        busy = active_run_skip(context, job)
        if busy is not None:
            return SensorResult(skip_reason=busy,
                                asset_events=observations.table_events(context.instance, connector, table_keys, None))
        waiting = _next_check_skip(context, connector, job)
        if waiting is not None:
            return waiting
        try:
            found = pending.check(connector, destination.destination())
        except (psycopg.Error, CdcError) as exc:
            log.warning("cannot check connector %s for changes: %s", connector.name, exc)
            return _after_failed_check(context, connector, exc)._replace(
                asset_events=observations.table_events(context.instance, connector, table_keys, None))
        events = _check_events(context, connector, destination, found, tables, table_keys)
        if not found.work:
            decision = SkipReason(found.reason)
        else:
            decision = RunRequest(run_key=f"changes-{time.time_ns()}", tags={
                TRIGGER_TAG: found.reason[:200],
                ENGINE_TAG: ENGINE_SERVED if pipeline_server.serves() else ENGINE_OWN})
        # A check that answers ends the failed checks' backoff.
        cursor = json.dumps({"checked_at": time.time()})
        if isinstance(decision, SkipReason):
            return SensorResult(skip_reason=decision, cursor=cursor, asset_events=events)
        return SensorResult(run_requests=[decision], cursor=cursor, asset_events=events)

    return change_sensor


def _next_check_skip(context: SensorEvaluationContext, connector: ConnectorConfig,
                     job: JobDefinition) -> SkipReason | None:
    """A skip until the next check of the source, check_interval_seconds after the last one that answered; None when
    it is due, or when a run of the connector ended since (at once: work may wait that the run left)."""
    checked_at = float(json.loads(context.cursor).get("checked_at", 0)) if context.cursor else 0.0
    due_in = checked_at + connector.check_interval_seconds - time.time()
    if due_in <= CHECK_DUE_SLACK_SECONDS:
        return None
    ended = context.instance.get_runs(filters=RunsFilter(
        job_name=job.name, statuses=ENDED_RUN_STATUSES,
        updated_after=datetime.fromtimestamp(checked_at, timezone.utc)), limit=1)
    if ended:
        return None
    return SkipReason(f"next change check of connector {connector.name} in {due_in:.0f} s "
                      "(check_interval_seconds), or at once when a run of it ends")


def _check_events(context: SensorEvaluationContext, connector: ConnectorConfig, destination: DestinationResource,
                  found: pending.Pending, tables: Sequence[ReplicatedTable],
                  table_keys: Sequence[AssetKey]) -> list:
    """The connector's lag (when its source can be measured), its tables' observations and freshness, and their
    source tables' rows."""
    try:
        measured = lag.measure(connector, destination.destination())
    except (psycopg.Error, CdcError) as exc:
        log.warning("cannot measure the lag of connector %s: %s", connector.name, exc)
        measured = None
    events: list = []
    observation = observations.lag_observation(context.instance, connector, found, measured)
    if observation is not None:
        events.append(observation)
    events += observations.source_row_observations(context.instance, connector, tables)
    return events + observations.table_events(context.instance, connector, table_keys, found)


def _after_failed_check(context: SensorEvaluationContext, connector: ConnectorConfig, error: Exception) -> SensorResult:
    """A run when the failed checks' backoff has passed (at once after the first), else a skip saying when."""
    failed = json.loads(context.cursor) if context.cursor else {}
    failures, retry_at = int(failed.get("failed_checks", 0)) + 1, float(failed.get("retry_at", 0))
    now = time.time()
    message = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
    if now < retry_at:
        return SensorResult(skip_reason=SkipReason(
            f"the check of connector {connector.name} failed {failures} times in a row: {message}; next run at "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(retry_at))} UTC (backoff)"),
            cursor=json.dumps({"failed_checks": failures, "retry_at": retry_at}))
    # Every failed check counts, but only a launched run moves the next launch further away.
    backoff = control.backoff_seconds(connector, failures)
    return SensorResult(
        run_requests=[RunRequest(run_key=f"check-failed-{time.time_ns()}",
                                 tags={TRIGGER_TAG: f"the check failed: {message}"[:200]})],
        cursor=json.dumps({"failed_checks": failures, "retry_at": now + backoff}))
