"""A real failing run under error_strategy exit (a poison event the destination refuses): the connector stays
stopped and the change sensor skips, naming the error and the resume command; the run-failure sensor does not count
the failure twice, and counts one its session never saw; after `resume` the sensor launches runs again."""

from __future__ import annotations

import psycopg
import pytest
from dagster import (
    DagsterEventType,
    DagsterInstance,
    Failure,
    RunRequest,
    SensorResult,
    SkipReason,
    build_run_status_sensor_context,
    build_sensor_context,
    job,
    op,
)

from dagster._core.errors import DagsterExecutionInterruptedError

from assets.definitions import build_definitions
from assets.sync_job import CONNECTOR_TAG
from cdc_pipeline.config import load_config
from cdc_pipeline.ops.cli import main
from resources.debezium_runner import ENGINE_SERVED, ENGINE_TAG
from resources.destination import DestinationResource

pytestmark = pytest.mark.integration

ORDERS = "CREATE TABLE orders (id INT PRIMARY KEY, qty INT NOT NULL)"
LIMIT = 'ALTER TABLE "{schema}".orders ADD CONSTRAINT qty_limit CHECK (qty < 1000)'


def _state(pipeline) -> tuple:
    return pipeline.dest_query("SELECT state, failures, last_error FROM cdc.connector_state WHERE connector = %s",
                               (pipeline.name,))[0]


def _resources(pipeline) -> dict:
    return {"destination": DestinationResource(config_path=str(pipeline.config_path))}


def _change_sensor(pipeline, instance):
    sensor = build_definitions(load_config()).resolve_sensor_def(f"sync_{pipeline.name}_on_changes")
    with build_sensor_context(instance=instance, resources=_resources(pipeline)) as context:
        result = sensor(context)
    # The sensor's result also records the connector's lag: its decision is the run request or the skip.
    if isinstance(result, SensorResult):
        return result.run_requests[0] if result.run_requests else result.skip_reason
    return result


def _run_failure_sensor(pipeline, instance, run_id):
    sensor = build_definitions(load_config()).resolve_sensor_def("cdc_run_failures")
    (record,) = instance.all_logs(run_id, of_type=DagsterEventType.RUN_FAILURE)
    context = build_run_status_sensor_context(sensor_name="cdc_run_failures", dagster_event=record.dagster_event,
                                              dagster_instance=instance, dagster_run=instance.get_run_by_id(run_id),
                                              resources=_resources(pipeline))
    return sensor(context.for_run_failure())


def test_a_failed_run_under_exit_stays_stopped_until_resumed(pipeline):
    pipeline.source(ORDERS)
    pipeline.write_config(error_strategy="exit", tables=[f"{pipeline.source_db}.orders"])
    pipeline.sync()
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        conn.execute(LIMIT.format(schema=pipeline.source_db))
    pipeline.source("INSERT INTO orders VALUES (1, 5), (2, 5000), (3, 7)")

    sync_job = build_definitions(load_config()).resolve_job_def(f"sync_{pipeline.name}")
    with DagsterInstance.ephemeral() as instance:
        failed = sync_job.execute_in_process(instance=instance, raise_on_error=False)
        assert not failed.success
        state, failures, error = _state(pipeline)
        assert (state, failures) == ("stopped", 1) and "qty_limit" in error

        # Its session recorded it: the run-failure sensor does not count it again.
        skipped = _run_failure_sensor(pipeline, instance, failed.run_id)
        assert isinstance(skipped, SkipReason) and "recorded already" in skipped.skip_message
        assert _state(pipeline)[1] == 1

        for _ in range(2):
            held = _change_sensor(pipeline, instance)
            assert isinstance(held, SkipReason), held
            assert "qty_limit" in held.skip_message and f"cdc-pipeline resume {pipeline.name}" in held.skip_message
        assert main(["pending", pipeline.name]) == 1

        # A failure the session never saw (here: an op failing before any cycle) is counted by the sensor.
        @op
        def resource_did_not_start():
            raise Failure("the Spark session did not start")

        @job(name=f"sync_{pipeline.name}", tags={CONNECTOR_TAG: pipeline.name})
        def broken_sync():
            resource_did_not_start()

        broken = broken_sync.execute_in_process(instance=instance, raise_on_error=False)
        assert _run_failure_sensor(pipeline, instance, broken.run_id) is None
        state, failures, error = _state(pipeline)
        assert (state, failures) == ("stopped", 2) and broken.run_id in error

        # A served run whose process ended under it (Dagster stopped): its cycle ended as a pause on the server,
        # nothing of the connector failed, so it is not counted.
        @op
        def interrupted():
            raise DagsterExecutionInterruptedError()

        @job(name=f"sync_{pipeline.name}", tags={CONNECTOR_TAG: pipeline.name, ENGINE_TAG: ENGINE_SERVED})
        def served_sync():
            interrupted()

        cut = served_sync.execute_in_process(instance=instance, raise_on_error=False)
        skipped = _run_failure_sensor(pipeline, instance, cut.run_id)
        assert isinstance(skipped, SkipReason) and "served and its process ended" in skipped.skip_message
        assert _state(pipeline)[1] == 2

        # The operator fixes the cause and resumes: the failures are forgotten and the sensor launches a run.
        with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
            conn.execute(f'ALTER TABLE "{pipeline.source_db}".orders DROP CONSTRAINT qty_limit')
        assert main(["resume", pipeline.name]) == 0
        main(["requests", "--serve"])
        assert _state(pipeline)[:2] == ("syncing", 0)
        assert isinstance(_change_sensor(pipeline, instance), RunRequest)
    pipeline.sync()
    pipeline.assert_same("orders")
    assert _state(pipeline)[:2] == ("syncing", 0)
