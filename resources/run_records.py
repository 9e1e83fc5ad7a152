"""The runs a Dagster instance recorded, as JSON on standard output (`python -m resources.run_records HOME`): each
run's status and times, and the first failures' messages. `bench --databases` reads them this way, so that the
engine's package imports no Dagster."""

import json
import sys

from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus


def main(home: str) -> None:
    with DagsterInstance.from_config(home) as instance:
        records = instance.get_run_records()
        failed = [r for r in records if r.dagster_run.status == DagsterRunStatus.FAILURE]
        failures = [event.message for r in failed[:3] for event in instance.all_logs(
            r.dagster_run.run_id, of_type={DagsterEventType.RUN_FAILURE, DagsterEventType.STEP_FAILURE})][:3]
        print(json.dumps({"runs": [{"status": r.dagster_run.status.value, "created": r.create_timestamp.timestamp(),
                                    "start": r.start_time, "end": r.end_time} for r in records],
                          "failures": [message[:400] for message in failures]}))


if __name__ == "__main__":
    main(sys.argv[1])
