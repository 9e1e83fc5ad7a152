"""The Dagster layer: definitions load, the sync job runs in process, the schedule skips busy connectors."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
import yaml
from dagster import (
    AssetKey,
    DagsterInstance,
    DagsterInvalidConfigError,
    DagsterRun,
    DagsterRunStatus,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    RunRequest,
    SkipReason,
    build_schedule_context,
    instance_for_test,
    validate_run_config,
)

from assets.change_sensor import RUN_END_POLL_SECONDS
from assets.definitions import build_definitions
from cdc_pipeline import control
from cdc_pipeline.config import load_config, parse_config
from cdc_pipeline.errors import ConfigError
from resources.destination import DestinationResource
from tests.dagster_layer.automations import automations
from tests.helpers import PROJECT_ROOT


TWO_CONNECTORS = {
    "destination": {"dsn": "postgresql://u@127.0.0.1:5432/d"},
    "connectors": {
        "inventory": {"type": "mariadb", "hostname": "h", "user": "u", "password": "p", "database": "inventory",
                      "schedule": "*/5 * * * *", "trigger": "schedule"},
        "billing": {"type": "postgres", "hostname": "h", "user": "u", "password": "p", "database": "billing"},
    },
}


def test_definitions_have_a_job_a_change_sensor_and_a_schedule_per_connector(tmp_path):
    defs = build_definitions(parse_config(TWO_CONNECTORS, tmp_path / "c.yaml"))

    assert {job.name for job in defs.jobs} == {"sync_inventory", "sync_billing", "cdc_control"}
    assert {sensor.name for sensor in defs.sensors} == {"cdc_requests", "cdc_run_failures", "cdc_outside_runs",
                                                        "sync_inventory_on_changes", "sync_billing_on_changes"}
    # By its trigger, one of the two launches runs (the other is there, stopped, to be switched on in the UI).
    running = DefaultScheduleStatus.RUNNING
    assert defs.resolve_sensor_def("sync_billing_on_changes").default_status == DefaultSensorStatus.RUNNING
    assert defs.resolve_schedule_def("sync_billing_schedule").default_status == DefaultScheduleStatus.STOPPED
    assert defs.resolve_sensor_def("sync_inventory_on_changes").default_status == DefaultSensorStatus.STOPPED
    assert defs.resolve_schedule_def("sync_inventory_schedule").default_status == running
    # Its daemon evaluates it every RUN_END_POLL_SECONDS; it checks the source every check_interval_seconds (15).
    assert defs.resolve_sensor_def("sync_billing_on_changes").minimum_interval_seconds == RUN_END_POLL_SECONDS
    assert {spec.key.path[-1] for spec in defs.assets} == {"inventory", "billing"}
    schedule = defs.resolve_schedule_def("sync_inventory_schedule")
    assert schedule.cron_schedule == "*/5 * * * *"
    assert defs.resolve_schedule_def("sync_billing_schedule").cron_schedule == "* * * * *"
    job = defs.resolve_job_def("sync_inventory")
    [cycle] = job.graph.nodes
    assert cycle.name == "inventory_fetch_cycle"
    assert [node.name for node in cycle.definition.nodes_in_topological_order] == [
        "fetch_batches", "parse_events", "convert_ddl", "convert_dml", "apply_batches", "mark_batches_complete",
        "record_stats"]
    assert job.tags["cdc/connector"] == "inventory" and job.tags["dagster/max_retries"] == "0"


def test_a_sync_run_takes_the_replay_offset_as_run_config(tmp_path):
    job = build_definitions(parse_config(TWO_CONNECTORS, tmp_path / "c.yaml")).resolve_job_def("sync_billing")

    assert validate_run_config(job, {})
    assert validate_run_config(job, {"resources": {"replay": {"config": {"start_offset": '{"lsn": 1}'}}}})
    with pytest.raises(DagsterInvalidConfigError):
        validate_run_config(job, {"resources": {"replay": {"config": {"start_position": '{"lsn": 1}'}}}})


def test_the_sensor_and_schedule_are_automations_of_the_connectors_asset(tmp_path):
    defs = build_definitions(parse_config(TWO_CONNECTORS, tmp_path / "c.yaml"))

    sensors, schedules = automations(defs, AssetKey(["cdc", "billing"]))

    assert "sync_billing_on_changes" in sensors and "sync_inventory_on_changes" not in sensors
    assert schedules == {"sync_billing_schedule"}


@pytest.mark.parametrize("cron", ["every minute", "0 0 * * * *", "61 * * * *", "0 0 31 2 *"])
def test_a_schedule_dagster_refuses_names_the_file_connector_and_field(tmp_path, cron):
    data = copy.deepcopy(TWO_CONNECTORS)
    data["connectors"]["billing"]["schedule"] = cron  # its trigger is `changes`: a wrong cron is still an error

    with pytest.raises(ConfigError) as caught:
        build_definitions(parse_config(data, tmp_path / "c.yaml"))

    assert caught.value.connector == "billing"
    assert str(tmp_path / "c.yaml") in str(caught.value) and f"field 'schedule' '{cron}'" in str(caught.value)


def test_a_cron_macro_is_a_schedule(tmp_path):
    data = copy.deepcopy(TWO_CONNECTORS)
    data["connectors"]["billing"]["schedule"] = "@daily"

    assert build_definitions(parse_config(data, tmp_path / "c.yaml")).resolve_schedule_def(
        "sync_billing_schedule").cron_schedule == "@daily"


def test_secrets_stay_out_of_run_config_and_definitions(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("destination:\n  dsn: ${DSN}\nconnectors:\n  inventory:\n    type: mariadb\n    hostname: h\n"
                    "    user: u\n    password: ${PW}\n    database: inventory\n"
                    "spark:\n  conf:\n    spark.authenticate.secret: ${SPARK_SECRET}\n")
    monkeypatch.setenv("PW", "sup3r-secret-pw")
    monkeypatch.setenv("DSN", "postgresql://u:dest-secret@127.0.0.1/d")
    monkeypatch.setenv("SPARK_SECRET", "spark-secret-77")
    defs = build_definitions(load_config(path))
    job = defs.resolve_job_def("sync_inventory")

    resource_config = repr(job.resource_defs["debezium_runner"]) + repr(job.resource_defs)
    assert "sup3r-secret-pw" not in resource_config and "dest-secret" not in resource_config
    assert "spark-secret-77" not in resource_config


def test_dagster_loads_the_workspace(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("destination:\n  dsn: postgresql://u@127.0.0.1/d\nconnectors:\n  inventory:\n    type: mariadb\n"
                    "    hostname: h\n    user: u\n    password: p\n    database: inventory\n")
    env = {**os.environ, "CDC_PIPELINE_CONFIG": str(path), "DAGSTER_HOME": str(tmp_path)}
    dagster = Path(sys.executable).parent / "dagster"

    result = subprocess.run([str(dagster), "definitions", "validate", "-w", "workspace.yaml"], cwd=PROJECT_ROOT,
                            env=env, capture_output=True, text=True, timeout=300)

    assert result.returncode == 0, result.stdout + result.stderr


def _schedule_and_job(tmp_path):
    defs = build_definitions(parse_config(TWO_CONNECTORS, tmp_path / "c.yaml"))
    return defs.resolve_schedule_def("sync_inventory_schedule"), defs.resolve_job_def("sync_inventory")


def _unreachable_destination(tmp_path):
    """The destination resource of a connectors file whose PostgreSQL does not answer (the schedule's state
    lookup fails: the run, not the schedule, reports it)."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**TWO_CONNECTORS, "destination": {"dsn": "postgresql://u@127.0.0.1:9/d"}}))
    return {"destination": DestinationResource(config_path=str(path))}


