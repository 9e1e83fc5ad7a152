"""`cdc_changes` and `cdc_verify_after_loads`: with more connectors whose trigger is `changes` than ONE_SENSOR_BEYOND_CONNECTORS, one sensor
checks them all, each as its own sensor would (its cursor holds each connector's), the due checks at once. The
destination here does not answer (refused, or a listener that never replies): a failed check launches a run, as
the connector's own sensor does, so a run request tells that a connector was checked."""

from __future__ import annotations

import json
import socket
import time
import uuid

import pytest
import yaml
from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    SensorResult,
    build_sensor_context,
    instance_for_test,
    job,
    op,
)
from dagster._core.test_utils import create_run_for_test

from assets import change_sensor
from assets.change_sensor import CHANGES_SENSOR_NAME, ONE_SENSOR_BEYOND_CONNECTORS
from assets.definitions import build_definitions
from assets.verify_checks import build_after_loads_sensor
from cdc_pipeline.config import load_config
from resources.destination import DestinationResource

INTERVAL = 15
MANY = ONE_SENSOR_BEYOND_CONNECTORS + 1


def _config(tmp_path, connectors: int, dsn: str = "postgresql://u@127.0.0.1:9/d", scheduled: int = 0):
    path = tmp_path / "connectors.yaml"
    entries = {f"t{n}": {"type": "mariadb", "hostname": "h", "user": "u", "password": "p", "database": f"t{n}",
                         "check_interval_seconds": INTERVAL} for n in range(connectors)}
    for n in range(scheduled):
        entries[f"s{n}"] = {"type": "mariadb", "hostname": "h", "user": "u", "password": "p", "database": f"s{n}",
                            "trigger": "schedule", "schedule": "*/5 * * * *"}
    path.write_text(yaml.safe_dump({"destination": {"dsn": dsn}, "connectors": entries}))
    return load_config(path)


def _evaluate(config, instance, cursor, sensor=None):
    sensor = sensor or build_definitions(config).resolve_sensor_def(CHANGES_SENSOR_NAME)
    with build_sensor_context(instance=instance, cursor=cursor, resources={
            "destination": DestinationResource(config_path=str(config.path))}) as context:
        result = sensor(context)
    assert isinstance(result, SensorResult), result
    return result


def _launched(result) -> set[str]:
    return {request.job_name for request in result.run_requests or []}


def _cursor(**connectors) -> str:
    return json.dumps({"connectors": connectors})


def test_many_connectors_have_one_change_sensor_and_few_one_each(tmp_path):
    few = build_definitions(_config(tmp_path, ONE_SENSOR_BEYOND_CONNECTORS))
    assert {sensor.name for sensor in few.sensors if sensor.name.endswith("_on_changes")} == {
        f"sync_t{n}_on_changes" for n in range(ONE_SENSOR_BEYOND_CONNECTORS)}
    assert CHANGES_SENSOR_NAME not in {sensor.name for sensor in few.sensors}

    many = build_definitions(_config(tmp_path, MANY, scheduled=1))
    sensor = many.resolve_sensor_def(CHANGES_SENSOR_NAME)
    assert sensor.default_status == DefaultSensorStatus.RUNNING
    assert {target.job_name for target in sensor.targets} == {f"sync_t{n}" for n in range(MANY)}
    assert sensor.minimum_interval_seconds == change_sensor.RUN_END_POLL_SECONDS
    # A connector on a schedule keeps its own sensor, stopped, to be switched on in the UI.
    own = {sensor.name: sensor.default_status for sensor in many.sensors if sensor.name.endswith("_on_changes")}
    assert own == {"sync_s0_on_changes": DefaultSensorStatus.STOPPED}


