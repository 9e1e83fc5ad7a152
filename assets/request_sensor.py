"""The request sensor: serves the connectors' pending state-change requests and launches the runs they need."""


from dagster import (
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from cdc_pipeline.ops import requests
from cdc_pipeline.config import load_config
from resources.destination import DestinationResource

REQUEST_TAG = "cdc/request"
SENSOR_INTERVAL_SECONDS = 10


def build_request_sensor(config_path: str, sync_jobs: list[JobDefinition]) -> SensorDefinition:
    """`cdc_requests`: every evaluation serves the pending rows of the requests table, oldest first (each done or
    rejected with its reason); a resume or restart launches the connector's `sync_<name>` run at once (`run_key`
    per request). The cursor is the id of the last request served."""

    @sensor(name="cdc_requests", jobs=sync_jobs, minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
            default_status=DefaultSensorStatus.RUNNING,
            description="Serves pause, resume, set_offset, restart and reload_objmap requests from the control "
                        "schema's requests table.")
    def request_sensor(context: SensorEvaluationContext, destination: DestinationResource):
        config = load_config(config_path)
        with destination.connect() as conn:
            outcomes = requests.serve_pending_requests(conn, config.destination.control_schema, config)
        if not outcomes:
            return SkipReason("no pending request")
        for outcome in outcomes:
            context.log.info(f"request {outcome.request.id} ({outcome.request.kind}) of connector "
                             f"{outcome.request.connector}: {outcome.status}: {outcome.reason}")
        run_requests = [
            RunRequest(run_key=f"request-{outcome.request.id}", job_name=f"sync_{outcome.request.connector}",
                       tags={REQUEST_TAG: str(outcome.request.id)})
            for outcome in outcomes if outcome.launch_run]
        cursor = max([int(context.cursor or 0), *(outcome.request.id for outcome in outcomes)])
        return SensorResult(run_requests=run_requests, cursor=str(cursor))

    return request_sensor
