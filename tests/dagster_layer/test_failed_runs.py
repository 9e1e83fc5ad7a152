"""What the change sensor does after failed runs and failed checks, against a real destination: under
error_strategy exit the connector stays stopped until a resume; under retry and skip runs back off (the check
interval, doubling, capped), the count and next attempt in the state; a success or a resume ends it; the
run-failure sensor counts a failure its session did not record, once."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
import yaml
from dagster import RunRequest, SensorResult, SkipReason, build_sensor_context, instance_for_test

from assets.definitions import build_definitions
from cdc_pipeline import control
from cdc_pipeline.config import ConnectorConfig, load_config
from cdc_pipeline.ops import requests
from resources.destination import DestinationResource

pytestmark = pytest.mark.integration


@pytest.fixture
def connectors_file(destination_pg, tmp_path, monkeypatch):
    """A connectors file of one MariaDB connector whose source does not answer, its destination real."""
    dbname = f"failed_{uuid.uuid4().hex[:8]}"
    destination_pg.create_database(dbname)
    path = tmp_path / "connectors.yaml"

    def write(**fields):
        connector = {"type": "mariadb", "hostname": "127.0.0.1", "port": 9, "user": "u", "password": "p",
                     "database": "shop", "check_interval_seconds": 15, **fields}
        path.write_text(yaml.safe_dump({"destination": {"dsn": destination_pg.dsn(dbname)},
                                        "connectors": {"shop": connector}}))
        monkeypatch.setenv("CDC_PIPELINE_CONFIG", str(path))
        return load_config(path)

    write.dsn = destination_pg.dsn(dbname)
    return write


def _evaluate(config, cursor=None):
    sensor = build_definitions(config).resolve_sensor_def("sync_shop_on_changes")
    with instance_for_test() as instance:
        with build_sensor_context(instance=instance, cursor=cursor, resources={
                "destination": DestinationResource(config_path=str(config.path))}) as context:
            return sensor(context)


def _launched(result) -> bool:
    if isinstance(result, SensorResult):
        return bool(result.run_requests)
    return isinstance(result, RunRequest)


def _skip_message(result) -> str:
    if isinstance(result, SensorResult):
        assert not result.run_requests
        return result.skip_reason.skip_message
    assert isinstance(result, SkipReason), result
    return result.skip_message


def _fail(config, error="applying batch 3 failed: qty_limit"):
    """What a failed run's session records."""
    with config.destination.connect() as conn:
        control.ensure_control_schema(conn, "cdc")
        control.set_state(conn, "cdc", "shop", "mariadb", control.STOPPED, last_error=error)
        return control.record_failure(conn, "cdc", config.connector("shop"), error)


def _state(config) -> dict:
    with config.destination.connect() as conn:
        return control.read_state(conn, "cdc", "shop")


def test_failed_runs_back_off_by_doubling_up_to_the_cap():
    connector = ConnectorConfig(name="shop", type="mariadb", hostname="h", user="u", password="p", database="shop",
                                error_strategy="retry", check_interval_seconds=15)
    assert [control.backoff_seconds(connector, n) for n in range(1, 10)] == [
        15, 30, 60, 120, 240, 480, 960, 1800, 1800]
    assert control.failure_backoff(connector, 3) == 60
    exiting = ConnectorConfig(name="shop", type="mariadb", hostname="h", user="u", password="p", database="shop")
    assert control.failure_backoff(exiting, 1) is None


def test_under_retry_a_failed_connector_waits_its_backoff_and_a_success_ends_it(connectors_file):
    config = connectors_file(error_strategy="retry")
    assert _fail(config) == 1
    state = _state(config)
    assert state["state"] == "stopped" and state["failures"] == 1
    assert timedelta(seconds=10) < state["next_attempt_at"] - state["last_failed_at"] <= timedelta(seconds=15)
    message = _skip_message(_evaluate(config))
    assert "failed 1 run(s) in a row" in message and "qty_limit" in message and "next attempt at" in message

    assert _fail(config) == 2
    state = _state(config)
    assert timedelta(seconds=25) < state["next_attempt_at"] - state["last_failed_at"] <= timedelta(seconds=30)
    assert "failed 2 run(s) in a row" in _skip_message(_evaluate(config))

    # The backoff passed: the sensor checks again (the source does not answer here: that launches a run).
    with psycopg.connect(connectors_file.dsn, autocommit=True) as conn:
        conn.execute("UPDATE cdc.connector_state SET next_attempt_at = now() - interval '1 second'")
    assert _launched(_evaluate(config))

    with psycopg.connect(connectors_file.dsn, autocommit=True) as conn:
        control.clear_failures(conn, "cdc", "shop")
    assert _state(config)["failures"] == 0 and _state(config)["next_attempt_at"] is None


def test_under_exit_a_failed_connector_stays_stopped_until_resumed(connectors_file):
    config = connectors_file(error_strategy="exit")
    _fail(config)
    state = _state(config)
    assert state["next_attempt_at"] is None
    for _ in range(2):
        message = _skip_message(_evaluate(config))
        assert "stopped after a failed run" in message and "qty_limit" in message
        assert "cdc-pipeline resume shop" in message

    with psycopg.connect(connectors_file.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO cdc.requests (connector, kind) VALUES ('shop', 'resume')")
        (outcome,) = requests.serve_pending_requests(conn, "cdc", config)
    assert outcome.status == requests.DONE and outcome.launch_run
    state = _state(config)
    assert state["state"] == "syncing" and state["failures"] == 0
    assert _launched(_evaluate(config)), "resumed: the sensor checks again"


def test_a_failed_check_launches_one_run_then_backs_off(tmp_path, monkeypatch):
    path = tmp_path / "connectors.yaml"
    path.write_text(yaml.safe_dump({"destination": {"dsn": "postgresql://u@127.0.0.1:9/d"}, "connectors": {
        "shop": {"type": "mariadb", "hostname": "h", "user": "u", "password": "p", "database": "shop",
                 "check_interval_seconds": 15}}}))
    config = load_config(path)
    started = time.time()
    first = _evaluate(config)
    ended = time.time()
    assert isinstance(first, SensorResult) and len(first.run_requests) == 1
    cursor = json.loads(first.cursor)
    assert cursor["failed_checks"] == 1 and started + 15 <= cursor["retry_at"] <= ended + 15

    second = _evaluate(config, cursor=first.cursor)
    assert "failed 2 times in a row" in _skip_message(second) and "next run at" in _skip_message(second)
    assert json.loads(second.cursor)["retry_at"] == cursor["retry_at"]

    due = json.dumps({"failed_checks": 2, "retry_at": time.time() - 1})
    started = time.time()
    third = _evaluate(config, cursor=due)
    ended = time.time()
    assert len(third.run_requests) == 1
    assert started + 60 <= json.loads(third.cursor)["retry_at"] <= ended + 60, "the third failure in a row: 60 s"
