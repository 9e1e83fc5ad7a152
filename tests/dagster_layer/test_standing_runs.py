"""Standing runs (`standing_run`): a served run the change sensor launched streams on between changes while the run
queue has room (half its max_concurrent_runs), so a change after a quiet spell is applied by a run already streaming;
the change sensor launches one for an idle connector while there is room; a request waiting to be served ends it (a
reload of the mapping rules waits for it rather than being refused), and so does a session waiting for its run lock
(`verify --repair`)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from dagster import DagsterInstance, DagsterRunStatus, SensorResult, build_sensor_context, instance_for_test

from assets.definitions import build_definitions
from cdc_pipeline import control
from cdc_pipeline.config import load_config
from cdc_pipeline.ops import requests
from resources import debezium_runner
from resources.debezium_runner import ENGINE_SERVED, ENGINE_TAG, TRIGGER_TAG, StandingRoom, standing_limit
from resources.destination import DestinationResource
from tests.dagster_layer.test_run_queue_wait import _add_run
from tests.helpers.pipeline_server import running_server


def test_standing_runs_take_half_the_run_queue_and_none_without_a_limit():
    with instance_for_test(overrides={"run_queue": {"max_concurrent_runs": 12}}) as instance:
        assert standing_limit(instance) == 6
    with instance_for_test(overrides={"run_queue": {"max_concurrent_runs": 1}}) as instance:
        assert standing_limit(instance) == 1
    with instance_for_test(overrides={"run_queue": {"max_concurrent_runs": -1}}) as instance:
        assert standing_limit(instance) == 0
    assert standing_limit(DagsterInstance.ephemeral()) == 0  # a run in process: no sensor follows it


def test_a_run_stands_while_the_runs_leave_room_and_the_longest_running_stop_first(monkeypatch):
    monkeypatch.setattr(debezium_runner, "QUEUE_CHECK_SECONDS", 0.0)
    with instance_for_test(overrides={"run_queue": {"max_concurrent_runs": 4}}) as instance:  # room for 2
        _add_run(instance, "alpha", DagsterRunStatus.STARTED)
        assert StandingRoom(instance, "alpha")()
        _add_run(instance, "beta", DagsterRunStatus.STARTED)
        assert StandingRoom(instance, "alpha")() and StandingRoom(instance, "beta")()
        # One run too many (a queued one counts): the longest running stops standing, the other stands on.
        _add_run(instance, "gamma", DagsterRunStatus.QUEUED)
        assert [StandingRoom(instance, name)() for name in ("alpha", "beta")] == [False, True]


BUDGET = 12  # max_seconds_per_run of the standing run's test


def _arrived(pipeline, key: int, deadline: float) -> None:
    ends = time.monotonic() + deadline
    while key not in {row[0] for row in pipeline.dest_rows("items")}:
        assert time.monotonic() < ends, f"row {key} did not arrive within {deadline} s"
        time.sleep(0.05)


def _neighbour_writes(pipeline, seconds: float) -> None:
    """For `seconds`: a MariaDB pipeline's server busy in another database (a commit every 50 ms); else a sleep."""
    if not hasattr(pipeline, "mariadb"):
        time.sleep(seconds)
        return
    neighbour = f"{pipeline.source_db}_neighbour"
    pipeline.mariadb.execute([f"CREATE DATABASE {neighbour}", f"CREATE TABLE {neighbour}.beats (n INT)"])
    with pipeline.mariadb.connect(neighbour) as connection, connection.cursor() as cursor:
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            cursor.execute("INSERT INTO beats VALUES (1)")
            connection.commit()
            time.sleep(0.05)


def _lock_held(pipeline) -> bool:
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        return control.run_lock_held(conn, pipeline.name)


