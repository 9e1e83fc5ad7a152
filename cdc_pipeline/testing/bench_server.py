"""`cdc-pipeline bench --served-runs N`: what a pipeline server (`cdc-pipeline serve`) saves a run. On throwaway
servers (MariaDB), a table of the bench's shape loaded by a cold run; then N rounds, each of two backlogs of
`changes` row changes (one UPDATE), one caught up by a fresh `sync` process run cold, the other by a fresh `sync`
process through the server, which goes first alternating. The connector's defaults on both sides.

Per side: each process's wall seconds (its start included) and its first row moved after its process started
(`first_row_seconds`, as the cold benches report it), their medians, and the client process's peak memory; the
server's start and its peak memory (its Python process and driver JVM); whether the destination ended exact.
"""

from __future__ import annotations

import contextlib
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from cdc_pipeline.ops import auto_server
from cdc_pipeline.ops.pipeline_server import SERVER_ENV, TOKEN_ENV
from cdc_pipeline.testing.bench import (CAPTURE_PASSWORD, CAPTURE_USER, _children, _connector_env, _peak_mb,
                                        load_source, measure_sync_process, same_items)
from cdc_pipeline.testing.servers import PostgresServer, end_process_group, start_mariadb, start_postgres

DATABASE = "bench_served"
TABLE_ROWS = 20_000
CHANGES = 2_048
CONNECTOR = "load_spark"  # the connector `measure_sync_process` configures for the bulk engine
SERVER_START_SECONDS = 180.0


@contextlib.contextmanager
def started_servers(work: Path, env: dict[str, str]) -> Iterator[Path]:
    """The directory, under `work` and set in `env`, of the pipeline servers a bench's runs start for themselves
    (`auto_server`: without --served, unless the environment turns it off); those servers stopped at the end."""
    directory = work / "servers"
    env[auto_server.RUNTIME_DIR_ENV] = str(directory)
    try:
        yield directory
    finally:
        if directory.is_dir():
            auto_server.stop_servers(directory)


def start_pipeline_server(work: Path, env: dict[str, str]) -> tuple[subprocess.Popen, float]:
    """`cdc-pipeline serve` on a socket in `work`, once it listens; the seconds it took."""
    log_path = work / "server.log"
    started = time.monotonic()
    with log_path.open("w") as log:
        server = subprocess.Popen([sys.executable, "-m", "cdc_pipeline.ops.cli", "serve"], env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    while "listening on" not in log_path.read_text():
        if server.poll() is not None or time.monotonic() - started > SERVER_START_SECONDS:
            end_process_group(server)
            raise RuntimeError(f"the pipeline server did not start: {log_path.read_text()[-2000:]}")
        time.sleep(0.05)
    return server, time.monotonic() - started


def serve_connector(work: Path, name: str, destination: PostgresServer,
                    dest_database: str) -> tuple[subprocess.Popen, float, dict[str, str]]:
    """A pipeline server on the connectors file `measure_sync_process` writes for `name` in `work` (its socket there,
    a token of its own), once it listens; the seconds it took, and the environment its clients add."""
    client_env = {SERVER_ENV: str(work / "server.sock"), TOKEN_ENV: secrets.token_hex(16)}
    server, seconds = start_pipeline_server(work, {**_connector_env(work, name, destination, dest_database),
                                                   **client_env})
    return server, seconds, client_env


def server_peak_mb(server: subprocess.Popen) -> int:
    return _peak_mb(server.pid) + sum(_peak_mb(child) for child in _children(server.pid))


def _side(runs: list[dict[str, Any]]) -> dict[str, Any]:
    walls = [run["seconds"] for run in runs]
    firsts = [run["cycle"].get("first_row_seconds") for run in runs]
    known = [value for value in firsts if value is not None]
    return {"seconds": walls, "seconds_median": round(statistics.median(walls), 2), "first_row_seconds": firsts,
            "first_row_seconds_median": round(statistics.median(known), 2) if known else None,
            "peak_rss_mb_python": max(run["peak_rss_mb_python"] for run in runs),
            "peak_rss_mb_jvm": max(run["peak_rss_mb_jvm"] for run in runs)}


def run_served(rounds: int, changes: int = CHANGES) -> dict[str, Any]:
    from cdc_pipeline.capture.runner import build_runner

    build_runner()
    with tempfile.TemporaryDirectory(prefix="cdc-bench-served-") as tmp:
        work = Path(tmp)
        with start_mariadb(work) as source, start_postgres(work) as destination:
            source.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
            load_source(source, max(TABLE_ROWS, changes), DATABASE)
            measure_sync_process(source, destination, work, DATABASE, "spark", ["items"])  # the load, cold
            server, server_start, served_env = serve_connector(work, CONNECTOR, destination, f"{DATABASE}_spark")
            sides: dict[str, list[dict[str, Any]]] = {"cold": [], "served": []}
            try:
                for index in range(rounds):
                    order = ("cold", "served") if index % 2 == 0 else ("served", "cold")
                    for side in order:
                        source.execute([f"UPDATE items SET qty = qty + 1 WHERE id <= {int(changes)}"],
                                       database=DATABASE)
                        run = measure_sync_process(source, destination, work, DATABASE, "spark", ["items"],
                                                   new_destination=False,
                                                   extra_env=served_env if side == "served" else {
                                                       SERVER_ENV: "", TOKEN_ENV: ""})
                        if (side == "served") != ("served_by" in run["cycle"]):
                            raise RuntimeError(f"the {side} run did not run as asked: {run['cycle']}")
                        sides[side].append(run)
                server_mb = server_peak_mb(server)
            finally:
                end_process_group(server, wait_seconds=60)
            exact = same_items(source, destination, DATABASE, f"{DATABASE}_spark")
    cold, served = _side(sides["cold"]), _side(sides["served"])
    ratio = (round(cold["seconds_median"] / served["seconds_median"], 2) if served["seconds_median"] else None)
    return {"rounds": rounds, "changes": changes, "server_start_seconds": round(server_start, 2),
            "server_peak_rss_mb": server_mb, "cold": cold, "served": served, "cold_to_served_seconds": ratio,
            "exact": exact}


def describe(results: dict[str, Any]) -> str:
    cold, served = results["cold"], results["served"]
    return "\n".join([
        f"a backlog of {results['changes']:,} changes caught up by fresh `sync` processes, {results['rounds']} "
        "round(s) of each side (MariaDB, the connector's defaults)",
        f"  cold: {cold['seconds_median']} s median wall ({cold['seconds']}), first row "
        f"{cold['first_row_seconds_median']} s after the process started; peak RSS JVM {cold['peak_rss_mb_jvm']} "
        f"MB, Python {cold['peak_rss_mb_python']} MB",
        f"  through the server: {served['seconds_median']} s median wall ({served['seconds']}), first row "
        f"{served['first_row_seconds_median']} s after the client process started; client peak RSS "
        f"{served['peak_rss_mb_python']} MB (no JVM of its own: {served['peak_rss_mb_jvm']} MB)",
        f"  server: listening {results['server_start_seconds']} s after its start, peak RSS "
        f"{results['server_peak_rss_mb']} MB (Python and driver JVM); cold / served wall "
        f"{results['cold_to_served_seconds']}x; destination exact: {results['exact']}",
    ])

