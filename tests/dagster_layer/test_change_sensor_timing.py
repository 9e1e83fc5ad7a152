"""When the change sensor checks the source: every check_interval_seconds after the last check that answered, and at
once when a run of its connector ended since (a run that ended on its budget may leave work waiting). Between the
two it skips without a query of the source or the destination (both are unreachable here: a check would launch a
run, as a failed check does)."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from dagster import DagsterRunStatus, SensorResult, SkipReason, build_sensor_context, instance_for_test
from dagster._core.test_utils import create_run_for_test

from assets.definitions import build_definitions
from cdc_pipeline.config import load_config
from resources.destination import DestinationResource

INTERVAL = 15


@pytest.fixture
def sensor_and_config(tmp_path):
    path = tmp_path / "connectors.yaml"
    path.write_text(yaml.safe_dump({"destination": {"dsn": "postgresql://u@127.0.0.1:9/d"}, "connectors": {
        "shop": {"type": "mariadb", "hostname": "h", "user": "u", "password": "p", "database": "shop",
                 "check_interval_seconds": INTERVAL}}}))
    config = load_config(path)
    return build_definitions(config).resolve_sensor_def("sync_shop_on_changes"), config


def _evaluate(sensor, config, instance, cursor):
    with build_sensor_context(instance=instance, cursor=cursor, resources={
            "destination": DestinationResource(config_path=str(config.path))}) as context:
        return sensor(context)


def _checked(result) -> bool:
    """Whether the evaluation checked (the unreachable destination makes a check launch a run)."""
    return isinstance(result, SensorResult) and bool(result.run_requests)


def test_the_sensor_is_evaluated_at_every_daemon_pass_and_checks_every_interval(sensor_and_config):
    sensor, config = sensor_and_config
    assert sensor.minimum_interval_seconds == 4, "below the daemon's 5 s between passes"
    with instance_for_test() as instance:
        waiting = _evaluate(sensor, config, instance, json.dumps({"checked_at": time.time() - 2}))
        assert isinstance(waiting, SkipReason), waiting
        assert "next change check of connector shop in 13 s" in waiting.skip_message
        assert _checked(_evaluate(sensor, config, instance, json.dumps({"checked_at": time.time() - INTERVAL + 0.5}))), \
            "due within a second: checked at this pass"
        assert _checked(_evaluate(sensor, config, instance, json.dumps({"checked_at": time.time() - INTERVAL - 1})))
        assert _checked(_evaluate(sensor, config, instance, None)), "no check yet: it checks"


def test_a_run_that_ended_since_the_last_check_brings_the_next_check_at_once(sensor_and_config):
    sensor, config = sensor_and_config
    with instance_for_test() as instance:
        cursor = json.dumps({"checked_at": time.time() - 1})
        create_run_for_test(instance, job_name="sync_other", status=DagsterRunStatus.SUCCESS)
        assert isinstance(_evaluate(sensor, config, instance, cursor), SkipReason), "another job's run: no check"
        create_run_for_test(instance, job_name="sync_shop", status=DagsterRunStatus.SUCCESS)
        assert _checked(_evaluate(sensor, config, instance, cursor))
