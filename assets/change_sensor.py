"""One change sensor per connector whose `trigger` is `changes`: launches `sync_<name>` only when the connector has
work (cdc_pipeline/pending.py checks the source without a JVM), never two runs at once, none while paused."""

import logging

import psycopg
from dagster import (
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from assets.schedules import active_run_skip
from cdc_pipeline.ops import pending
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.errors import CdcError
from resources.destination import DestinationResource

log = logging.getLogger(__name__)

TRIGGER_TAG = "cdc/trigger"


def build_change_sensor(connector: ConnectorConfig, job: JobDefinition) -> SensorDefinition:
    """`sync_<name>_on_changes`, every `check_interval_seconds`."""

    @sensor(name=f"{job.name}_on_changes", job=job, minimum_interval_seconds=connector.check_interval_seconds,
            default_status=DefaultSensorStatus.RUNNING if connector.trigger == "changes"
            else DefaultSensorStatus.STOPPED,
            description=f"Launches {job.name} when its source holds changes it has not applied (or its bulk snapshot "
                        "is not finished), checked without a JVM; skips while a run is in progress or the "
                        "connector is paused.")
    def change_sensor(context: SensorEvaluationContext, destination: DestinationResource):
        busy = active_run_skip(context, job)
        if busy is not None:
            return busy
        try:
            found = pending.check(connector, destination.destination())
        except (psycopg.Error, CdcError) as exc:
            # A run then fails with the error where the UI shows it: the sensor does not hide it.
            log.warning("cannot check connector %s for changes: %s", connector.name, exc)
            found = pending.Pending(True, f"the check failed: {exc}")
        if not found.work:
            return SkipReason(found.reason)
        return RunRequest(tags={TRIGGER_TAG: found.reason[:200]})

    return change_sensor
