"""`cdc-pipeline serve`: `sync` processes whose environment names the server run their cycles in its warm driver
JVM, exactly as cold ones; a client killed during its cycle ends it as a pause does, and the next sync goes on; a
wrong token is refused; a server that is not there leaves the sync to run cold."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import psycopg
from psycopg import sql
import pytest
import yaml

from cdc_pipeline import control
from cdc_pipeline.config import CONFIG_PATH_ENV
from cdc_pipeline.ops import pipeline_server
from cdc_pipeline.ops.pipeline_server import SERVER_ENV, TOKEN_ENV
from tests.helpers import PROJECT_ROOT
from tests.helpers.pipeline_server import running_server
from tests.helpers.runs import log_tail, start_sync

pytestmark = pytest.mark.integration

ITEMS = "CREATE TABLE items (id INT PRIMARY KEY, label VARCHAR(20))"


@pytest.fixture
def server(pipeline, tmp_path: Path) -> Iterator[SimpleNamespace]:
    with running_server(pipeline.env, tmp_path) as running:
        yield running


def _sync(pipeline, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cdc_pipeline.ops.cli", "sync", pipeline.name, *args],
                          cwd=PROJECT_ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)


def _summary(run: subprocess.CompletedProcess) -> dict:
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _state(pipeline) -> list[tuple]:
    return pipeline.dest_query("SELECT state, phase, last_error FROM cdc.connector_state WHERE connector = %s",
                               (pipeline.name,))


def test_syncs_through_the_server_load_and_stream_exactly(pipeline, server):
    pipeline.source([ITEMS, "INSERT INTO items SELECT seq, CONCAT('i-', seq) FROM seq_1_to_500"])
    loaded = _summary(_sync(pipeline, server.env, "--json"))
    assert loaded["served_by"] == str(server.socket) and loaded["snapshot_rows"] == 500
    pipeline.assert_same("items")

    pipeline.source(["UPDATE items SET label = 'u' WHERE id % 3 = 0", "DELETE FROM items WHERE id % 7 = 0",
                     "INSERT INTO items SELECT 1000 + seq, 'n' FROM seq_1_to_50"])
    streamed = _summary(_sync(pipeline, server.env, "--json"))
    assert streamed["served_by"] == str(server.socket)
    assert (streamed["updates"], streamed["deletes"], streamed["inserts"]) == (166, 71, 50)
    pipeline.assert_same("items")
    assert _state(pipeline) == [("syncing", None, None)]
    assert server.process.poll() is None, "the server serves on"


def test_a_client_killed_during_its_cycle_ends_it_as_a_pause_and_the_next_goes_on(pipeline, server, tmp_path):
    pipeline.source([ITEMS, "INSERT INTO items SELECT seq, 'i' FROM seq_1_to_20"])
    _summary(_sync(pipeline, server.env, "--json"))
    pipeline.write_config(linger_seconds=600)
    client = start_sync(pipeline.name, "--linger", env=server.env)
    try:
        pipeline.source(["INSERT INTO items VALUES (100, 'first')"])
        deadline = time.monotonic() + 120
        while (100, "first") not in pipeline.dest_rows("items"):
            assert client.poll() is None, client.communicate()
            assert time.monotonic() < deadline, "the lingering cycle did not apply the change"
            time.sleep(0.2)
    finally:
        os.killpg(client.pid, signal.SIGKILL)
        client.wait()
    # The cycle, which would have lingered for 600 s, ends once its client is gone: its run lock is let go.
    deadline = time.monotonic() + 60
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        while control.run_lock_held(conn, pipeline.name):
            assert time.monotonic() < deadline, f"the server's cycle went on without its client: {log_tail(server.log)}"
            time.sleep(0.2)
    assert "went away" in server.log.read_text()

    pipeline.write_config()
    pipeline.source(["INSERT INTO items VALUES (101, 'second')", "UPDATE items SET label = 'x' WHERE id <= 5"])
    after = _summary(_sync(pipeline, server.env, "--json"))
    assert after["served_by"] == str(server.socket) and after["redelivered"] == 0
    pipeline.assert_same("items")
    assert _state(pipeline) == [("syncing", None, None)]


def test_a_wrong_token_is_refused_and_a_missing_server_leaves_the_sync_cold(pipeline, server, tmp_path):
    pipeline.source([ITEMS, "INSERT INTO items VALUES (1, 'a')"])
    refused = _sync(pipeline, {**server.env, TOKEN_ENV: "not-the-token"})
    assert refused.returncode == 1 and "refused the sync: the token is not the server's" in refused.stderr
    assert "not-the-token" not in refused.stderr and "not-the-token" not in server.log.read_text()
    assert pipeline.dest_query("SELECT to_regclass(%s)", (f'"{pipeline.source_db}".items',)) == [(None,)], \
        "a refused sync runs nothing"

    cold = _sync(pipeline, {**server.env, SERVER_ENV: str(tmp_path / "nobody.sock")}, "--json")
    assert "no pipeline server at" in cold.stderr and "the run goes cold" in cold.stderr
    assert "served_by" not in _summary(cold)
    pipeline.assert_same("items")


def test_serves_says_whether_a_sync_of_this_process_would_be_served(pipeline, server, tmp_path, monkeypatch):
    """What the change sensor asks before it tags a run served (its own JVM's runs are limited apart)."""
    for name in (SERVER_ENV, TOKEN_ENV, CONFIG_PATH_ENV):
        monkeypatch.setenv(name, server.env[name])
    assert pipeline_server.serves()
    monkeypatch.setenv(TOKEN_ENV, "not-the-token")
    assert not pipeline_server.serves()
    monkeypatch.setenv(TOKEN_ENV, server.env[TOKEN_ENV])
    other = tmp_path / "other.yaml"
    other.write_text(Path(server.env[CONFIG_PATH_ENV]).read_text())
    monkeypatch.setenv(CONFIG_PATH_ENV, str(other))
    assert not pipeline_server.serves(), "a server of another connectors file does not serve this process"
    monkeypatch.setenv(CONFIG_PATH_ENV, server.env[CONFIG_PATH_ENV])
    monkeypatch.setenv(SERVER_ENV, str(tmp_path / "nobody.sock"))
    assert not pipeline_server.serves()
    monkeypatch.delenv(SERVER_ENV)
    assert not pipeline_server.serves()
    assert server.process.poll() is None and "Traceback" not in server.log.read_text()


def test_two_connectors_cycles_run_side_by_side_in_one_server(pipeline, server):
    """Two connectors of one file, each lingering through the server at once: both apply their changes as they
    come, and end exact."""
    other_db = f"{pipeline.source_db}_b"
    pipeline.mariadb.execute(f"CREATE DATABASE `{other_db}`")
    pipeline.source([ITEMS, "INSERT INTO items VALUES (1, 'a')"])
    pipeline.mariadb.execute([ITEMS, "INSERT INTO items VALUES (1, 'b')"], database=other_db)
    # Long enough for the first load's cycle to linger until the second load is applied too (then the changes come).
    pipeline.write_config(linger_seconds=15)
    document = yaml.safe_load(pipeline.config_path.read_text())
    first = document["connectors"][pipeline.name]
    other = f"{pipeline.name}_b"
    document["connectors"][other] = {**first, "database": other_db}
    pipeline.config_path.write_text(yaml.safe_dump(document, sort_keys=False))

    clients = {name: start_sync(name, "--linger", "--json", env=server.env) for name in (pipeline.name, other)}
    # The changes come once both loads were applied (on a loaded machine a cycle may start after all of them, and its
    # snapshot would hold them all).
    deadline = time.monotonic() + 180
    while not all(_loaded(pipeline, schema) for schema in (pipeline.source_db, other_db)):
        assert time.monotonic() < deadline, "the two loads were not applied within 180 s"
        time.sleep(0.1)
    for key in range(2, 12):
        pipeline.source([f"INSERT INTO items VALUES ({key}, 'a')"])
        pipeline.mariadb.execute([f"INSERT INTO items VALUES ({key}, 'b')"], database=other_db)
        time.sleep(0.3)
    for name, client in clients.items():
        out, err = client.communicate(timeout=300)
        assert client.returncode == 0, err[-3000:]
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["served_by"] == str(server.socket), summary
        assert summary["snapshot_rows"] >= 1 and summary["inserts"] >= 1, "each loaded, then streamed"
    pipeline.assert_same("items")
    theirs = pipeline.mariadb.query("SELECT * FROM items ORDER BY 1", database=other_db)
    with psycopg.connect(pipeline.dest_dsn) as conn:
        ours = conn.execute(f'SELECT * FROM "{other_db}".items ORDER BY 1').fetchall()
    assert ours == [tuple(row) for row in theirs] and len(ours) == 11


def _loaded(pipeline, schema: str) -> bool:
    """Whether the destination's `schema`.items holds the loaded row 1 (False while the table does not exist)."""
    table = sql.Identifier(schema, "items").as_string()
    if pipeline.dest_query("SELECT to_regclass(%s)", (table,))[0][0] is None:
        return False
    return any(row[0] == 1 for row in pipeline.dest_rows("items", schema))


def test_a_server_killed_during_a_cycle_loses_nothing_and_the_next_run_goes_on(pipeline, tmp_path):
    pipeline.source([ITEMS, "INSERT INTO items SELECT seq, 'i' FROM seq_1_to_20"])
    with running_server(pipeline.env, tmp_path) as server:
        _summary(_sync(pipeline, server.env, "--json"))
        pipeline.write_config(linger_seconds=600)
        client = start_sync(pipeline.name, "--linger", env=server.env)
        pipeline.source(["INSERT INTO items VALUES (100, 'first')"])
        deadline = time.monotonic() + 120
        while (100, "first") not in pipeline.dest_rows("items"):
            assert client.poll() is None, client.communicate()
            assert time.monotonic() < deadline, "the lingering cycle did not apply the change"
            time.sleep(0.2)
        os.killpg(server.process.pid, signal.SIGKILL)
        _, err = client.communicate(timeout=60)
    assert client.returncode == 1 and "went away during the cycle" in err

    pipeline.write_config()
    pipeline.source(["INSERT INTO items VALUES (101, 'second')", "DELETE FROM items WHERE id <= 3"])
    after = _summary(_sync(pipeline, {**server.env}, "--json"))  # nothing listens now: a cold run
    assert "served_by" not in after
    pipeline.assert_same("items")
    assert _state(pipeline) == [("syncing", None, None)]
