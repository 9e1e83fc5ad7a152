"""Freshness as a Dagster user gets it (`cdc-pipeline bench --freshness`): a MariaDB (or PostgreSQL) connector with
its defaults (or the `linger_seconds` given) under Dagster's daemon (`dagster dev` on the checkout's workspace.yaml, as
the README runs it, or `--dagster daemon`: `dagster-daemon run` alone; a fresh instance with the checkout's
dagster_home/dagster.yaml), its change sensor launching every run.

Each round, on fresh databases: the connector's first sync (`cdc-pipeline sync`), then the daemon, then
- quiet: nothing is written; the runs launched are counted (with runs served by a pipeline server, the standing runs
  the change sensor launches: `standing_run`; else none is the goal);
- trickle: one row committed every `trickle_interval` seconds (its first row's latency apart: the first after the
  quiet);
- busy: `busy_rate` rows a second, one per transaction;
- tail: until every row arrived and the last run ended (a standing run goes on: until every row arrived).
Each row's latency is from just after its commit on the source to when a poll of the destination (every 50 ms)
first sees it. The time runs hold (what holds a driver JVM) is sampled from the connector's run lock every 50 ms.
Runs from a checkout (the Dagster layer is loaded from it, as `make dagster-ui` does).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import psycopg
from psycopg import sql

from cdc_pipeline import control
from cdc_pipeline.testing.bench import percentile
from cdc_pipeline.ops import auto_server
from cdc_pipeline.ops.pipeline_server import SERVER_ENV, TOKEN_ENV
from cdc_pipeline.testing.bench_server import start_pipeline_server, started_servers
from cdc_pipeline.testing.servers import (MariaDbServer, PostgresServer, end_process_group, free_port,
                                          start_postgres, start_source)

CAPTURE_USER = "fresh"
CAPTURE_PASSWORD = "fresh-capture"
POLL_SECONDS = 0.05
# The daemon's first evaluations: its code location loads, the sensor ticks once (a check finding nothing).
DAEMON_SETTLE_SECONDS = 20.0
TAIL_SECONDS = 120.0
# How Dagster runs in a round (`start_dagster`).
DAGSTER_DEV, DAGSTER_DAEMON, DAGSTER_SERVICE = "dev", "daemon", "service"
DAGSTER_STOP_SECONDS = 30


def checkout() -> Path:
    """The checkout this package runs from (its workspace.yaml and dagster_home/); an error elsewhere."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "workspace.yaml").is_file() or not (root / "assets").is_dir():
        raise RuntimeError("bench --freshness runs Dagster's daemon on the checkout's workspace.yaml: run it from a "
                           "checkout of cdc-pipeline")
    return root


def run_freshness(lingers: Sequence[float | None], quiet_seconds: float, trickle_seconds: float,
                  trickle_interval: float, busy_seconds: float, busy_rate: float,
                  check_interval: int | None = None, keep: Path | None = None,
                  source_type: str = "mariadb", served: bool = False, dagster: str = DAGSTER_DEV) -> dict[str, Any]:
    """One round per linger value (None: the connector's default), each on fresh databases and a fresh instance
    (`keep`: in that directory, left behind with the daemon's log and the instance, instead of a temporary one);
    `served`: the daemon's runs with a pipeline server beside it (`cdc-pipeline serve`); `dagster`: how Dagster runs
    (`start_dagster`)."""
    from cdc_pipeline.capture.runner import build_runner

    build_runner()
    rounds = []
    with (contextlib.nullcontext(str(keep)) if keep else tempfile.TemporaryDirectory(prefix="cdc-fresh-")) as work:
        with start_source(source_type, Path(work)) as source, start_postgres(Path(work)) as destination:
            if isinstance(source, MariaDbServer):
                source.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
            for index, linger in enumerate(lingers):
                rounds.append(measure_round(source, destination, Path(work) / f"round{index}", linger,
                                            quiet_seconds, trickle_seconds, trickle_interval, busy_seconds,
                                            busy_rate, check_interval, served, dagster))
    return {"rounds": rounds, "served": served, "dagster": dagster}


