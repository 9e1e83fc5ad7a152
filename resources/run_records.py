"""The runs a Dagster instance recorded, as JSON on standard output (`python -m resources.run_records HOME`): each
run's status and times, and the first failures' messages. `bench --databases` reads them this way, so that the
engine's package imports no Dagster."""

import json
import sys

from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus

from resources.debezium_runner import ENGINE_TAG, TRIGGER_TAG

# The tag Dagster gives a run a sensor launched: the sensor's name.
SENSOR_NAME_TAG = "dagster/sensor_name"


def main(home: str) -> None:
    with DagsterInstance.from_config(home) as instance:
        records = instance.get_run_records()
        failed = [r for r in records if r.dagster_run.status == DagsterRunStatus.FAILURE]
        failures = [event.message for r in failed[:3] for event in instance.all_logs(
            r.dagster_run.run_id, of_type={DagsterEventType.RUN_FAILURE, DagsterEventType.STEP_FAILURE})][:3]
        print(json.dumps({"runs": [{"status": r.dagster_run.status.value, "created": r.create_timestamp.timestamp(),
                                    "starting": _starting(instance, r.dagster_run.run_id),
                                    "start": r.start_time, "end": r.end_time,
                                    "engine": r.dagster_run.tags.get(ENGINE_TAG),
                                    "standing": r.dagster_run.tags.get(TRIGGER_TAG, "").startswith("standing:"),
                                    "sensor": r.dagster_run.tags.get(SENSOR_NAME_TAG)} for r in records],
                          "failures": [message[:400] for message in failures]}))


def _starting(instance: DagsterInstance, run_id: str) -> float | None:
    """When the launcher took the run (its process then starts, and the run starts once its code is loaded)."""
    events = instance.all_logs(run_id, of_type=DagsterEventType.RUN_STARTING)
    return events[0].timestamp if events else None


if __name__ == "__main__":
    main(sys.argv[1])
