"""The bench's one-shot peers for the initial load: pgloader (MariaDB/MySQL to PostgreSQL) and pgcopydb (PostgreSQL
to PostgreSQL), each timed beside fresh `cdc-pipeline sync` processes copying the same table on the same servers.

Both are Debian packages (`pgloader`, `pgcopydb`), installed with apt-get when their executable is missing
(`ensure_loader`), as the servers are. Each runs with its own defaults, as a user starts from: `pgloader
mysql://... postgresql://...` (it creates the schema, the table and its indexes), `pgcopydb clone --source ...
--target ... --dir ... --no-owner --no-acl`.

The table is the bench's `items` (6 columns) with one secondary non-unique index, `items_created (created)`. Each
run, on the same servers, measures the copy ceiling (`bench.measure_copy_ceiling` or
`bench.measure_postgres_copy_ceiling`), then both sides, alternating which goes first, each into a destination
database made afresh: cdc-pipeline's fresh `sync` processes (the connector's defaults) until the destination equals
the source, and the peer's process. Each side's time is the wall clock of its whole processes; its copy is checked
with the bench's fingerprint of every column, and the destination table's indexes are listed, so that the reader
sees whether each side built the secondary index.

Testing support only: the engine never imports this module.
"""

from __future__ import annotations

import logging
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import quote

import psycopg
from psycopg import sql

from cdc_pipeline.config import DEFAULT_HEARTBEAT_TABLE
from cdc_pipeline.testing.bench import (CAPTURE_PASSWORD, CAPTURE_USER, LOAD_DATABASE, create_postgres_items,
                                        destination_fingerprints, load_source, measure_copy_ceiling,
                                        measure_postgres_copy_ceiling, measure_sync_process, postgres_load_connector,
                                        source_items_fingerprint, sum_cycle_seconds, write_sync_config)
from cdc_pipeline.testing.bench_server import serve_connector, server_peak_mb
from cdc_pipeline.testing.servers import (MariaDbServer, PostgresServer, _apt_install, end_process_group,
                                          start_postgres, start_source)

log = logging.getLogger(__name__)

LOADER_BY_SOURCE = {"mariadb": "pgloader", "postgres": "pgcopydb"}
"""The peer of each source type: its executable, which is also the name of its Debian package."""

SECONDARY_INDEX = "items_created"
SECONDARY_INDEX_COLUMN = "created"
OURS = "cdc-pipeline"
SYNC_ENGINE = "spark"
# Fresh `sync` processes one run may take before the bench gives up on the destination becoming exact.
MAX_SYNCS = 4
LOADER_TIMEOUT_SECONDS = 3600
OUTPUT_TAIL_LINES = 30


def missing_packages(loaders: Sequence[str], path: str | None = None) -> list[str]:
    """The Debian packages of `loaders` whose executable is not on `path` (the PATH when None)."""
    return [loader for loader in loaders if shutil.which(loader, path=path) is None]


def ensure_loader(loader: str, path: str | None = None) -> str:
    """The path of `loader`'s executable; installs its Debian package with apt-get first when it is missing."""
    missing = missing_packages([loader], path)
    if missing:
        log.info("%s not found; installing the Debian package %s", loader, " ".join(missing))
        _apt_install(missing)
    found = shutil.which(loader, path=path)
    if found is None:
        raise RuntimeError(f"{loader} is still missing after installing its Debian package")
    return found


def package_version(package: str) -> str | None:
    """The installed version of a Debian package, as dpkg records it, or None."""
    result = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True,
                            check=False)
    if result.returncode:
        return None
    return result.stdout.strip() or None


def mysql_url(host: str, port: int, user: str, password: str, database: str) -> str:
    """pgloader's URL of a MySQL/MariaDB source database."""
    return f"mysql://{quote(user, safe='')}:{quote(password, safe='')}@{host}:{port}/{quote(database, safe='')}"


def pgloader_command(executable: str, source_url: str, target_url: str) -> list[str]:
    """pgloader copying the whole source database into the target with its defaults (schema, data, indexes)."""
    return [executable, source_url, target_url]