@pytest.mark.integration
def test_a_standing_run_applies_a_change_after_a_quiet_spell_and_ends_for_a_waiting_request(any_source, tmp_path,
                                                                                          monkeypatch):
    pipeline = any_source
    # A budget shorter than the quiet spell: a standing run's counts from its first change, not from its heartbeats
    # (PostgreSQL's are written every second here, half the idle timeout).
    pipeline.write_config(max_seconds_per_run=BUDGET)
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v INT)", "INSERT INTO items VALUES (1, 1)"])
    pipeline.sync()
    config = load_config(pipeline.config_path)
    job = build_definitions(config).resolve_job_def(f"sync_{pipeline.name}")
    outcome: dict = {}
    with running_server(pipeline.env, tmp_path) as server:
        for key, value in server.env.items():
            monkeypatch.setenv(key, value)
        with instance_for_test(overrides={"run_queue": {"max_concurrent_runs": 4}}) as instance:
            def run() -> None:
                outcome["result"] = job.execute_in_process(
                    instance=instance, tags={TRIGGER_TAG: "standing: test", ENGINE_TAG: ENGINE_SERVED})
                outcome["ended"] = time.monotonic()

            runner = threading.Thread(target=run)
            runner.start()
            deadline = time.monotonic() + 120
            while not _lock_held(pipeline):
                assert time.monotonic() < deadline and runner.is_alive(), "the standing run did not start its cycle"
                time.sleep(0.2)
            # Quiet well past the idle timeout (2 s) and the budget: a run that found nothing would have ended.
            # MariaDB: another database of the server busy meanwhile (its binlog events bring the run heartbeats).
            _neighbour_writes(pipeline, BUDGET + 4)
            assert _lock_held(pipeline), "the standing run ended while the source was quiet"
            pipeline.source("INSERT INTO items VALUES (2, 2)")
            committed = time.monotonic()
            _arrived(pipeline, 2, deadline=15)
            applied_in = time.monotonic() - committed
            assert _lock_held(pipeline), "the standing run ended after one change"

            if hasattr(pipeline, "mariadb"):
                # A reload of the mapping rules waits for the running cycle (pending, with why), which ends for it.
                with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
                    requests.submit_request(conn, "cdc", pipeline.name, requests.RELOAD_OBJMAP)
                    [waiting] = requests.serve_pending_requests(conn, "cdc", config)
                    asked = time.monotonic()
                runner.join(timeout=60)
                assert not runner.is_alive(), "the standing run did not end for the waiting request"
                with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
                    [served] = requests.serve_pending_requests(conn, "cdc", config)
                assert waiting.status == requests.PENDING
                assert "waits for the connector's running fetch cycle" in waiting.reason
                assert served.status == requests.DONE, served.reason
            else:
                # A session waiting for the run lock (what `verify --repair` does) has it once the run ended for it.
                with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
                    asked = time.monotonic()
                    control.wait_for_run_lock(conn, pipeline.name, 60)
                    assert control.run_lock_holder(conn, pipeline.name) == conn.info.backend_pid
                    control.release_run_lock(conn, pipeline.name)
                runner.join(timeout=60)

    assert outcome["result"].success
    # Sooner than its budget after the change would have ended it.
    assert outcome["ended"] - asked < BUDGET - 2, f"the run stood {outcome['ended'] - asked:.0f} s after the request"
    assert applied_in < 5, f"the change took {applied_in:.1f} s to a run already streaming"
    pipeline.assert_same("items")


@pytest.mark.integration
def test_the_change_sensor_launches_a_standing_run_for_an_idle_served_connector_while_there_is_room(
        pipeline, tmp_path, monkeypatch):
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v INT)", "INSERT INTO items VALUES (1, 1)"])
    pipeline.sync()

    def launched(instance, **overrides) -> list:
        pipeline.write_config(**overrides)
        config = load_config(pipeline.config_path)
        sensor = build_definitions(config).resolve_sensor_def(f"sync_{pipeline.name}_on_changes")
        with build_sensor_context(instance=instance, resources={
                "destination": DestinationResource(config_path=str(config.path))}) as context:
            result = sensor(context)
        return list(result.run_requests or []) if isinstance(result, SensorResult) else []

    with instance_for_test(overrides={"run_queue": {"max_concurrent_runs": 2}}) as instance:  # room for 1
        # No server (the tests' environment starts none for the runs): a standing run would hold a JVM of its own.
        assert not launched(instance)
        with running_server(pipeline.env, tmp_path) as server:
            for key, value in server.env.items():
                monkeypatch.setenv(key, value)
            [request] = launched(instance)
            assert not launched(instance, standing_run=False)
            _add_run(instance, "other", DagsterRunStatus.STARTED)
            assert not launched(instance), "a standing run was launched with no room left in the run queue"
    assert request.tags[TRIGGER_TAG].startswith("standing: ") and request.tags[ENGINE_TAG] == ENGINE_SERVED
