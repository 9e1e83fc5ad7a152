"""A server of many tenant databases under Dagster's daemon (`cdc-pipeline bench --databases N`): one throwaway
MariaDB server holding `tenant_001` ... `tenant_N`, each of `tables` small tables, replicated into one destination
PostgreSQL database by the checkout's Dagster layer (`dagster dev` on its workspace.yaml, as the README runs it, or
`--dagster daemon`: `dagster-daemon run` alone; a fresh instance with its dagster_home/dagster.yaml), the change
sensors launching every run, the connectors with their defaults.

Two shapes: one connector covering every tenant (`databases: ["tenant_*"]`, each database into its own destination
schema), or a connector per database (`per_database`, `database: tenant_001`, ...). It measures
- exact: seconds from the daemon's start until every tenant table's rows in the destination equal the source's;
- trickle: one row every `trickle_interval` seconds into a random table of a random tenant for `trickle_seconds`,
  each row's latency from just after its commit to when a poll of the destination (every 0.1 s) first sees it, and
  the rows not there `tail_seconds` after the last one;
- new tenant (one connector only): a database `tenant_<N+1>` created, its tables and rows committed, a third into the
  trickle, and the seconds from its rows' commit until its tables are exact;
- peak memory: the highest sum of the resident set sizes of Dagster's process tree (its webserver and daemon, its
  code server, the run workers and their driver JVMs), sampled every 0.5 s from /proc;
- the runs the instance recorded: launched, failed, and how long they queued and ran.
The daemon and both servers are stopped at the end, also after an error, Ctrl-C or SIGTERM. It is a command, not a test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Iterator

import psycopg
from psycopg import sql

from cdc_pipeline.testing.bench import percentile
from cdc_pipeline.testing.bench_freshness import (CAPTURE_PASSWORD, CAPTURE_USER, DAGSTER_DEV, _percentiles,
                                                  checkout, start_dagster)
from cdc_pipeline.ops import auto_server
from cdc_pipeline.ops.pipeline_server import SERVER_ENV, TOKEN_ENV
from cdc_pipeline.testing.bench_server import start_pipeline_server, started_servers
from cdc_pipeline.testing.servers import (MariaDbServer, PostgresServer, end_process_group, start_mariadb,
                                          start_postgres)

TENANT_PATTERN = "tenant_*"
TABLE_ROWS = 3
DESTINATION_DATABASE = "tenants"
EXACT_TIMEOUT_SECONDS = 900.0
TAIL_SECONDS = 120.0
POLL_SECONDS = 0.1
EXACT_POLL_SECONDS = 0.5
MEMORY_SAMPLE_SECONDS = 0.5
# Trickled rows' keys start here, past every table's first rows.
TRICKLE_FIRST_ID = 1000


def tenant_name(number: int) -> str:
    return f"tenant_{number:03d}"


def _row(key: int) -> tuple[int, int, str]:
    return key, key * 7, f"row {key}"


def create_tenant(source: MariaDbServer, database: str, tables: int, rows: int) -> dict[tuple[str, str], set]:
    """Creates `database` with `tables` tables `t1`... of `rows` rows each; returns each table's rows, keyed by
    (database, table): what its destination table (schema: the database's name) is to hold."""
    source.execute(f"CREATE DATABASE {database}")
    expected: dict[tuple[str, str], set] = {}
    statements = []
    for number in range(1, tables + 1):
        table = f"t{number}"
        statements.append(f"CREATE TABLE {table} (id INT PRIMARY KEY, v INT NOT NULL, note VARCHAR(40))")
        values = [_row(key) for key in range(1, rows + 1)]
        statements.append(f"INSERT INTO {table} VALUES " + ", ".join(f"({k}, {v}, '{n}')" for k, v, n in values))
        expected[(database, table)] = set(values)
    source.execute(statements, database=database)
    return expected


def connectors_file(source: MariaDbServer, databases: list[str], per_database: bool) -> dict[str, Any]:
    """The connectors file: a connector per database (named as it), or one, `tenants`, of every `tenant_*`."""
    common = {"type": "mariadb", "hostname": "127.0.0.1", "port": source.port, "user": CAPTURE_USER,
              "password": "${TENANTS_SOURCE_PASSWORD}"}
    connectors = ({database: {**common, "database": database} for database in databases} if per_database
                  else {"tenants": {**common, "databases": [TENANT_PATTERN]}})
    return {"destination": {"dsn": "${TENANTS_DEST_DSN}"}, "connectors": connectors}


def run_tenants(databases: int, tables: int, trickle_seconds: float, trickle_interval: float, per_database: bool,
                rows: int = TABLE_ROWS, tail_seconds: float = TAIL_SECONDS,
                exact_timeout: float = EXACT_TIMEOUT_SECONDS, keep: Path | None = None,
                served: bool = False, dagster: str = DAGSTER_DEV) -> dict[str, Any]:
    """One round on fresh servers and a fresh instance (`keep`: in that new directory, left behind with the servers'
    files, the daemon's log and the instance); `served`: a pipeline server beside the daemon, whose process tree
    counts in the peak memory; `dagster`: how Dagster runs (bench_freshness.start_dagster)."""
    from cdc_pipeline.capture.runner import build_runner

    build_runner()
    with contextlib.ExitStack() as stack:
        if threading.current_thread() is threading.main_thread():
            # A SIGTERM ends the round as Ctrl-C does: the daemon and both servers are stopped on the way out.
            previous = signal.signal(signal.SIGTERM, _interrupt)
            stack.callback(signal.signal, signal.SIGTERM, previous)
        work = Path(str(keep) if keep else stack.enter_context(tempfile.TemporaryDirectory(prefix="cdc-tenants-")))
        work.mkdir(parents=True, exist_ok=True)
        source = stack.enter_context(start_mariadb(work))
        destination = stack.enter_context(start_postgres(work))
        source.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
        names = [tenant_name(number) for number in range(1, databases + 1)]
        watcher = _Watcher(destination.dsn(DESTINATION_DATABASE))
        for name in names:
            watcher.expect(create_tenant(source, name, tables, rows))
        destination.create_database(DESTINATION_DATABASE)
        config = work / "connectors.yaml"
        config.write_text(json.dumps(connectors_file(source, names, per_database)))
        home = work / "dagster_home"
        home.mkdir()
        root = checkout()
        shutil.copy(root / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
        env = {**os.environ, "CDC_PIPELINE_CONFIG": str(config), "DAGSTER_HOME": str(home),
               "TENANTS_DEST_DSN": destination.dsn(DESTINATION_DATABASE),
               "TENANTS_SOURCE_PASSWORD": CAPTURE_PASSWORD}
        result: dict[str, Any] = {"databases": databases, "tables_per_database": tables, "rows_per_table": rows,
                                  "connectors": databases if per_database else 1,
                                  "mode": "connector per database" if per_database else "one connector",
                                  "served": served, "dagster": dagster}
        roots = []
        # Without --served, the runs start a pipeline server of their own: counted with the processes.
        servers = stack.enter_context(started_servers(work, env))
        result["auto_served"] = not served and auto_server.enabled(env)
        if served:
            env.update({SERVER_ENV: str(work / "server.sock"), TOKEN_ENV: secrets.token_hex(16)})
            server, _ = start_pipeline_server(work, env)
            stack.callback(end_process_group, server, 60)
            roots.append(server.pid)
        with start_dagster(root, env, work / "daemon.log", dagster) as processes:
            started = time.monotonic()
            sampler = _MemorySampler(processes[0].pid, roots + [process.pid for process in processes[1:]], servers)
            sampler.start()
            watcher.start()
            try:
                result.update(_measure(source, watcher, started, names, tables, rows, trickle_seconds,
                                       trickle_interval, per_database, tail_seconds, exact_timeout))
                # Read while the daemon runs: stopping it fails the runs still lingering.
                result["runs"] = _runs(home)
            finally:
                watcher.stop.set()
                sampler.stop.set()
                watcher.join()
                sampler.join()
            result["peak_rss_mb"] = round(sampler.peak / 2**20)
            result["peak_pss_mb"] = round(sampler.peak_pss / 2**20)
            result["peak_processes"] = sampler.peak_processes
            result["cpu_seconds"] = sampler.cpu_seconds()
            result["run_processes"] = sampler.run_processes()
    return result


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _measure(source: MariaDbServer, watcher: _Watcher, started: float, names: list[str], tables: int, rows: int,
             trickle_seconds: float, trickle_interval: float, per_database: bool, tail_seconds: float,
             exact_timeout: float) -> dict[str, Any]:
    result: dict[str, Any] = {}
    tenant_tables = list(watcher.expected)
    exact_at = watcher.wait_exact(tenant_tables, started + exact_timeout)
    result["exact_seconds"] = round(exact_at - started, 1) if exact_at is not None else None
    result["tables_exact"] = sum(1 for table in tenant_tables if table in watcher.exact_at)
    result["tables"] = len(tenant_tables)
    new_tenant = None if per_database else tenant_name(len(names) + 1)
    new_tables: list[tuple[str, str]] = []
    created_at = None
    chooser = random.Random(50)
    key = TRICKLE_FIRST_ID
    connections: dict[str, Any] = {}
    with contextlib.ExitStack() as closing:
        began = time.monotonic()
        while time.monotonic() - began < trickle_seconds:
            if new_tenant is not None and created_at is None and time.monotonic() - began >= trickle_seconds / 3:
                expected = create_tenant(source, new_tenant, tables, rows)
                created_at = time.monotonic()
                new_tables = list(expected)
                watcher.expect(expected)
            database, table = chooser.choice(tenant_tables)
            if database not in connections:
                connections[database] = closing.enter_context(source.connect(database))
            connection = connections[database]
            row = _row(key)
            with connection.cursor() as cursor:
                cursor.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)", row)
            connection.commit()
            watcher.trickled(database, table, row)
            key += 1
            time.sleep(max(0.0, began + (key - TRICKLE_FIRST_ID) * trickle_interval - time.monotonic()))
    last_row_at = time.monotonic()
    deadline = last_row_at + tail_seconds
    while time.monotonic() < deadline and not (
            watcher.all_arrived() and all(table in watcher.exact_at for table in new_tables)):
        time.sleep(0.2)
    latencies = watcher.latencies()
    result["trickle"] = {"rows": key - TRICKLE_FIRST_ID, "arrived": len(latencies),
                         "not_applied": key - TRICKLE_FIRST_ID - len(latencies), **_percentiles(latencies),
                         "interval_seconds": trickle_interval, "seconds": trickle_seconds,
                         "series": watcher.series()}
    if new_tenant is not None:
        exact = [watcher.exact_at.get(table) for table in new_tables]
        result["new_tenant"] = {"database": new_tenant, "exact_seconds": (
            round(max(exact) - created_at, 1) if created_at is not None and exact and None not in exact else None)}
    return result


class _Watcher(threading.Thread):
    """Polls the destination: when each expected table first held exactly its source rows, and when each trickled row
    first arrived."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.expected: dict[tuple[str, str], set] = {}
        self.exact_at: dict[tuple[str, str], float] = {}
        self.written: dict[int, tuple[str, str, float]] = {}
        self.arrived: dict[int, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def expect(self, tables: dict[tuple[str, str], set]) -> None:
        with self.lock:
            self.expected.update(tables)

    def trickled(self, database: str, table: str, row: tuple[int, int, str]) -> None:
        with self.lock:
            self.written[row[0]] = (database, table, time.time())

    def wait_exact(self, tables: list[tuple[str, str]], deadline: float) -> float | None:
        """The monotonic time at which the last of `tables` became exact, or None at `deadline`."""
        while time.monotonic() < deadline and self.is_alive():
            with self.lock:
                if all(table in self.exact_at for table in tables):
                    return max(self.exact_at[table] for table in tables)
            time.sleep(0.2)
        return None

    def all_arrived(self) -> bool:
        with self.lock:
            return len(self.arrived) == len(self.written)

    def latencies(self) -> list[float]:
        with self.lock:
            return [self.arrived[key] - at for key, (_, _, at) in self.written.items() if key in self.arrived]

    def series(self) -> list[tuple[float, str, float | None]]:
        """Each trickled row in commit order: seconds after the first one, its database, its latency (None: not
        arrived)."""
        with self.lock:
            first = min((at for _, _, at in self.written.values()), default=0.0)
            return [(round(at - first, 1), database, round(self.arrived[key] - at, 2) if key in self.arrived else None)
                    for key, (database, _, at) in sorted(self.written.items())]

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            exact_checked = 0.0
            while not self.stop.is_set():
                if time.monotonic() - exact_checked >= EXACT_POLL_SECONDS:
                    exact_checked = time.monotonic()
                    self._check_exact(conn)
                self._check_trickle(conn)
                time.sleep(POLL_SECONDS)

    def _check_exact(self, conn: psycopg.Connection) -> None:
        with self.lock:
            waiting = {table: rows for table, rows in self.expected.items() if table not in self.exact_at}
        if not waiting:
            return
        present = {tuple(row) for row in conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema = ANY(%s)",
            (sorted({schema for schema, _ in waiting}),)).fetchall()}
        for table, rows in waiting.items():
            if table in present and set(map(tuple, conn.execute(
                    sql.SQL("SELECT id, v, note FROM {}").format(sql.Identifier(*table))).fetchall())) == rows:
                with self.lock:
                    self.exact_at[table] = time.monotonic()

    def _check_trickle(self, conn: psycopg.Connection) -> None:
        with self.lock:
            pending: dict[tuple[str, str], list[int]] = {}
            for key, (database, table, _) in self.written.items():
                if key not in self.arrived:
                    pending.setdefault((database, table), []).append(key)
        for table, keys in pending.items():
            try:
                found = conn.execute(sql.SQL("SELECT id FROM {} WHERE id = ANY(%s)").format(sql.Identifier(*table)),
                                     (keys,)).fetchall()
            except psycopg.errors.UndefinedTable:
                continue
            now = time.time()
            with self.lock:
                for (key,) in found:
                    self.arrived.setdefault(int(key), now)


class _MemorySampler(threading.Thread):
    """Samples the memory of a process and all its descendants (read from /proc): the summed resident set size, and
    the summed proportional set size (each page shared by n processes counted 1/n: the memory they take together,
    which the RSS sum overstates for processes forked from one another); and the CPU seconds of each process by its
    kind (`cpu_seconds`: the last ones of a process that ended between two samples are not counted)."""

    def __init__(self, root_pid: int, others: list[int] | None = None, servers: Path | None = None) -> None:
        super().__init__(daemon=True)
        self.root_pid = root_pid
        self.others = others or []  # more trees summed with it (a pipeline server's)
        self.servers = servers  # the directory of the pipeline servers started for the runs (`auto_server`)
        self.peak = 0
        self.peak_pss = 0
        self.peak_processes = 0
        self._cpu: dict[int, tuple[str, float]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            started = list(auto_server.servers(self.servers)) if self.servers is not None else []
            tree = process_tree([self.root_pid, *self.others, *started], self._cpu)
            rss, pss, processes = tree.rss, tree.pss, tree.processes
            if rss > self.peak:
                self.peak, self.peak_processes = rss, processes
            self.peak_pss = max(self.peak_pss, pss)
            self.stop.wait(MEMORY_SAMPLE_SECONDS)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user and system) by kind of process: the daemon, its code server, the run workers, the JVMs,
        the pipeline server's Python."""
        kinds: dict[str, float] = {}
        for kind, seconds in self._cpu.values():
            kinds[kind] = round(kinds.get(kind, 0.0) + seconds, 1)
        return kinds

    def run_processes(self) -> dict[str, int]:
        """How many run workers were seen, by how their process started: forked from the code server's forkserver
        (`resources.run_processes`) or spawned as a fresh Python."""
        kinds = [kind for kind, _ in self._cpu.values()]
        return {"forked": kinds.count(FORKED_RUN_WORKERS), "spawned": kinds.count(SPAWNED_RUN_WORKERS)}


FORKSERVER, FORKED_RUN_WORKERS, SPAWNED_RUN_WORKERS = "forkserver", "run workers", "run workers (spawned)"
# A process's kind, by the first of these its command line holds; a forkserver's children share its command line.
_PROCESS_KINDS = (("java", "JVMs"), ("dagster-daemon", "daemon"), ("dagster._daemon", "daemon"),
                  ("dagster_webserver", "webserver"), ("dagster-webserver", "webserver"), ("code-server start", "code server proxy"),
                  ("dagster dev", "dagster dev"), ("api grpc", "code server"),
                  ("multiprocessing.forkserver", FORKSERVER), ("execute_run", SPAWNED_RUN_WORKERS),
                  ("multiprocessing.spawn", SPAWNED_RUN_WORKERS), ("serve", "pipeline server"))


@dataclasses.dataclass(frozen=True)
class TreeMemory:
    rss: int  # bytes resident, summed over the processes
    pss: int  # bytes, each shared page divided among the processes that share it
    processes: int


def process_tree(root_pids: Iterable[int], cpu: dict[int, tuple[str, float]] | None = None) -> TreeMemory:
    """The memory of the processes `root_pids` and their descendants (each counted once), and how many processes
    they are; each one's CPU seconds so far into `cpu` (pid: its kind and the seconds)."""
    children: dict[int, list[int]] = {}
    resident: dict[int, int] = {}
    ticks: dict[int, int] = {}
    page, tick = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_CLK_TCK")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            pages = int(Path(entry.path, "statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
        fields = stat.rsplit(")", 1)[1].split()
        parent = int(fields[1])
        children.setdefault(parent, []).append(int(entry.name))
        resident[int(entry.name)] = pages * page
        ticks[int(entry.name)] = int(fields[11]) + int(fields[12])
    rss, pss, count = 0, 0, 0
    stack: list[tuple[int, str]] = [(pid, "") for pid in root_pids]
    counted: set[int] = set()
    while stack:
        pid, parent_kind = stack.pop()
        if pid not in resident or pid in counted:
            continue
        counted.add(pid)
        rss += resident[pid]
        pss += _proportional_bytes(pid)
        count += 1
        known = cpu.get(pid) if cpu is not None else None
        kind = known[0] if known else _process_kind(pid, parent_kind)
        if cpu is not None:
            cpu[pid] = (kind, ticks[pid] / tick)
        stack.extend((child, kind) for child in children.get(pid, ()))
    return TreeMemory(rss, pss, count)


def _proportional_bytes(pid: int) -> int:
    """A process's proportional set size (`Pss` of /proc/PID/smaps_rollup), 0 when it has ended or is not readable."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _process_kind(pid: int, parent_kind: str) -> str:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    kind = next((kind for marker, kind in _PROCESS_KINDS if marker in command), "other")
    return FORKED_RUN_WORKERS if kind == FORKSERVER and parent_kind == FORKSERVER else kind


def _runs(home: Path) -> dict[str, Any]:
    """The runs the instance in `home` recorded: launched, failed (with the first failures' messages), and their
    seconds queued and running."""
    # Read by the Dagster layer's `resources.run_records` in a Python of its own: the engine imports no Dagster.
    read = subprocess.run([sys.executable, "-m", "resources.run_records", str(home)], cwd=checkout(),
                          capture_output=True, text=True, check=True,
                          timeout=300)
    found = json.loads(read.stdout.strip().splitlines()[-1])
    records = found["runs"]
    queued = [run["start"] - run["created"] for run in records if run["start"]]
    ran = [run["end"] - run["start"] for run in records if run["start"] and run["end"]]
    # From the launcher's taking the run to the run's start: its process's start and its code's load.
    launched = [run["start"] - run["starting"] for run in records if run["start"] and run.get("starting")]
    return {"launched": len(records), "failed": sum(1 for run in records if run["status"] == "FAILURE"),
            "failures": found["failures"],
            "served": sum(1 for run in records if run.get("engine") == "served"),
            "standing": sum(1 for run in records if run.get("standing")),
            "by_sensor": dict(sorted(Counter(run.get("sensor") or "none" for run in records).items())),
            "launch_p50": _rounded(percentile(launched, 0.5)), "launch_max": _rounded(max(launched, default=None)),
            "queued_p50": _rounded(percentile(queued, 0.5)), "queued_max": _rounded(max(queued, default=None)),
            "run_p50": _rounded(percentile(ran, 0.5)), "run_max": _rounded(max(ran, default=None)),
            "not_ended": sum(1 for run in records if run["status"] not in ("SUCCESS", "FAILURE", "CANCELED"))}


def _rounded(seconds: float | None) -> float | None:
    """Seconds to a tenth, None for no value (no run started or ended: JSON has no NaN)."""
    return None if seconds is None or seconds != seconds else round(seconds, 1)


def describe(result: dict[str, Any]) -> str:
    trickle, runs = result["trickle"], result["runs"]
    lines = [
        f"{result['databases']} tenant databases x {result['tables_per_database']} tables ({result['mode']}, "
        f"{result['connectors']} connector(s)) under Dagster's daemon"
        f"{' with a pipeline server beside it' if result.get('served') else ''}"
        f"{' (a pipeline server started by the runs)' if result.get('auto_served') else ''}:",
        f"  exact: {result['tables_exact']}/{result['tables']} tables, "
        f"{result['exact_seconds'] if result['exact_seconds'] is not None else 'not'} s after the daemon's start",
        f"  trickle (a row every {trickle['interval_seconds']} s for {trickle['seconds']} s): p50 / p90 / max "
        f"{trickle['p50']} / {trickle['p90']} / {trickle['max']} s; {trickle['arrived']}/{trickle['rows']} rows "
        f"applied, {trickle['not_applied']} not applied within the tail",
    ]
    if "new_tenant" in result:
        seconds = result["new_tenant"]["exact_seconds"]
        lines.append(f"  new tenant {result['new_tenant']['database']}: "
                     f"{f'exact {seconds} s after its rows were committed' if seconds is not None else 'not exact'}")
    server = result.get("served") or result.get("auto_served")
    lines.append(f"  peak memory (the daemon's process tree{' and the server' if server else ''}): "
                 f"{result.get('peak_pss_mb')} MB proportional (PSS, shared pages divided among their processes), "
                 f"{result['peak_rss_mb']} MB summed RSS in {result['peak_processes']} processes")
    if result.get("cpu_seconds"):
        lines.append("  CPU seconds by process: " + ", ".join(f"{kind} {seconds}" for kind, seconds in
                                                              sorted(result["cpu_seconds"].items())))
    lines.append(f"  runs: {runs['launched']} launched ({runs.get('served', 0)} tagged served), {runs['failed']} "
                 f"failed, {runs['not_ended']} still going at the end; queued p50 {runs['queued_p50']} s, max "
                 f"{runs['queued_max']} s; process start to run start p50 {runs.get('launch_p50')} s, max "
                 f"{runs.get('launch_max')} s; ran p50 {runs['run_p50']} s, max {runs['run_max']} s")
    if result.get("run_processes"):
        lines.append(f"  run processes: {result['run_processes']['forked']} forked from the code server's forkserver, "
                     f"{result['run_processes']['spawned']} spawned")
    return "\n".join(lines)