def pgcopydb_command(executable: str, source_url: str, target_url: str, work_dir: Path) -> list[str]:
    """pgcopydb cloning the source database into the target with its defaults; objects owned by the target's user,
    no privileges copied."""
    return [executable, "clone", "--source", source_url, "--target", target_url, "--dir", str(work_dir),
            "--no-owner", "--no-acl"]


def run_loader(command: Sequence[str]) -> float:
    """Runs a peer's process to its end; its wall seconds, or RuntimeError with its output's tail."""
    started = time.monotonic()
    result = subprocess.run(list(command), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=LOADER_TIMEOUT_SECONDS, check=False)
    seconds = time.monotonic() - started
    if result.returncode:
        output = "\n".join((result.stdout + result.stderr).strip().splitlines()[-OUTPUT_TAIL_LINES:])
        raise RuntimeError(f"{Path(command[0]).name} exited with {result.returncode}:\n{output}")
    return seconds


def table_indexes(server: PostgresServer, dbname: str, schema: str, table: str) -> list[str]:
    """The indexes of `schema.table`, each as its kind and columns (`PRIMARY KEY (id)`, `INDEX (created)`), by name;
    empty when the table is missing."""
    with psycopg.connect(server.dsn(dbname), autocommit=True) as conn:
        rows = conn.execute(
            """SELECT x.indisprimary, x.indisunique, pg_get_indexdef(x.indexrelid) FROM pg_index x
               JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = to_regclass(%s) ORDER BY i.relname""",
            (sql.Identifier(schema, table).as_string(conn),)).fetchall()
    return [index_summary(primary, unique, definition) for primary, unique, definition in rows]


def index_summary(primary: bool, unique: bool, definition: str) -> str:
    """An index's kind and columns from `pg_get_indexdef`'s text."""
    kind = "PRIMARY KEY" if primary else "UNIQUE" if unique else "INDEX"
    columns = re.search(r"USING \w+ (\(.*\))", definition)
    return f"{kind} {columns.group(1) if columns else definition}"


def has_secondary_index(indexes: Sequence[str]) -> bool:
    return f"INDEX ({SECONDARY_INDEX_COLUMN})" in indexes


def recreate_database(server: PostgresServer, name: str) -> None:
    """Drops `name` (its connections ended) and creates it empty."""
    server.drop_database(name)
    server.create_database(name)


