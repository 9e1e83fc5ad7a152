"""A quiet connector on a busy server (`cdc-pipeline bench --busy-neighbour SECONDS`): another database of the same
MariaDB commits `--neighbour-rate` one-row transactions a second for SECONDS while the connector's database has
nothing to capture; then one row is committed in it, and the time until it arrives in the destination is measured.

Hours of a quiet spell are scaled by rate: `--time-scale S` makes the neighbour write S times faster for S times
shorter, and the loop that stands in for the change sensor check S times as often, so that each check reads what it
reads in the real setting, and the binlog the spell leaves is the real spell's. After the spell the neighbour goes
on at its own rate and the loop at the connector's `check_interval_seconds`: when a check says there is work, a
fresh `cdc-pipeline sync` process runs (as the sensor launches a run), with `max_seconds_per_run` from
`--neighbour-budget`. Reported: the neighbour's volume, the checks (their seconds, and how far behind the binlog's
end each left the checked position), the row's latency, the runs it took, and where each run's engine started,
behind the binlog's end when the row was committed (in MB and in seconds of the neighbour's writes).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from cdc_pipeline.testing.bench import CAPTURE_PASSWORD, CAPTURE_USER, percentile
from cdc_pipeline.testing.servers import MariaDbServer, PostgresServer, start_mariadb, start_postgres

NAME = "quiet"
DATABASE = "bench_quiet"
NEIGHBOUR = "bench_neighbour"
SLICE_SECONDS = 0.1  # the neighbour commits its transactions in a server-side loop per slice of this long
ARRIVAL_TIMEOUT_SECONDS = 600
_ENGINE_START = re.compile(r"the engine starts from (\{.*?\}), read by the change check")


def run_busy_neighbour(spell_seconds: float, rate: float, scale: float, budget: float, interval: int) -> dict[str, Any]:
    from cdc_pipeline.capture.runner import build_runner

    build_runner()
    with tempfile.TemporaryDirectory(prefix="cdc-bench-") as work:
        with start_mariadb(Path(work)) as source, start_postgres(Path(work)) as destination:
            source.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
            return measure_busy_neighbour(source, destination, Path(work), spell_seconds, rate, scale, budget,
                                          interval)


class _Neighbour(threading.Thread):
    """Commits `rate` one-row transactions a second in the neighbour's database until stopped (`rate` may change)."""

    def __init__(self, source: MariaDbServer, rate: float) -> None:
        super().__init__(daemon=True)
        self.source, self.rate, self.written = source, rate, 0
        self.stopping = threading.Event()

    def run(self) -> None:
        with self.source.connect(NEIGHBOUR) as connection, connection.cursor() as cursor:
            began, owed = time.monotonic(), 0.0
            while not self.stopping.is_set():
                owed += self.rate * SLICE_SECONDS
                count = int(owed)
                owed -= count
                if count:
                    cursor.execute(f"BEGIN NOT ATOMIC DECLARE i INT DEFAULT 0; WHILE i < {count} DO "
                                   "INSERT INTO log (v) VALUES ('written by the neighbour'); SET i = i + 1; "
                                   "END WHILE; END")
                    connection.commit()
                    self.written += count
                began += SLICE_SECONDS
                time.sleep(max(0.0, began - time.monotonic()))


def _binlog_end(source: MariaDbServer) -> dict[str, Any]:
    file, pos = source.query("SHOW MASTER STATUS")[0][:2]
    return {"file": str(file), "pos": int(pos)}


def _bytes_between(source: MariaDbServer, start: dict[str, Any], end: dict[str, Any]) -> int:
    """The binlog bytes from `start` to `end` (0 when `start` is not before it)."""
    sizes = {str(name): int(size) for name, size, *_ in source.query("SHOW BINARY LOGS")}
    names = list(sizes)
    if start["file"] not in sizes or end["file"] not in sizes:
        return 0
    first, last = names.index(start["file"]), names.index(end["file"])
    if first == last:
        return max(0, end["pos"] - start["pos"])
    return sizes[start["file"]] - start["pos"] + sum(sizes[name] for name in names[first + 1:last]) + end["pos"]