def test_schedule_requests_a_run_when_the_connector_is_idle(tmp_path):
    schedule, _ = _schedule_and_job(tmp_path)
    with instance_for_test() as instance:
        with build_schedule_context(instance=instance, resources=_unreachable_destination(tmp_path)) as context:
            result = schedule(context)
    assert isinstance(result, RunRequest)


def test_schedule_skips_while_a_run_of_the_connector_is_in_progress(tmp_path):
    schedule, job = _schedule_and_job(tmp_path)
    with instance_for_test() as instance:
        run_id = str(uuid.uuid4())
        instance.add_run(DagsterRun(job_name=job.name, run_id=run_id, status=DagsterRunStatus.STARTED))
        other = DagsterRun(job_name="sync_billing", run_id=str(uuid.uuid4()), status=DagsterRunStatus.STARTED)
        instance.add_run(other)

        with build_schedule_context(instance=instance, resources=_unreachable_destination(tmp_path)) as context:
            result = schedule(context)

    assert isinstance(result, SkipReason)
    assert run_id in result.skip_message


@pytest.mark.integration
def test_sync_job_runs_in_process_and_records_the_connector_asset(pipeline):
    pipeline.source(["CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO t VALUES (1, 'x'), (2, 'y')"])
    config = load_config(pipeline.config_path)
    job = build_definitions(config).resolve_job_def(f"sync_{pipeline.name}")

    with DagsterInstance.ephemeral() as instance:
        result = job.execute_in_process(instance=instance)
        materialization = instance.get_latest_materialization_event(AssetKey(["cdc", pipeline.name]))

    assert result.success
    assert materialization is not None and materialization.run_id == result.run_id
    metadata = materialization.asset_materialization.metadata
    assert metadata["snapshot_rows"].value == 2 and metadata["jvm_heap_used"].value > 0
    assert metadata["events"].value >= 2
    assert {"batches", "inserts", "updates", "deletes", "ddls", "transactions", "seconds", "events_per_second",
            "lag_seconds", "jvm_non_heap_used"} <= set(metadata)
    pipeline.assert_same("t")


@pytest.mark.integration
def test_a_second_concurrent_cycle_of_the_same_connector_is_refused(pipeline):
    from cdc_pipeline.ops.cli import main

    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as holder:
        control.acquire_run_lock(holder, pipeline.name)
        exit_code = main(["sync", pipeline.name])
        state = holder.execute("SELECT last_error FROM cdc.connector_state WHERE connector = %s",
                               (pipeline.name,)).fetchall()

    assert exit_code == 1
    assert state == []


def test_the_project_instance_enables_run_retries(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((PROJECT_ROOT / "dagster_home" / "dagster.yaml")
                                       .read_text())
    with DagsterInstance.from_config(str(home)) as instance:
        assert instance.run_retries_enabled and instance.run_retries_max_retries == 0, \
            "retries come from each sync job's dagster/max_retries tag (the connector's run_retries)"