def median_figures(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The medians over the runs: each side's seconds, the ratio peer seconds / our seconds (the median of each
    run's ratio) and the copy ceiling; whether every copy was exact."""
    return {"ours_seconds": round(statistics.median(run["ours"]["seconds"] for run in runs), 2),
            "peer_seconds": round(statistics.median(run["peer"]["seconds"] for run in runs), 2),
            "ratio": round(statistics.median(run["ratio"] for run in runs), 3),
            "ceiling_rows_per_second": round(statistics.median(run["ceiling_rows_per_second"] for run in runs)),
            "exact": all(run["ours"]["exact"] and run["peer"]["exact"] for run in runs)}


def run_figures(number: int, order: Sequence[str], ceiling_rows: int, ceiling_seconds: float,
                ours: dict[str, Any], peer: dict[str, Any]) -> dict[str, Any]:
    """One run's figures: both sides' and the ratio peer seconds / our seconds."""
    return {"run": number, "first": order[0], "ceiling_rows_per_second": round(ceiling_rows / ceiling_seconds),
            "ceiling_seconds": round(ceiling_seconds, 2), "ours": ours, "peer": peer,
            "ratio": round(peer["seconds"] / ours["seconds"], 3)}


class _Comparison:
    """Both sides' measurements on one source's servers: the copy ceiling, our syncs and the peer, each checked
    against the source's fingerprint of `items` (read once: the source is quiet). `served`: our syncs run their
    cycles on a pipeline server (`cdc-pipeline serve`, started by `start_server`), fresh client processes still."""

    def __init__(self, source: MariaDbServer | PostgresServer, destination: PostgresServer, work: Path,
                 served: bool = False) -> None:
        self.source, self.destination, self.work = source, destination, work
        self.served = served
        self.server: subprocess.Popen | None = None
        self.server_env: dict[str, str] = {}
        self.server_figures: dict[str, Any] = {}
        mariadb = isinstance(source, MariaDbServer)
        self.loader = LOADER_BY_SOURCE["mariadb" if mariadb else "postgres"]
        # The destination schema of `items`: both sides name it after the source's database (MariaDB) or keep the
        # source's schema (PostgreSQL).
        self.schema = LOAD_DATABASE if mariadb else "public"
        self.wanted = (source_items_fingerprint(source, LOAD_DATABASE) if mariadb else
                       destination_fingerprints(source, "public", LOAD_DATABASE, ["items"])["items"])

    def destination_fingerprint(self, dbname: str) -> list[Any] | None:
        return destination_fingerprints(self.destination, self.schema, dbname, ["items"])["items"]

    def measure_ceiling(self) -> tuple[int, float]:
        self.destination.execute("DROP TABLE IF EXISTS ceiling", dbname=LOAD_DATABASE)
        if isinstance(self.source, MariaDbServer):
            ceiling = measure_copy_ceiling(self.source, self.destination, LOAD_DATABASE, "items")
        else:
            ceiling = measure_postgres_copy_ceiling(self.source, self.destination, LOAD_DATABASE)
        return ceiling.events, ceiling.seconds

    def _connector(self) -> dict[str, Any]:
        return (postgres_load_connector(self.source) if isinstance(self.source, PostgresServer) else
                {"type": "mariadb", "hostname": "127.0.0.1", "port": self.source.port, "user": CAPTURE_USER,
                 "tables": [f"{LOAD_DATABASE}.items"]})

    def _ours_work(self, number: int) -> Path:
        """Where a run's syncs keep their connectors file: one for every run when served (the server's, read for
        each cycle), else one a run."""
        work = self.work / ("served" if self.served else f"run_{number}")
        work.mkdir(exist_ok=True)
        return work

    def start_server(self) -> None:
        """A pipeline server on our connector's file, once it listens, then one load through it into a scratch
        database (not counted: the server's first cycle pays its JIT and first Spark jobs, as every long-lived
        server does once)."""
        work = self._ours_work(0)
        name = write_sync_config(work, None, LOAD_DATABASE, SYNC_ENGINE, ["items"], self._connector())
        self.server, started, self.server_env = serve_connector(work, name, self.destination,
                                                                f"{LOAD_DATABASE}_{SYNC_ENGINE}")
        warm_up = self.measure_ours(0)
        self.server_figures = {"start_seconds": round(started, 2), "first_load_seconds": warm_up["seconds"],
                               "first_load_exact": warm_up["exact"]}

    def stop_server(self) -> None:
        if self.server is not None:
            self.server_figures["peak_rss_mb"] = server_peak_mb(self.server)
            end_process_group(self.server)
            self.server = None

    def measure_ours(self, number: int) -> dict[str, Any]:
        """Fresh `sync` processes, the connector's defaults, into a fresh destination database, until the
        destination equals the source (at most `MAX_SYNCS`; `seconds`: their summed wall seconds). When the load's
        withheld secondary index is not made again by then, one more fresh process (a quiet source's stream may
        reconcile the load in the next run): `seconds_with_index` counts it if the index is then there."""
        dbname = f"{LOAD_DATABASE}_{SYNC_ENGINE}"
        recreate_database(self.destination, dbname)
        work = self._ours_work(number)
        connector = self._connector()

        def sync() -> dict[str, Any]:
            return measure_sync_process(None, self.destination, work, LOAD_DATABASE, SYNC_ENGINE, ["items"],
                                        new_destination=False, connector=connector, extra_env=self.server_env)

        syncs = [sync()]
        exact = self.destination_fingerprint(dbname) == self.wanted
        while len(syncs) < MAX_SYNCS and (syncs[-1]["cycle"].get("bulk_snapshot_pending") or not exact):
            syncs.append(sync())
            exact = self.destination_fingerprint(dbname) == self.wanted
        indexes = table_indexes(self.destination, dbname, self.schema, "items")
        index_sync = None
        if exact and not has_secondary_index(indexes):
            index_sync = sync()
            indexes = table_indexes(self.destination, dbname, self.schema, "items")
        if isinstance(self.source, PostgresServer):
            # `measure_sync_process` names the connector load_<engine>, and its slot is cdc_<connector>.
            self._drop_capture_objects(f"cdc_load_{SYNC_ENGINE}")
        seconds = sum(run["seconds"] for run in syncs)
        with_index = has_secondary_index(indexes)
        return {"seconds": round(seconds, 2), "syncs": len(syncs), "exact": exact, "indexes": indexes,
                "secondary_index": with_index,
                "seconds_with_index": round(seconds + (index_sync["seconds"] if index_sync else 0), 2)
                if with_index else None,
                "index_sync_seconds": index_sync["seconds"] if index_sync else None,
                "rows": sum(run["rows"] for run in syncs), "cycle_seconds": sum_cycle_seconds(syncs),
                "peak_rss_mb_jvm": max(run["peak_rss_mb_jvm"] for run in syncs),
                "first_row_seconds": syncs[0]["cycle"].get("first_row_seconds")}

    def measure_peer(self, number: int) -> dict[str, Any]:
        """The peer's process into a fresh destination database: its wall seconds, rows, exactness, indexes."""
        dbname = f"{LOAD_DATABASE}_{self.loader}"
        recreate_database(self.destination, dbname)
        executable = ensure_loader(self.loader)
        target = self.destination.dsn(dbname)
        if isinstance(self.source, MariaDbServer):
            command = pgloader_command(executable, mysql_url("127.0.0.1", self.source.port, CAPTURE_USER,
                                                             CAPTURE_PASSWORD, LOAD_DATABASE), target)
        else:
            command = pgcopydb_command(executable, self.source.dsn(LOAD_DATABASE), target,
                                       self.work / f"pgcopydb_{number}")
        seconds = run_loader(command)
        found = self.destination_fingerprint(dbname)
        indexes = table_indexes(self.destination, dbname, self.schema, "items")
        return {"seconds": round(seconds, 2), "rows": int(found[0]) if found else 0,
                "exact": found == self.wanted, "indexes": indexes,
                "secondary_index": has_secondary_index(indexes)}

    def _drop_capture_objects(self, slot: str) -> None:
        """The replication slot, publication and heartbeat table our connector made on the PostgreSQL source, so
        that the next run starts afresh and the peer copies `items` alone."""
        with psycopg.connect(self.source.dsn(LOAD_DATABASE), autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                         (slot,))
            conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(slot)))
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(
                sql.Identifier(*DEFAULT_HEARTBEAT_TABLE.split("."))))


