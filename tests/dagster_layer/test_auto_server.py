"""Dagster's runs with no pipeline server configured have one started for them: the first run starts it and has its
cycle served there, the next run is served by the same server, a run of another build (its environment changed)
replaces it, and a server with no cycle for its idle time stops."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance

from assets.definitions import build_definitions
from cdc_pipeline.config import load_config
from cdc_pipeline.ops import auto_server

pytestmark = pytest.mark.integration

IDLE_EXIT_SECONDS = 10


def _run(pipeline, instance: DagsterInstance) -> list[str]:
    """Runs the connector's job; the step's log messages."""
    job = build_definitions(load_config(pipeline.config_path)).resolve_job_def(f"sync_{pipeline.name}")
    result = job.execute_in_process(instance=instance)
    assert result.success
    return [entry.user_message for entry in instance.all_logs(result.run_id)]


def _served_by(messages: list[str], directory: Path) -> str:
    """The socket of the server that ran the run's cycle, one of `directory`."""
    prefix = "the cycle ran on the pipeline server at "
    served = [message.removeprefix(prefix).split(": ")[0] for message in messages if message.startswith(prefix)]
    assert served, "\n".join(messages[-20:])
    assert Path(served[0]).parent == directory, served[0]
    return served[0]


def test_runs_without_a_server_share_one_started_for_them(pipeline, monkeypatch):
    # Short: a Unix socket's path is 107 bytes at most, and pytest's temporary paths run long.
    directory = Path(tempfile.mkdtemp(prefix="cdc-servers-"))
    monkeypatch.setenv(auto_server.AUTO_SERVE_ENV, "1")
    monkeypatch.setenv(auto_server.RUNTIME_DIR_ENV, str(directory))
    monkeypatch.setenv(auto_server.IDLE_EXIT_ENV, str(IDLE_EXIT_SECONDS))
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, label VARCHAR(20))",
                     "INSERT INTO items VALUES (1, 'a'), (2, 'b')"])
    try:
        with DagsterInstance.ephemeral() as instance:
            first = _served_by(_run(pipeline, instance), directory)
            started = list(auto_server.servers(directory))
            pipeline.source(["UPDATE items SET label = 'x' WHERE id = 2", "INSERT INTO items VALUES (3, 'c')"])
            second = _served_by(_run(pipeline, instance), directory)
            assert list(auto_server.servers(directory)) == started and len(started) == 1
            assert second == first
            pipeline.assert_same("items")

            # Another build (here: a CDC_ variable of the environment): its own server, the old one stopped.
            monkeypatch.setenv("CDC_PIPELINE_TEST_BUILD", "2")
            pipeline.source("DELETE FROM items WHERE id = 1")
            third = _served_by(_run(pipeline, instance), directory)
            replaced = list(auto_server.servers(directory))
            assert third != first and len(replaced) == 1 and replaced != started
            assert not Path(f"/proc/{started[0]}").exists() or auto_server._zombie(started[0])
            pipeline.assert_same("items")

        # No cycle for its idle time: it stops, its socket gone.
        deadline = time.monotonic() + IDLE_EXIT_SECONDS + 60
        while list(auto_server.servers(directory)) and time.monotonic() < deadline:
            time.sleep(1)
        assert not list(auto_server.servers(directory)), [log.read_text()[-2000:] for log in directory.glob("*.log")]
        assert not list(directory.glob("*.sock"))
    finally:
        auto_server.stop_servers(directory)
        shutil.rmtree(directory, ignore_errors=True)
