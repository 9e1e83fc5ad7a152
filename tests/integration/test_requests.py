"""State-change requests against a real destination PostgreSQL: each request's accepted and rejected paths, the
one-pending rule (from psql too), the request sensor, the schedule's skip while paused, the CLI and the control
job. No engine runs here; tests/integration/test_control_replication.py runs cycles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
import yaml
from dagster import RunRequest, SkipReason, build_schedule_context, build_sensor_context, instance_for_test

from assets.control_job import control_job
from assets.definitions import build_definitions
from assets.request_sensor import build_request_sensor
from assets.schedules import build_sync_schedule
from cdc_pipeline import control
from cdc_pipeline.decode import offsets
from cdc_pipeline.ops import requests
from cdc_pipeline.config import load_config
from resources.destination import DestinationResource
from tests.helpers import PROJECT_ROOT

pytestmark = pytest.mark.integration

OFFSET = {"file": "mariadb-bin.000001", "pos": 4512, "row": 1, "event": 2, "gtids": "0-1-10"}


class Control:
    """A destination database with the control schema, a connectors file naming one MariaDB connector."""

    def __init__(self, dsn: str, path: Path, name: str) -> None:
        self.dsn, self.path, self.name = dsn, path, name
        self.write_config()
        self.config = load_config(path)
        self.conn = psycopg.connect(dsn, autocommit=True)
        control.ensure_control_schema(self.conn, "cdc")

    def write_config(self, **overrides) -> None:
        connector = {"type": "mariadb", "hostname": "127.0.0.1", "user": "u", "password": "p", "database": "shop",
                     **overrides}
        self.path.write_text(yaml.safe_dump({"destination": {"dsn": self.dsn},
                                             "connectors": {self.name: connector}}))

    def ask(self, kind: str, argument: str | None = None) -> requests.Outcome:
        request_id = requests.submit_request(self.conn, "cdc", self.name, kind, argument)
        [outcome] = requests.serve_pending_requests(self.conn, "cdc", self.config)
        assert outcome.request.id == request_id
        stored = requests.read_request(self.conn, "cdc", request_id)
        assert (stored.status, stored.reason) == (outcome.status, outcome.reason), "the outcome is recorded"
        assert stored.served_at is not None
        return outcome

    def state(self) -> str | None:
        row = control.read_state(self.conn, "cdc", self.name)
        return row["state"] if row else None

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """`cdc-pipeline ARGS` in a new process."""
        return subprocess.run([sys.executable, "-m", "cdc_pipeline.ops.cli", "--config", str(self.path), *args],
                              cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "DAGSTER_HOME": str(self.path.parent)})


@pytest.fixture
def ctl(destination_pg, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    destination_pg.create_database(f"ctl_{suffix}")
    control_db = Control(destination_pg.dsn(f"ctl_{suffix}"), tmp_path / "connectors.yaml", f"c_{suffix}")
    yield control_db
    control_db.conn.close()


def _accepted(outcome: requests.Outcome) -> str:
    assert outcome.status == requests.DONE, outcome.reason
    return outcome.reason


def _rejected(outcome: requests.Outcome) -> str:
    assert outcome.status == requests.REJECTED, f"accepted: {outcome.reason}"
    return outcome.reason


def test_pause_from_a_running_connector_and_not_twice(ctl):
    control.set_state(ctl.conn, "cdc", ctl.name, "mariadb", control.SYNCING)

    _accepted(ctl.ask(requests.PAUSE))
    assert ctl.state() == control.PAUSED
    assert "already paused" in _rejected(ctl.ask(requests.PAUSE))
    assert ctl.state() == control.PAUSED


def test_resume_only_a_paused_or_stopped_connector_and_it_needs_a_run(ctl):
    assert "only a paused or stopped connector resumes; it is never run" in _rejected(ctl.ask(requests.RESUME))
    control.set_state(ctl.conn, "cdc", ctl.name, "mariadb", control.SYNCING)
    assert "it is syncing" in _rejected(ctl.ask(requests.RESUME))

    _accepted(ctl.ask(requests.PAUSE))
    outcome = ctl.ask(requests.RESUME)

    _accepted(outcome)
    assert outcome.launch_run
    assert ctl.state() == control.SYNCING


def test_set_offset_only_while_paused_with_a_valid_offset(ctl):
    control.set_state(ctl.conn, "cdc", ctl.name, "mariadb", control.SYNCING)
    assert "only while the connector is paused" in _rejected(ctl.ask(requests.SET_OFFSET, json.dumps(OFFSET)))
    _accepted(ctl.ask(requests.PAUSE))
    assert "lacks pos" in _rejected(ctl.ask(requests.SET_OFFSET, '{"file": "mariadb-bin.000001"}'))
    assert "has not: lsn" in _rejected(ctl.ask(requests.SET_OFFSET, '{"file": "f.1", "pos": 4, "lsn": 5}'))
    assert "not JSON" in _rejected(ctl.ask(requests.SET_OFFSET, "file=f.1"))
    assert "needs the offset" in _rejected(ctl.ask(requests.SET_OFFSET))
    assert ctl.conn.execute("SELECT count(*) FROM cdc.debezium_offsets").fetchone()[0] == 0

    outcome = ctl.ask(requests.SET_OFFSET, json.dumps(OFFSET))

    assert "paused -> offset update -> paused" in _accepted(outcome)
    assert not outcome.launch_run
    assert ctl.state() == control.PAUSED
    [(key, value)] = ctl.conn.execute("SELECT offset_key, offset_value FROM cdc.debezium_offsets WHERE connector = %s",
                                      (ctl.name,)).fetchall()
    assert json.loads(key) == [ctl.name, {"server": ctl.name}] and json.loads(value) == OFFSET
    assert control.read_applied_offset(ctl.conn, "cdc", ctl.name) == OFFSET, "events after the offset apply again"


def test_set_offset_waits_for_the_running_cycle_to_end(ctl):
    control.set_state(ctl.conn, "cdc", ctl.name, "mariadb", control.PAUSED)
    with psycopg.connect(ctl.dsn, autocommit=True) as cycle:
        control.acquire_run_lock(cycle, ctl.name)
        assert "still running" in _rejected(ctl.ask(requests.SET_OFFSET, json.dumps(OFFSET)))
        # Released explicitly: a closed connection's backend frees its locks only when it has exited, later.
        control.release_run_lock(cycle, ctl.name)
    _accepted(ctl.ask(requests.SET_OFFSET, json.dumps(OFFSET)))


def test_restart_with_a_snapshot_mode(ctl):
    control.set_state(ctl.conn, "cdc", ctl.name, "mariadb", control.SYNCING)
    assert "one of: initial, initial_only" in _rejected(ctl.ask(requests.RESTART, "everything"))

    outcome = ctl.ask(requests.RESTART, "always")

    _accepted(outcome)
    assert outcome.launch_run
    state = control.read_state(ctl.conn, "cdc", ctl.name)
    assert (state["state"], state["next_snapshot_mode"]) == (control.RESTARTING, "always")
    _accepted(ctl.ask(requests.PAUSE))
    assert "resume it first" in _rejected(ctl.ask(requests.RESTART, "initial"))


def test_schemasync_restart_is_for_a_connector_without_an_offset(ctl):
    _accepted(ctl.ask(requests.RESTART, "schemasync"))
    control.set_state(ctl.conn, "cdc", ctl.name, "mariadb", control.SYNCING)
    offsets.move_offset(ctl.conn, "cdc", ctl.name, "mariadb", "shop", OFFSET)

    assert "has an offset" in _rejected(ctl.ask(requests.RESTART, "schemasync"))


def test_reload_objmap_rereads_the_connectors_file(ctl):
    assert "mapping rules applied to the destination" in _accepted(ctl.ask(requests.RELOAD_OBJMAP))
    ctl.write_config(snapshot_mode="sometimes")

    assert "snapshot_mode" in _rejected(ctl.ask(requests.RELOAD_OBJMAP))


def test_a_request_from_psql_with_an_unknown_kind_or_connector_is_rejected_with_its_reason(ctl):
    ctl.conn.execute("INSERT INTO cdc.requests (connector, kind) VALUES (%s, 'explode')", (ctl.name,))
    [outcome] = requests.serve_pending_requests(ctl.conn, "cdc", ctl.config)
    assert "unknown request kind 'explode'" in _rejected(outcome)

    ctl.conn.execute("INSERT INTO cdc.requests (connector, kind) VALUES ('nobody', 'pause')")
    [outcome] = requests.serve_pending_requests(ctl.conn, "cdc", ctl.config)
    assert "no connector 'nobody'" in _rejected(outcome)


def test_one_pending_request_per_connector_also_from_psql(ctl):
    first = requests.submit_request(ctl.conn, "cdc", ctl.name, requests.PAUSE)

    with pytest.raises(requests.RequestError, match=f"request {first} \\(pause\\) is still pending"):
        requests.submit_request(ctl.conn, "cdc", ctl.name, requests.RESUME)
    with pytest.raises(psycopg.errors.UniqueViolation):
        ctl.conn.execute("INSERT INTO cdc.requests (connector, kind) VALUES (%s, 'resume')", (ctl.name,))
    requests.serve_pending_requests(ctl.conn, "cdc", ctl.config)
    requests.submit_request(ctl.conn, "cdc", ctl.name, requests.RESUME)


def test_sensor_serves_requests_and_launches_the_runs_they_need(ctl):
    resources = {"destination": DestinationResource(config_path=str(ctl.path))}
    sensor = build_request_sensor(str(ctl.path), [build_definitions(ctl.config).resolve_job_def(f"sync_{ctl.name}")])
    with instance_for_test() as instance:
        def evaluate(cursor=None):
            with build_sensor_context(instance=instance, resources=resources, cursor=cursor) as context:
                return sensor(context)

        assert isinstance(evaluate(), SkipReason)

        paused_id = requests.submit_request(ctl.conn, "cdc", ctl.name, requests.PAUSE)
        result = evaluate("0")  # a cursor of an earlier version: the id alone
        assert result.run_requests == [] and json.loads(result.cursor) == {"served": paused_id, "owed": {}}

        resumed_id = requests.submit_request(ctl.conn, "cdc", ctl.name, requests.RESUME)
        result = evaluate(result.cursor)

    [run] = result.run_requests
    assert (run.job_name, run.run_key) == (f"sync_{ctl.name}", f"request-{resumed_id}")
    assert run.tags["cdc/request"] == str(resumed_id)
    assert json.loads(result.cursor) == {"served": resumed_id, "owed": {}}
    assert ctl.state() == control.SYNCING


def test_a_request_while_a_run_lingers_launches_its_run_once_that_one_ended(ctl):
    """A run that lingers (or any cycle: a `cdc-pipeline sync`) holds the connector's run lock; a run launched then
    would be refused, and count as a failed run (under `exit` the connector would be held stopped)."""
    resources = {"destination": DestinationResource(config_path=str(ctl.path))}
    sensor = build_request_sensor(str(ctl.path), [build_definitions(ctl.config).resolve_job_def(f"sync_{ctl.name}")])
    lingering = psycopg.connect(ctl.dsn, autocommit=True)
    control.acquire_run_lock(lingering, ctl.name)
    with instance_for_test() as instance:
        def evaluate(cursor=None):
            with build_sensor_context(instance=instance, resources=resources, cursor=cursor) as context:
                return sensor(context)

        restart_id = requests.submit_request(ctl.conn, "cdc", ctl.name, requests.RESTART, "always")
        waiting = evaluate()
        assert waiting.run_requests == [], "no run is launched while the connector's run holds its lock"
        assert f"request {restart_id} launches sync_{ctl.name} once it ends" in waiting.skip_reason.skip_message
        assert ctl.state() == control.RESTARTING and requests.read_request(ctl.conn, "cdc", restart_id).status == \
            requests.DONE
        assert evaluate(waiting.cursor).run_requests == [], "still running"

        lingering.close()  # the run ends
        result = evaluate(waiting.cursor)
        [run] = result.run_requests
        assert (run.job_name, run.run_key) == (f"sync_{ctl.name}", f"request-{restart_id}")
        assert isinstance(evaluate(result.cursor), SkipReason), "launched once"


def test_schedule_skips_while_the_connector_is_paused(ctl):
    resources = {"destination": DestinationResource(config_path=str(ctl.path))}
    connector = ctl.config.connector(ctl.name)
    schedule = build_sync_schedule(connector, build_definitions(ctl.config).resolve_job_def(f"sync_{ctl.name}"),
                                   str(ctl.path))
    with instance_for_test() as instance:
        def evaluate():
            with build_schedule_context(instance=instance, resources=resources) as context:
                return schedule(context)

        assert isinstance(evaluate(), RunRequest)
        _accepted(ctl.ask(requests.PAUSE))
        skipped = evaluate()

    assert isinstance(skipped, SkipReason)
    assert f"connector {ctl.name} is paused" in skipped.skip_message


def test_cli_requests_are_served_and_pause_persists_across_processes(ctl):
    control.set_state(ctl.conn, "cdc", ctl.name, "mariadb", control.SYNCING)

    submitted = ctl.cli("pause", ctl.name)
    assert submitted.returncode == 0, submitted.stderr
    assert "pending" in submitted.stdout
    refused = ctl.cli("resume", ctl.name)
    assert refused.returncode == 2 and "still pending" in refused.stderr
    served = ctl.cli("requests", ctl.name, "--serve")
    assert "pause" in served.stdout and "done" in served.stdout

    state = ctl.cli("state", ctl.name, "--json")
    assert json.loads(state.stdout)[0]["state"] == "paused"
    offset = ctl.cli("set-offset", ctl.name, '{"file": "mariadb-bin.000002"}')
    assert offset.returncode == 0 and "pending" in offset.stdout
    listed = json.loads(ctl.cli("requests", ctl.name, "--serve", "--json").stdout)
    assert [(row["kind"], row["status"]) for row in listed] == [("pause", "done"), ("set_offset", "rejected")]
    assert "lacks pos" in listed[1]["reason"]


def test_control_job_submits_a_typed_request(ctl):
    run_config = {"ops": {"submit_request": {"config": {"connector": ctl.name, "kind": "restart",
                                                        "argument": "always"}}}}
    result = control_job.execute_in_process(
        run_config=run_config, resources={"destination": DestinationResource(config_path=str(ctl.path))})

    assert result.success
    [request] = requests.read_requests(ctl.conn, "cdc", ctl.name)
    assert (request.id, request.kind, request.argument, request.status) == (
        result.output_for_node("submit_request"), "restart", "always", "pending")


def test_a_sync_serves_its_connectors_pending_requests_from_psql_too(ctl):
    """What `cdc-pipeline sync NAME` does before its cycle (`cli.serve_requests_of`): its own connector's pending
    requests are served under the sensor's rules, whoever submitted them; another connector's wait."""
    from cdc_pipeline.ops import cli

    ctl.conn.execute("INSERT INTO cdc.requests (connector, kind, argument) VALUES (%s, 'restart', 'always')",
                     (ctl.name,))
    other = requests.submit_request(ctl.conn, "cdc", "other", requests.PAUSE)

    [served] = cli.serve_requests_of(ctl.config, ctl.name)["requests_served"]

    assert (served["kind"], served["argument"], served["status"]) == ("restart", "always", requests.DONE)
    assert ctl.state() == control.RESTARTING
    assert requests.read_request(ctl.conn, "cdc", other).status == requests.PENDING
    assert cli.serve_requests_of(ctl.config, ctl.name) == {}, "nothing pending: nothing in the summary"


def test_a_sync_on_a_destination_without_a_control_schema_serves_nothing(destination_pg, tmp_path):
    from cdc_pipeline.ops import cli

    name = f"fresh_{uuid.uuid4().hex[:8]}"
    destination_pg.create_database(name)
    path = tmp_path / "connectors.yaml"
    path.write_text(yaml.safe_dump({"destination": {"dsn": destination_pg.dsn(name)}, "connectors": {name: {
        "type": "mariadb", "hostname": "127.0.0.1", "user": "u", "password": "p", "database": "shop"}}}))
    assert cli.serve_requests_of(load_config(path), name) == {}
