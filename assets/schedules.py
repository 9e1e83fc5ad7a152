"""One schedule per connector, skipping while a run of that connector is in progress."""


from dagster import (
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

from cdc_pipeline.config import ConnectorConfig

ACTIVE_RUN_STATUSES = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


def build_sync_schedule(connector: ConnectorConfig, job: JobDefinition) -> ScheduleDefinition:
    """The `sync_<name>_schedule`: a fetch cycle on the connector's cron, never two at once."""

    @schedule(name=f"{job.name}_schedule", cron_schedule=connector.schedule, job=job,
              default_status=DefaultScheduleStatus.RUNNING,
              description=f"Runs {job.name} on '{connector.schedule}', skipping while a run of it is in progress.")
    def sync_schedule(context: ScheduleEvaluationContext):
        active = context.instance.get_runs(filters=RunsFilter(job_name=job.name, statuses=ACTIVE_RUN_STATUSES),
                                           limit=1)
        if active:
            return SkipReason(f"run {active[0].run_id} of {job.name} is still {active[0].status.value.lower()}")
        return RunRequest()

    return sync_schedule