def measure_runs(comparison: _Comparison, runs: int) -> list[dict[str, Any]]:
    """`runs` runs on the comparison's servers, cdc-pipeline first in the odd ones, the peer first in the even
    ones."""
    loader = comparison.loader
    measured = []
    for number in range(1, runs + 1):
        ceiling_rows, ceiling_seconds = comparison.measure_ceiling()
        order = (OURS, loader) if number % 2 else (loader, OURS)
        figures = {name: comparison.measure_ours(number) if name == OURS else comparison.measure_peer(number)
                   for name in order}
        measured.append(run_figures(number, order, ceiling_rows, ceiling_seconds, figures[OURS], figures[loader]))
        log.info("run %d: cdc-pipeline %.2f s, %s %.2f s", number, figures[OURS]["seconds"], loader,
                 figures[loader]["seconds"])
    return measured


def create_source_table(source: MariaDbServer | PostgresServer, rows: int) -> None:
    """The source's `items` of `rows` rows in `LOAD_DATABASE`, with its secondary index (the capture user too, on
    MariaDB)."""
    index = f"CREATE INDEX {SECONDARY_INDEX} ON items ({SECONDARY_INDEX_COLUMN})"
    if isinstance(source, MariaDbServer):
        source.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
        load_source(source, rows, LOAD_DATABASE, "items")
        source.execute(index, database=LOAD_DATABASE)
    else:
        create_postgres_items(source, LOAD_DATABASE, rows)
        source.execute(index, dbname=LOAD_DATABASE)