def measure_round(source: MariaDbServer | PostgresServer, destination: PostgresServer, work: Path,
                  linger: float | None,
                  quiet_seconds: float, trickle_seconds: float, trickle_interval: float, busy_seconds: float,
                  busy_rate: float, check_interval: int | None, served: bool = False,
                  dagster: str = DAGSTER_DEV) -> dict[str, Any]:
    work.mkdir(parents=True)
    database = name = f"fresh_{work.name}"  # a connector per round: a PostgreSQL slot per connector
    connector: dict[str, Any]
    if isinstance(source, MariaDbServer):
        source.execute(f"CREATE DATABASE {database}")
        source.execute("CREATE TABLE items (id INT PRIMARY KEY, at DOUBLE NOT NULL)", database=database)
        connector = {"type": "mariadb", "hostname": "127.0.0.1", "port": source.port, "user": CAPTURE_USER,
                     "password": "${FRESH_SOURCE_PASSWORD}", "database": database, "tables": [f"{database}.items"]}
    else:
        source.create_database(database)
        source.execute("CREATE TABLE items (id INT PRIMARY KEY, at DOUBLE PRECISION NOT NULL)", dbname=database)
        connector = {"type": "postgres", "hostname": source.host, "port": source.port, "user": source.superuser,
                     "password": "${FRESH_SOURCE_PASSWORD}", "database": database, "tables": ["public.items"]}
    destination.create_database(database)
    if linger is not None:
        connector["linger_seconds"] = linger
    if check_interval is not None:
        connector["check_interval_seconds"] = check_interval
    config = work / "connectors.yaml"
    config.write_text(json.dumps({"destination": {"dsn": "${FRESH_DEST_DSN}"}, "connectors": {name: connector}}))
    root = checkout()
    home = work / "dagster_home"
    home.mkdir()
    shutil.copy(root / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    env = {**os.environ, "CDC_PIPELINE_CONFIG": str(config), "FRESH_DEST_DSN": destination.dsn(database),
           "FRESH_SOURCE_PASSWORD": CAPTURE_PASSWORD, "DAGSTER_HOME": str(home)}
    first = subprocess.run([sys.executable, "-m", "cdc_pipeline.ops.cli", "sync", name], env=env, cwd=root,
                           capture_output=True, text=True)
    if first.returncode:
        raise RuntimeError(f"the connector's first sync failed: {first.stderr.strip()[-2000:]}")
    server = None
    if served:
        env.update({SERVER_ENV: str(work / "server.sock"), TOKEN_ENV: secrets.token_hex(16)})
        server, _ = start_pipeline_server(work, env)
    try:
        with started_servers(work, env), start_dagster(root, env, work / "daemon.log", dagster):
            result = _measure(source, destination, database, name, linger, quiet_seconds, trickle_seconds,
                              trickle_interval, busy_seconds, busy_rate,
                              standing=served or auto_server.enabled(env))
            return {**result, "auto_served": not served and auto_server.enabled(env)}
    finally:
        if server is not None:
            end_process_group(server, wait_seconds=60)


@contextlib.contextmanager
def start_dagster(root: Path, env: dict[str, str], log_path: Path, dagster: str) -> Iterator[list[subprocess.Popen]]:
    """Dagster on the checkout's workspace, its processes each in a session of its own:
    - DAGSTER_DEV: `dagster dev` as the README runs it (its webserver, its daemon, one code server);
    - DAGSTER_DAEMON: `dagster-daemon run` alone, which starts its code server again every minute (Dagster's
      workspace reload);
    - DAGSTER_SERVICE: as docs/operations.md runs Dagster as a service: `dagster code-server start`, then
      `dagster-daemon run` and `dagster-webserver` on a workspace of that server.
    Webservers and code servers listen on free ports of the loopback. Stopped with everything they started (SIGTERM
    to each process group, then SIGKILL) however the block ends; yields the processes, the daemon's first."""
    bin_dir = Path(sys.executable).parent
    workspace = str(root / "workspace.yaml")
    loopback = ["-h", "127.0.0.1"]
    if dagster == DAGSTER_DEV:
        commands = [[str(bin_dir / "dagster"), "dev", "-w", workspace, "--host", "127.0.0.1", "-p", str(free_port())]]
    elif dagster == DAGSTER_DAEMON:
        commands = [[str(bin_dir / "dagster-daemon"), "run", "-w", workspace]]
    elif dagster == DAGSTER_SERVICE:
        port = free_port()
        served = log_path.with_name("workspace.yaml")
        served.write_text(json.dumps({"load_from": [{"grpc_server": {
            "host": "127.0.0.1", "port": port, "location_name": "cdc_pipeline"}}]}))
        commands = [[str(bin_dir / "dagster"), "code-server", "start", "-m", "assets.definitions", "-d", str(root),
                     *loopback, "-p", str(port), "--location-name", "cdc_pipeline"],
                    [str(bin_dir / "dagster-daemon"), "run", "-w", str(served)],
                    [str(bin_dir / "dagster-webserver"), "-w", str(served), *loopback, "-p", str(free_port())]]
    else:
        raise ValueError(f"dagster: {dagster!r} is none of {DAGSTER_DEV!r}, {DAGSTER_DAEMON!r}, {DAGSTER_SERVICE!r}")
    processes: list[subprocess.Popen] = []
    with log_path.open("w") as log, contextlib.ExitStack() as stack:
        for command in commands:
            process = subprocess.Popen(command, env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            stack.callback(end_process_group, process, DAGSTER_STOP_SECONDS)
            processes.append(process)
            if dagster == DAGSTER_SERVICE and len(processes) == 1:
                _wait_for_code_server(bin_dir, port, process)
        yield processes[1:2] + processes[:1] + processes[2:] if dagster == DAGSTER_SERVICE else processes


def _wait_for_code_server(bin_dir: Path, port: int, process: subprocess.Popen, timeout: float = 180) -> None:
    """Until the code server on `port` answers Dagster's health check (it has loaded the definitions)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the code server ended with {process.returncode} before it answered")
        if subprocess.run([str(bin_dir / "dagster"), "api", "grpc-health-check", "-p", str(port)],
                          capture_output=True).returncode == 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the code server on port {port} did not answer within {timeout:.0f} s")


class _Watcher(threading.Thread):
    """Polls the destination: when each row first arrived, and whether a run holds the connector's run lock."""

    def __init__(self, destination: PostgresServer, database: str, name: str) -> None:
        super().__init__(daemon=True)
        self.dsn = destination.dsn(database)
        self.name = name
        self.arrived: dict[int, float] = {}
        self.held: list[tuple[float, bool]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            # The destination's schema: the source database's name (MariaDB) or its schema (PostgreSQL).
            schema = conn.execute("SELECT table_schema FROM information_schema.tables WHERE table_name = 'items' "
                                  "ORDER BY table_schema = 'public' LIMIT 1").fetchone()[0]
            query = sql.SQL("SELECT id FROM {} WHERE id > %s").format(sql.Identifier(schema, "items"))
            while not self.stop.is_set():
                rows = conn.execute(query, (max(self.arrived, default=0),)).fetchall()
                now = time.time()
                for (key,) in rows:
                    self.arrived.setdefault(int(key), now)
                self.held.append((time.monotonic(), control.run_lock_held(conn, self.name)))
                time.sleep(POLL_SECONDS)

    def runs_and_held(self, since: float, until: float) -> tuple[int, float]:
        """Runs that began in [since, until) and the seconds a run held the lock then."""
        samples = [(at, held) for at, held in self.held if since <= at < until]
        # A run already going when the phase began is not counted.
        began = sum(1 for (_, before), (_, after) in zip(samples, samples[1:]) if after and not before)
        held = sum(later - at for (at, was), (later, _) in zip(samples, samples[1:]) if was)
        return began, held


def _write(source: MariaDbServer | PostgresServer, database: str, first_id: int, seconds: float, rate: float,
           written: dict[int, float]) -> int:
    """Commits one row every 1/rate seconds for `seconds`; returns the next id."""
    connect = source.connect(database) if isinstance(source, MariaDbServer) else psycopg.connect(source.dsn(database))
    with connect as connection, connection.cursor() as cursor:
        key, began = first_id, time.monotonic()
        while time.monotonic() - began < seconds:
            cursor.execute("INSERT INTO items VALUES (%s, %s)", (key, time.time()))
            connection.commit()
            written[key] = time.time()
            key += 1
            time.sleep(max(0.0, began + (key - first_id) / rate - time.monotonic()))
    return key


def _percentiles(latencies: Sequence[float]) -> dict[str, float]:
    return {"p50": round(percentile(latencies, 0.5), 2), "p90": round(percentile(latencies, 0.9), 2),
            "max": round(max(latencies, default=float("nan")), 2)}


def _measure(source: MariaDbServer | PostgresServer, destination: PostgresServer, database: str, name: str,
             linger: float | None,
             quiet_seconds: float, trickle_seconds: float, trickle_interval: float, busy_seconds: float,
             busy_rate: float, standing: bool = False) -> dict[str, Any]:
    """The round's phases; `standing`: its runs are served, and a standing run holds the run lock at the end."""
    watcher = _Watcher(destination, database, name)
    watcher.start()
    time.sleep(DAEMON_SETTLE_SECONDS)
    result: dict[str, Any] = {"linger_seconds": linger if linger is not None else "default"}
    phases: list[tuple[str, float, float, list[int]]] = []
    began = time.monotonic()
    time.sleep(quiet_seconds)
    phases.append(("quiet", began, time.monotonic(), []))
    written: dict[int, float] = {}
    key = 1
    for name, seconds, rate in (("trickle", trickle_seconds, 1 / trickle_interval), ("busy", busy_seconds, busy_rate)):
        began = time.monotonic()
        following = _write(source, database, key, seconds, rate, written)
        phases.append((name, began, time.monotonic(), list(range(key, following))))
        key = following
    began = time.monotonic()
    deadline = began + TAIL_SECONDS + (linger or 60)
    while time.monotonic() < deadline and (len(watcher.arrived) < len(written)
                                           or (watcher.held[-1][1] and not standing)):
        time.sleep(0.2)
    phases.append(("tail", began, time.monotonic(), []))
    watcher.stop.set()
    watcher.join()
    for name, start, end, keys in phases:
        runs, held = watcher.runs_and_held(start, end)
        phase: dict[str, Any] = {"seconds": round(end - start, 1), "runs_began": runs,
                                 "run_seconds": round(held, 1)}
        if keys:
            latencies = [watcher.arrived[k] - written[k] for k in keys if k in watcher.arrived]
            phase.update({"rows": len(keys), "arrived": len(latencies), **_percentiles(latencies),
                          "first": round(watcher.arrived[keys[0]] - written[keys[0]], 2)
                          if keys[0] in watcher.arrived else None})
        result[name] = phase
    return result


def describe(results: dict[str, Any]) -> str:
    auto = any(one.get("auto_served") for one in results["rounds"])
    lines = [("with a pipeline server beside the daemon" if results.get("served") else
              "a pipeline server started by the runs" if auto else "cold runs (no pipeline server)"),
             "linger_seconds | quiet: runs | trickle first, p50/p90/max s (runs, run s / phase s) | busy p50/p90/max "
             "s (runs) | tail: run s after the last row"]
    for one in results["rounds"]:
        quiet, trickle, busy, tail = one["quiet"], one["trickle"], one["busy"], one["tail"]
        lines.append(
            f"{one['linger_seconds']} | {quiet['runs_began']} | {trickle.get('first')}, "
            f"{trickle['p50']}/{trickle['p90']}/{trickle['max']} "
            f"({trickle['arrived']}/{trickle['rows']} rows, {trickle['runs_began']} runs, {trickle['run_seconds']}/"
            f"{trickle['seconds']}) | {busy['p50']}/{busy['p90']}/{busy['max']} ({busy['arrived']}/{busy['rows']} "
            f"rows, {busy['runs_began']} runs) | {tail['run_seconds']} of {tail['seconds']}")
    return "\n".join(lines)
