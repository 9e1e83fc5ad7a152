"""The code server starts each run's process from a forkserver that has imported Dagster's run entry and the
project's definitions (`resources.run_processes`): a run's process finds them loaded, and its parent is that
forkserver; `CDC_PIPELINE_RUN_PROCESS=spawn` leaves Dagster's own spawn. Each case runs in a fresh Python, whose
code server class and forkserver are its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# What a run's process reports: which modules it found loaded before it imported anything itself, and its parent.
_PROBE = textwrap.dedent("""
    import json, os, sys
    import assets.definitions
    from dagster._grpc.server import DagsterApiServer
    from tests.dagster_layer.test_run_processes import report_loaded

    server = object.__new__(DagsterApiServer)
    server._mp_ctx = None  # what the constructor sets first
    context = server._mp_ctx
    start = context.get_start_method() if context is not None else None
    if context is not None:
        queue = context.Queue()
        process = context.Process(target=report_loaded, args=(queue,))
        process.start()
        found = queue.get(timeout=60)
        process.join(60)
    else:
        found = None
    print(json.dumps({"start": start, "found": found, "server_pid": os.getpid()}))
""")


def report_loaded(queue) -> None:
    """The target of the probe's run process (imported by reference in the child, as Dagster's is)."""
    loaded = [name for name in ("dagster._grpc.impl", "assets.definitions", "assets.run_preload", "sqlalchemy",
                                "dagster._core.storage.runs.sqlite.sqlite_run_storage") if name in sys.modules]
    queue.put({"loaded": loaded, "parent": os.getppid(), "pid": os.getpid()})


def _probe(env_value: str | None, argv_tail: list[str] | None = None) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "CDC_PIPELINE_RUN_PROCESS"}
    if env_value is not None:
        env["CDC_PIPELINE_RUN_PROCESS"] = env_value
    done = subprocess.run([sys.executable, "-c", _PROBE, *(argv_tail or [])], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_run_process_is_forked_from_a_forkserver_with_the_definitions_loaded():
    found = _probe(None)

    assert found["start"] == "forkserver"
    assert found["found"]["loaded"] == ["dagster._grpc.impl", "assets.definitions", "assets.run_preload", "sqlalchemy",
                                        "dagster._core.storage.runs.sqlite.sqlite_run_storage"]
    # Forked by the forkserver, itself a child of the code server's process.
    assert found["found"]["parent"] not in (found["server_pid"], found["found"]["pid"])


def test_spawn_leaves_dagsters_own_start():
    found = _probe("spawn")

    assert found["start"] is None  # the attribute the constructor set, untouched


def test_a_value_that_is_neither_names_the_variable():
    env = {**os.environ, "CDC_PIPELINE_RUN_PROCESS": "threads"}
    done = subprocess.run([sys.executable, "-c", "import assets.definitions"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)

    assert done.returncode != 0
    assert "CDC_PIPELINE_RUN_PROCESS must be 'fork' or 'spawn', not 'threads'" in done.stderr


def test_a_preload_that_fails_does_not_stop_the_forkserver():
    code = textwrap.dedent("""
        import sys
        sys.modules["assets.definitions"] = None  # its import fails as a broken project's would
        import assets.run_preload
        print("preloaded")
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)

    assert done.returncode == 0 and done.stdout.strip() == "preloaded"
    assert "the run processes' preload could not import assets.definitions; runs import it themselves" in done.stderr


@pytest.mark.parametrize("value", ["fork", " Fork ", ""])
def test_fork_is_the_default_and_the_value_is_read_loosely(monkeypatch, value):
    from resources.run_processes import run_process_start

    monkeypatch.setenv("CDC_PIPELINE_RUN_PROCESS", value)
    assert run_process_start() == "fork"