def measure_busy_neighbour(source: MariaDbServer, destination: PostgresServer, work: Path, spell_seconds: float,
                           rate: float, scale: float, budget: float, interval: int) -> dict[str, Any]:
    from cdc_pipeline.config import load_config
    from cdc_pipeline.ops import pending

    source.execute([f"CREATE DATABASE {DATABASE}", f"CREATE DATABASE {NEIGHBOUR}"])
    source.execute("CREATE TABLE items (id INT PRIMARY KEY, at DOUBLE NOT NULL)", database=DATABASE)
    source.execute("CREATE TABLE log (id INT AUTO_INCREMENT PRIMARY KEY, v TEXT)", database=NEIGHBOUR)
    destination.create_database(DATABASE)
    path = work / f"{NAME}.yaml"
    path.write_text(json.dumps({"destination": {"dsn": "${BENCH_DEST_DSN}"}, "connectors": {NAME: {
        "type": "mariadb", "hostname": "127.0.0.1", "port": source.port, "user": CAPTURE_USER,
        "password": "${BENCH_SOURCE_PASSWORD}", "database": DATABASE, "tables": [f"{DATABASE}.items"],
        "check_interval_seconds": interval, "max_seconds_per_run": budget}}}))
    (work / "dagster_quiet").mkdir(exist_ok=True)
    env = {"CDC_PIPELINE_CONFIG": str(path), "BENCH_DEST_DSN": destination.dsn(DATABASE),
           "BENCH_SOURCE_PASSWORD": CAPTURE_PASSWORD, "DAGSTER_HOME": str(work / "dagster_quiet")}
    os.environ.update(env)

    def start_run() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "cdc_pipeline.ops.cli", "sync", NAME, "--json", "--verbose"],
                                env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finish(run: subprocess.Popen) -> dict[str, Any]:
        out, err = run.communicate()
        lines = out.strip().splitlines()
        summary = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {"failed": err.strip()[-500:]}
        started = _ENGINE_START.search(err)
        return {"summary": summary, "engine_start": json.loads(started.group(1)) if started else None}

    if start_run().wait():
        raise RuntimeError("the first run of the quiet connector failed")
    source.execute("INSERT INTO items VALUES (0, 0)", database=DATABASE)
    if start_run().wait():
        raise RuntimeError("the quiet connector's second run failed")
    config = load_config()
    connector = config.connector(NAME)

    # The spell, scaled: the neighbour at rate * scale, a check every interval / scale.
    neighbour = _Neighbour(source, rate * scale)
    spell_start = _binlog_end(source)
    neighbour.start()
    checks: list[dict[str, Any]] = []
    runs: list[subprocess.Popen] = []
    spell_runs: list[dict[str, Any]] = []
    began = time.monotonic()
    while time.monotonic() - began < spell_seconds / scale:
        asked = time.monotonic()
        found = pending.check(connector, config.destination)
        seconds = time.monotonic() - asked
        with psycopg.connect(destination.dsn(DATABASE)) as conn:
            checked = conn.execute("SELECT source_checked FROM cdc.connector_state WHERE connector = %s",
                                   (NAME,)).fetchone()[0]
        end = _binlog_end(source)
        checks.append({"seconds": seconds, "caught_up": found.caught_up,
                       "behind_bytes": _bytes_between(source, checked, end) if checked else None})
        if runs and runs[-1].poll() is not None:
            spell_runs.append(finish(runs.pop()))
        if found.work and not runs:
            runs.append(start_run())
        time.sleep(max(0.0, asked + interval / scale - time.monotonic()))
    for run in runs:
        run.wait()
        spell_runs.append(finish(run))
    runs.clear()
    neighbour.rate = rate
    spell_written = neighbour.written
    row_end = _binlog_end(source)
    spell_bytes = _bytes_between(source, spell_start, row_end)
    bytes_per_second = spell_bytes / max(1, spell_written) * rate

    # The row, then the sensor's loop at the connector's own interval until it arrives.
    source.execute(f"INSERT INTO items VALUES (1, {time.time()})", database=DATABASE)
    committed = time.monotonic()
    arrived = None
    after_runs: list[dict[str, Any]] = []
    with psycopg.connect(destination.dsn(DATABASE), autocommit=True) as conn:
        next_check = committed
        while time.monotonic() - committed < ARRIVAL_TIMEOUT_SECONDS:
            now = time.monotonic()
            if runs and runs[-1].poll() is not None:
                after_runs.append(finish(runs.pop()))
            if now >= next_check and not runs:
                next_check = now + interval
                if pending.check(connector, config.destination).work:
                    runs.append(start_run())
            if conn.execute(f"SELECT count(*) FROM {DATABASE}.items WHERE id = 1").fetchone()[0]:
                arrived = time.monotonic() - committed
                break
            time.sleep(0.05)
    for run in runs:
        run.wait()
        after_runs.append(finish(run))
    neighbour.stopping.set()
    neighbour.join()

    def placed(run: dict[str, Any]) -> dict[str, Any]:
        start = run["engine_start"]
        behind = _bytes_between(source, start, row_end) if start else None
        return {"seconds": run["summary"].get("seconds"), "inserts": run["summary"].get("inserts"),
                "budget_spent": bool(run["summary"].get("budget_spent")),
                "engine_start_behind_mb": None if behind is None else round(behind / 1e6, 1),
                "engine_start_behind_neighbour_seconds": None if behind is None else round(
                    behind / bytes_per_second, 1),
                **({"failed": run["summary"]["failed"]} if "failed" in run["summary"] else {})}

    check_seconds = [check["seconds"] for check in checks]
    behind = [check["behind_bytes"] / bytes_per_second for check in checks if check["behind_bytes"] is not None]
    return {"spell_seconds": spell_seconds, "neighbour_rate": rate, "time_scale": scale,
            "max_seconds_per_run": budget, "check_interval_seconds": interval,
            "neighbour_transactions": spell_written, "neighbour_binlog_mb": round(spell_bytes / 1e6, 1),
            "checks": len(checks), "checks_caught_up": sum(check["caught_up"] for check in checks),
            "check_seconds_p50": round(percentile(check_seconds, 0.5), 2),
            "check_seconds_max": round(max(check_seconds, default=0.0), 2),
            "checked_behind_neighbour_seconds_max": round(max(behind, default=0.0), 1),
            "runs_during_spell": len(spell_runs),
            "runs_during_spell_failed": [run["summary"]["failed"] for run in spell_runs if "failed" in run["summary"]],
            "latency_seconds": None if arrived is None else round(arrived, 2),
            "runs_after_row": [placed(run) for run in after_runs]}


