"""The run-failure sensor: counts every failed `sync_<name>` run in the connector's state, the failures the run's
own session could not record (the process killed, a resource that did not start) included, each once."""

import logging

from dagster import (
    DefaultSensorStatus,
    JobDefinition,
    RunFailureSensorContext,
    SensorDefinition,
    SkipReason,
    run_failure_sensor,
)
from dagster._core.events import RunFailureReason

from assets.sync_job import CONNECTOR_TAG
from cdc_pipeline import control
from cdc_pipeline.config import load_config
from resources.debezium_runner import ENGINE_SERVED, ENGINE_TAG
from resources.destination import DestinationResource

log = logging.getLogger(__name__)


def build_run_failure_sensor(config_path: str, sync_jobs: list[JobDefinition]) -> SensorDefinition:
    """`cdc_run_failures`: for each failed sync run, the connector's failures in a row, last error and next attempt
    (`control.record_failure`), unless its session recorded this failure already (a failure recorded since the run
    started), or the run was served and its process ended under it (`_served_and_interrupted`: Dagster stopped, the
    run's process killed), which its cycle on the pipeline server takes as a pause: what it applied is committed,
    and nothing failed on the connector's side. A standing run is nearly always running when Dagster stops."""

    @run_failure_sensor(name="cdc_run_failures", monitored_jobs=sync_jobs, default_status=DefaultSensorStatus.RUNNING,
                        description="Records each failed sync run in its connector's state (failures in a row, last "
                                    "error, next attempt), once.")
    def record_run_failure(context: RunFailureSensorContext, destination: DestinationResource):
        run = context.dagster_run
        name = run.tags.get(CONNECTOR_TAG)
        connector = load_config(config_path).connectors.get(name or "")
        if connector is None:
            return SkipReason(f"run {run.run_id} names no configured connector")
        if _served_and_interrupted(run.tags, context.failure_event):
            return SkipReason(f"run {run.run_id} of connector {name} was served and its process ended under it "
                              "(Dagster stopped, or the process was killed): its cycle on the pipeline server ended "
                              "as a pause does, what it applied committed; not counted as a failure of the connector")
        record = context.instance.get_run_record_by_id(run.run_id)
        started = (record.start_time if record and record.start_time
                   else record.create_timestamp.timestamp() if record else None)
        error = context.failure_event.message or f"run {run.run_id} failed"
        with destination.connect() as conn:
            failures = control.record_failure(conn, destination.destination().control_schema, connector,
                                              f"run {run.run_id} failed: {error}", unless_recorded_since=started)
        if failures is None:
            return SkipReason(f"the failure of run {run.run_id} is recorded already (by its session)")
        log.warning("connector %s: run %s failed (%d in a row): %s", name, run.run_id, failures, error)
        return None

    return record_run_failure


def _served_and_interrupted(tags: dict[str, str], failure_event) -> bool:
    """Whether a run whose cycle a pipeline server served (its tag) failed only because its process was interrupted or
    ended (Dagster's unexpected termination, or DagsterExecutionInterruptedError), not on an error of its cycle."""
    if tags.get(ENGINE_TAG) != ENGINE_SERVED:
        return False
    data = getattr(failure_event, "event_specific_data", None)
    error = getattr(data, "error", None)
    return getattr(data, "failure_reason", None) == RunFailureReason.UNEXPECTED_TERMINATION or (
        error is not None and error.cls_name == "DagsterExecutionInterruptedError")