def test_each_connector_is_checked_when_due_and_its_failed_checks_back_off(tmp_path):
    config = _config(tmp_path, MANY)
    with instance_for_test() as instance:
        first = _evaluate(config, instance, None)
        # Nothing checked yet: every connector is checked, and the first failed check of each launches its run.
        assert _launched(first) == {f"sync_t{n}" for n in range(MANY)}
        assert all(request.tags["cdc/trigger"].startswith("the check failed: ") for request in first.run_requests)
        stored = json.loads(first.cursor)["connectors"]
        assert {name: state["failed_checks"] for name, state in stored.items()} == {f"t{n}": 1 for n in range(MANY)}

        # The next pass: each backs off (no run), and says when its next run is.
        backing = _evaluate(config, instance, first.cursor)
        assert not backing.run_requests
        assert "the check of connector t0 failed 2 times in a row" in backing.skip_reason.skip_message
        assert {state["failed_checks"] for state in json.loads(backing.cursor)["connectors"].values()} == {2}

        # Connectors checked a moment ago wait for their interval; one checked long ago is due now; one whose run
        # is in progress is not checked; one whose run ended since its check is checked at once.
        now = time.time()
        recent = {"checked_at": now - 2}
        create_run_for_test(instance, job_name="sync_t1", status=DagsterRunStatus.STARTED)
        create_run_for_test(instance, job_name="sync_t2", status=DagsterRunStatus.SUCCESS)
        cursor = _cursor(t0={"checked_at": now - INTERVAL - 1}, t1=recent, t2=recent,
                         **{f"t{n}": recent for n in range(3, MANY)})
        mixed = _evaluate(config, instance, cursor)
        assert _launched(mixed) == {"sync_t0", "sync_t2"}
        stored = json.loads(mixed.cursor)["connectors"]
        assert stored["t1"] == recent and stored["t3"] == recent, "not checked: their cursor is kept"
        assert stored["t0"]["failed_checks"] == 1 and stored["t2"]["failed_checks"] == 1

        quiet = _evaluate(config, instance, _cursor(**{f"t{n}": {"checked_at": time.time()} for n in range(MANY)}))
        assert not quiet.run_requests
        message = quiet.skip_reason.skip_message
        assert "run " in message and "of sync_t1 is still started" in message
        assert "next change check of connector t0 in 15 s" in message


def test_the_checks_of_one_pass_run_at_once_and_one_that_hangs_counts_as_failed(tmp_path, monkeypatch):
    # A destination that accepts connections and never answers: each check hangs until the pass gives up on it.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        config = _config(tmp_path, MANY, dsn=f"postgresql://u@127.0.0.1:{silent.getsockname()[1]}/d")
        monkeypatch.setattr(change_sensor, "CHECK_TIMEOUT_SECONDS", 2.0)
        sensor = build_definitions(config).resolve_sensor_def(CHANGES_SENSOR_NAME)
        with instance_for_test() as instance:
            started = time.monotonic()
            result = _evaluate(config, instance, None, sensor)
            took = time.monotonic() - started
        assert _launched(result) == {f"sync_t{n}" for n in range(MANY)}
        assert all("did not answer within 2 s" in request.tags["cdc/trigger"] for request in result.run_requests)
        # One after another they would take MANY times the timeout.
        assert took < 2.0 * 2, took

        # The next pass does not check them again before their backoff (after a first failure, their check
        # interval) has passed: a source that hangs does not hold every pass.
        with instance_for_test() as instance:
            started = time.monotonic()
            waiting = _evaluate(config, instance, result.cursor, sensor)
            assert time.monotonic() - started < 1.0
        assert not waiting.run_requests
        assert "the check of connector t0 did not answer within 2 s 1 times in a row; checked again at " \
            in waiting.skip_reason.skip_message
        assert json.loads(waiting.cursor) == json.loads(result.cursor)


@pytest.mark.integration
def test_one_sensor_verifies_each_connector_once_per_reconciled_load(destination_pg, tmp_path):
    dbname = f"verify_{uuid.uuid4().hex[:8]}"
    destination_pg.create_database(dbname)
    config = _config(tmp_path, MANY, dsn=destination_pg.dsn(dbname))
    verified = [(connector, _verify_job(connector.name)) for connector in config.connectors.values()]
    sensor = build_after_loads_sensor(verified)
    destination = DestinationResource(config_path=str(config.path))
    with destination.connect() as conn:  # the control schema, with the loads of t0 and t1 reconciled, t2's not
        conn.execute("INSERT INTO cdc.bulk_loads (connector, load_id, reconciled_at) VALUES "
                     "('t0', 7, now()), ('t1', 3, now()), ('t2', 4, NULL)")

    def evaluate(cursor):
        with build_sensor_context(cursor=cursor, resources={"destination": destination}) as context:
            return sensor(context)

    first = evaluate(None)
    assert {(request.job_name, request.run_key) for request in first.run_requests} == {
        ("verify_t0", "verify-t0-load-7"), ("verify_t1", "verify-t1-load-3")}
    again = evaluate(first.cursor)
    assert not again.run_requests and "no bulk load of its 5 connectors reconciled" in again.skip_reason.skip_message
    with destination.connect() as conn:  # t0 loaded again, t2's load reconciled
        conn.execute("UPDATE cdc.bulk_loads SET load_id = 8 WHERE connector = 't0'")
        conn.execute("UPDATE cdc.bulk_loads SET reconciled_at = now() WHERE connector = 't2'")
    assert {request.run_key for request in evaluate(again.cursor or first.cursor).run_requests} == {
        "verify-t0-load-8", "verify-t2-load-4"}


def _verify_job(name: str):
    @op
    def verified():
        pass

    @job(name=f"verify_{name}")
    def verify():
        verified()

    return verify