def run_peer_loaders(source_type: str, rows: int, runs: int, served: bool = False) -> dict[str, Any]:
    """The initial load of `rows` rows from `source_type` (mariadb or postgres), `runs` times, cdc-pipeline against
    the source's peer (`LOADER_BY_SOURCE`) on the same throwaway servers; every run's figures and the medians.
    `served`: our fresh `sync` processes run their cycles on a pipeline server started (and warmed by one load)
    before the runs."""
    from cdc_pipeline.capture.runner import build_runner

    loader = LOADER_BY_SOURCE[source_type]
    ensure_loader(loader)
    build_runner()
    with tempfile.TemporaryDirectory(prefix="cdc-bench-") as directory:
        work = Path(directory)
        with start_source(source_type, work) as source, \
                start_postgres(work) as destination:
            create_source_table(source, rows)
            destination.create_database(LOAD_DATABASE)
            comparison = _Comparison(source, destination, work, served)
            try:
                if served:
                    comparison.start_server()
                measured = measure_runs(comparison, runs)
            finally:
                comparison.stop_server()
    return {"source": source_type, "rows": rows, "runs": runs, "peer": loader, "peer_version": package_version(loader),
            "served": comparison.server_figures if served else None,
            "median": median_figures(measured), "measured": measured}


def describe(results: dict[str, Any]) -> str:
    """The printed report: a line per run and the medians, then each side's indexes per run."""
    source = "MariaDB" if results["source"] == "mariadb" else "PostgreSQL"
    peer = results["peer"]
    served = results.get("served")
    through = "" if not served else (
        f", their cycles on a pipeline server (started in {served['start_seconds']} s; its first load, not counted, "
        f"{served['first_load_seconds']} s; peak {served.get('peak_rss_mb')} MB resident)")
    lines = [f"initial load of {results['rows']} rows from {source}: cdc-pipeline (fresh `sync` processes until "
             f"exact, the connector's defaults{through}) against {peer} {results['peer_version']} (its defaults), "
             f"each into a fresh destination database; wall seconds of the whole processes; ratio = {peer} s / "
             f"cdc-pipeline s; index: the secondary index {SECONDARY_INDEX} in the destination",
             f"{'run':>6} {'first':>12} {'ours s':>7} {'syncs':>5} {'load s':>7} {'index s':>7} {'+index s':>8} "
             f"{'peer s':>7} {'ratio':>6} {'exact ours/peer':>15} {'index ours/peer':>15} {'ceiling rows/s':>14}"]
    for run in results["measured"]:
        ours, theirs = run["ours"], run["peer"]
        cycle = ours["cycle_seconds"]
        lines.append(f"{run['run']:>6} {run['first']:>12} {ours['seconds']:>7} {ours['syncs']:>5} "
                     f"{_shown(cycle.get('load_seconds')):>7} {_shown(cycle.get('index_seconds')):>7} "
                     f"{_shown(ours['seconds_with_index']):>8} {theirs['seconds']:>7} {run['ratio']:>6} "
                     f"{_pair(ours['exact'], theirs['exact']):>15} "
                     f"{_pair(ours['secondary_index'], theirs['secondary_index']):>15} "
                     f"{run['ceiling_rows_per_second']:>14}")
    median = results["median"]
    lines.append(f"{'median':>6} {'':>12} {median['ours_seconds']:>7} {'':>5} {'':>7} {'':>7} {'':>8} "
                 f"{median['peer_seconds']:>7} {median['ratio']:>6} {'all' if median['exact'] else 'NOT all':>15} "
                 f"{'':>15} {median['ceiling_rows_per_second']:>14}")
    for run in results["measured"]:
        ours = run["ours"]
        further = ours.get("index_sync_seconds")
        lines.append(f"run {run['run']} indexes: cdc-pipeline {', '.join(ours['indexes']) or 'none'}"
                     + ("" if further is None else f" ({'made' if ours['secondary_index'] else 'not made'} by one "
                                                   f"more sync of {further} s)")
                     + f"; {peer} {', '.join(run['peer']['indexes']) or 'none'}")
    return "\n".join(lines)


def _shown(value: Any) -> str:
    return "-" if value is None else str(value)


def _pair(ours: bool, theirs: bool) -> str:
    return "/".join("yes" if flag else "NO" for flag in (ours, theirs))
