"""The request sensor: serves the connectors' pending state-change requests and launches the runs they need."""

import json

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

from assets.schedules import active_run_skip
from cdc_pipeline import control
from cdc_pipeline.ops import requests
from cdc_pipeline.config import load_config
from resources.destination import DestinationResource

REQUEST_TAG = "cdc/request"
SENSOR_INTERVAL_SECONDS = 10


def build_request_sensor(config_path: str, sync_jobs: list[JobDefinition]) -> SensorDefinition:
    """`cdc_requests`: every evaluation serves the pending rows of the requests table, oldest first (each done or
    rejected with its reason); a resume, restart or snapshot launches the connector's `sync_<name>` run (`run_key`
    per request) as soon as no run of the connector is in progress: one that lingers would refuse it (its run lock),
    and the refusal would count as a failed run. The cursor holds the id of the last request served and the
    launches still owed (`_read_cursor`)."""
    jobs = {job.name: job for job in sync_jobs}

    @sensor(name="cdc_requests", jobs=sync_jobs, minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
            default_status=DefaultSensorStatus.RUNNING,
            description="Serves pause, resume, set_offset, restart, reload_objmap and snapshot requests from the "
                        "control schema's requests table; launches the runs they need once no run of the connector "
                        "is in progress.")
    def request_sensor(context: SensorEvaluationContext, destination: DestinationResource):
        config = load_config(config_path)
        served, owed = _read_cursor(context.cursor)
        launches: list[RunRequest] = []
        waiting: list[str] = []
        with destination.connect() as conn:
            outcomes = requests.serve_pending_requests(conn, config.destination.control_schema, config)
            for outcome in outcomes:
                context.log.info(f"request {outcome.request.id} ({outcome.request.kind}) of connector "
                                 f"{outcome.request.connector}: {outcome.status}: {outcome.reason}")
                if outcome.launch_run:
                    owed[outcome.request.connector] = outcome.request.id  # one run serves every request owed
            for name, request_id in sorted(owed.items()):
                job = jobs.get(f"sync_{name}")
                if job is None:
                    continue  # the connector left the connectors file: nothing to launch
                active = active_run_skip(context, job)
                busy = active.skip_message if active is not None else (
                    f"a fetch cycle of connector {name} is running" if control.run_lock_held(conn, name) else None)
                if busy is not None:
                    waiting.append(f"request {request_id} launches {job.name} once it ends: {busy}")
                    continue
                launches.append(RunRequest(run_key=f"request-{request_id}", job_name=job.name,
                                           tags={REQUEST_TAG: str(request_id)}))
        if not outcomes and not owed:
            return SkipReason("no pending request")
        launched = {run.job_name for run in launches}
        still_owed = {name: request_id for name, request_id in owed.items()
                      if f"sync_{name}" in jobs and f"sync_{name}" not in launched}
        cursor = json.dumps({"served": max([served, *(outcome.request.id for outcome in outcomes)]),
                             "owed": still_owed}, sort_keys=True)
        skip_reason = "; ".join(waiting) if waiting and not launches else None
        return SensorResult(run_requests=launches, cursor=cursor, skip_reason=skip_reason)

    return request_sensor


def _read_cursor(cursor: str | None) -> tuple[int, dict[str, int]]:
    """The id of the last request served and the runs owed (connector -> the request that asked for it). A cursor
    of an earlier version is the id alone."""
    if not cursor:
        return 0, {}
    read = json.loads(cursor)
    if isinstance(read, int):
        return read, {}
    return int(read.get("served", 0)), {str(name): int(request_id) for name, request_id in read.get("owed", {}).items()}
