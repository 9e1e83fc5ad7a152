"""Runs of `cdc-pipeline sync` in their own process group, killed with SIGKILL when a test says, and the
connector's counts the tests read."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import psycopg
from psycopg import sql

from cdc_pipeline import config, control, faults
from tests.helpers import PROJECT_ROOT

PAUSE_DEADLINE_SECONDS = 240
JVM_INFO = re.compile(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d INFO ")


def start_sync(name: str, *args: str, env: dict[str, str] | None = None, **popen: Any) -> subprocess.Popen:
    """Starts `cdc-pipeline sync NAME` in its own process group (so a test can kill all of it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "cdc_pipeline.ops.cli", "sync", name, *args],
        cwd=PROJECT_ROOT, env={**os.environ, **(env or {})}, start_new_session=True, text=True,
        **{"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen})


def kill_when(name: str, ready: Callable[[], bool], what: str, env: dict[str, str] | None = None,
              log: Path | None = None) -> None:
    """Runs `cdc-pipeline sync NAME` until `ready()` holds, then kills its process group with SIGKILL; its output
    goes to `log` when given (a pipe nobody reads could hold a talkative run up once full)."""
    with open(log or os.devnull, "w") as output:
        run = start_sync(name, *(["-v"] if log else []), env=env, stdout=output, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + PAUSE_DEADLINE_SECONDS
        try:
            while not ready():
                assert run.poll() is None, f"the run ended before {what}:\n{log_tail(log)}"
                assert time.monotonic() < deadline, \
                    f"the run did not reach {what} within {PAUSE_DEADLINE_SECONDS} s:\n{log_tail(log)}"
                time.sleep(0.05)
        finally:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    _await_run_lock_freed(name, env)


def log_tail(log: Path | None, lines: int = 60) -> str:
    """The last lines of a run's log, without the JVM's INFO lines (for an assertion's message)."""
    if log is None or not log.exists():
        return "(no log kept)"
    kept = [line for line in log.read_text(errors="replace").splitlines() if not JVM_INFO.match(line)]
    return "\n".join(kept[-lines:])


def _await_run_lock_freed(name: str, env: dict[str, str] | None) -> None:
    """Waits until the destination ended the killed run's session: a session in the middle of a statement (a merge)
    holds the connector's run lock until that statement ends, and the next run would find the connector busy."""
    path = (env or {}).get(config.CONFIG_PATH_ENV) or os.environ.get(config.CONFIG_PATH_ENV)
    destination = config.load_config(path).destination
    deadline = time.monotonic() + PAUSE_DEADLINE_SECONDS
    with destination.connect(name) as conn:
        while control.run_lock_held(conn, name):
            assert time.monotonic() < deadline, f"the killed run's session kept the run lock of {name}"
            time.sleep(0.05)


def kill_at(name: str, pause_at: str, marker: Path, env: dict[str, str] | None = None) -> Path:
    """Runs `cdc-pipeline sync NAME` until it pauses at `pause_at` (see cdc_pipeline/faults.py), then kills its
    process group with SIGKILL; returns the path of the run's log (beside the marker)."""
    log = marker.with_name(marker.name + ".log")
    kill_when(name, marker.exists, f"pausing at {pause_at}",
              env={**(env or {}), faults.PAUSE_AT_ENV: pause_at, faults.PAUSE_FILE_ENV: str(marker)}, log=log)
    assert marker.read_text() == pause_at.partition("@")[0]
    return log


def connector_stats(dest_dsn: str, connector: str, columns: Sequence[str]) -> dict[str, int]:
    """These counts of the connector's row of cdc.stats (zeros before the first run made it)."""
    with psycopg.connect(dest_dsn) as conn:
        if not conn.execute("SELECT to_regclass('cdc.stats') IS NOT NULL").fetchone()[0]:
            return dict.fromkeys(columns, 0)
        query = sql.SQL("SELECT {} FROM cdc.stats WHERE connector = %s").format(
            sql.SQL(", ").join(map(sql.Identifier, columns)))
        row = conn.execute(query, (connector,)).fetchone()
    return dict(zip(columns, map(int, row))) if row else dict.fromkeys(columns, 0)
