"""One schedule per connector, skipping while a run of that connector is in progress or the connector is paused."""


import logging
from typing import Any

import psycopg
from dagster import (
    DagsterInvalidDefinitionError,
    DagsterRunStatus,
    DefaultScheduleStatus,
    JobDefinition,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)

from cdc_pipeline import control
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.errors import CdcError, ConfigError
from resources.destination import DestinationResource

log = logging.getLogger(__name__)

ACTIVE_RUN_STATUSES = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


def active_run_skip(context: Any, job: JobDefinition) -> SkipReason | None:
    """A skip naming the job's run still in progress, or None: never two runs of a connector at once."""
    active = context.instance.get_runs(filters=RunsFilter(job_name=job.name, statuses=ACTIVE_RUN_STATUSES), limit=1)
    if active:
        return SkipReason(f"run {active[0].run_id} of {job.name} is still {active[0].status.value.lower()}")
    return None


def build_sync_schedule(connector: ConnectorConfig, job: JobDefinition, config_path: str) -> ScheduleDefinition:
    """The `sync_<name>_schedule`: a fetch cycle on the connector's cron, never two at once, none while paused.

    Dagster checks the cron (a standard 5-field expression or an @ macro); a cron it refuses is a ConfigError naming
    the file, the connector and the field, whichever trigger the connector uses."""
    try:
        define = schedule(name=f"{job.name}_schedule", cron_schedule=connector.schedule, job=job,
                          default_status=DefaultScheduleStatus.RUNNING if connector.trigger == "schedule"
                          else DefaultScheduleStatus.STOPPED,
                          description=f"Runs {job.name} on '{connector.schedule}', skipping while a run of it is in "
                                      "progress or the connector is paused.")
        return define(_sync_schedule_function(connector, job))
    except DagsterInvalidDefinitionError as exc:
        raise ConfigError(f"{config_path}: field 'schedule' {connector.schedule!r} is refused by Dagster: {exc}",
                          connector=connector.name) from None


def _sync_schedule_function(connector: ConnectorConfig, job: JobDefinition) -> Any:
    def sync_schedule(context: ScheduleEvaluationContext, destination: DestinationResource):
        busy = active_run_skip(context, job)
        if busy is not None:
            return busy
        try:
            with destination.connect() as conn:
                state = control.read_state(conn, destination.destination().control_schema, connector.name)
                if control.run_lock_held(conn, connector.name):
                    return SkipReason(f"a fetch cycle of connector {connector.name} is running (its run lock is "
                                      "held: a materialization of its assets, or cdc-pipeline sync)")
        except (psycopg.Error, CdcError) as exc:
            # The run itself fails with the error, where the UI shows it; the schedule does not hide it.
            log.warning("cannot read the state of connector %s: %s", connector.name, exc)
            state = None
        if state is not None and state["state"] in control.HALTED_STATES:
            return SkipReason(f"connector {connector.name} is {state['state']} (cdc-pipeline resume {connector.name})")
        held = control.failure_hold(state, connector)
        if held is not None:
            return SkipReason(held)
        return RunRequest()

    return sync_schedule