def describe(result: dict[str, Any]) -> str:
    runs = "; ".join(
        f"{run['seconds']} s, {run['inserts']} applied"
        + (", budget spent" if run["budget_spent"] else "")
        + (f", engine started {run['engine_start_behind_mb']} MB ({run['engine_start_behind_neighbour_seconds']} s "
           "of the neighbour) behind the row" if run["engine_start_behind_mb"] is not None
           else ", engine started at its stored offset")
        + (f", failed: {run['failed']}" if "failed" in run else "")
        for run in result["runs_after_row"])
    latency = "never (timeout)" if result["latency_seconds"] is None else f"{result['latency_seconds']} s"
    return (f"quiet connector on a busy server: a {result['spell_seconds']:g} s quiet spell at "
            f"{result['neighbour_rate']:g} neighbour transactions/s (time scale {result['time_scale']:g}: "
            f"{result['neighbour_transactions']} transactions, {result['neighbour_binlog_mb']} MB of binlog), "
            f"max_seconds_per_run {result['max_seconds_per_run']:g}, checks every "
            f"{result['check_interval_seconds']} s (scaled)\n"
            f"  checks: {result['checks']} ({result['checks_caught_up']} read to the end), p50 "
            f"{result['check_seconds_p50']} s, max {result['check_seconds_max']} s; the checked position at most "
            f"{result['checked_behind_neighbour_seconds_max']} s of the neighbour behind the end; "
            f"{result['runs_during_spell']} runs launched during the spell"
            + "".join(f"; one failed: {error}" for error in result["runs_during_spell_failed"]) + "\n"
            f"  the row after the spell applied after {latency}, in {len(result['runs_after_row'])} run(s): {runs}")
