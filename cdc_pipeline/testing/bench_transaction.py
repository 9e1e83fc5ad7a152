"""`cdc-pipeline bench --transaction-rows N`: one source transaction of N row changes (one UPDATE of every row of an
N-row table) on a MariaDB source (or a PostgreSQL one: `--load-source postgres`), applied with the connector's
defaults by fresh `cdc-pipeline sync` processes.

On throwaway servers: the bench's `items` table (6 mixed columns, `bench.items_table_statements`) of N rows is
loaded and checked; then one UPDATE adds 1 to every row's `qty` in one source transaction. Then:

- the kill: a fresh `sync` process is started and killed with SIGKILL once its destination transaction has been
  open for `KILL_AFTER_SECONDS` (groups of the transaction applied inside it, none committed); a reader then finds
  the destination at the previous commit (the fingerprint of every column as loaded);
- the catch-up: fresh `sync` processes until caught up, while a reader sums `qty` in the destination every
  `READ_INTERVAL_SECONDS`: every read must see the total before the transaction or after it, never one between
  (`partial_reads`); at the end the destination must equal the source (`exact`). Its seconds, rows/s, and the
  peak resident memory of the driver JVM and of the Python process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from cdc_pipeline.testing.bench import (CAPTURE_PASSWORD, CAPTURE_USER, DATABASE, _connector_env,
                                        create_postgres_items, destination_items_fingerprint, load_source,
                                        postgres_load_connector, source_items_fingerprint)
from cdc_pipeline.testing.bench_tables import summarize_runs, sync_until_done
from cdc_pipeline.testing.servers import MariaDbServer, PostgresServer, start_postgres, start_source

TRANSACTION_ROWS = 1_000_000
KILL_AFTER_SECONDS = 3.0  # how long the killed run's destination transaction is open before the kill
KILL_DEADLINE_SECONDS = 600.0
READ_INTERVAL_SECONDS = 0.2
CONNECTOR = "load_spark"  # the connector `measure_sync_process` configures for the bulk engine
DEST_DATABASE = f"{DATABASE}_spark"


def _qty_total(conn: psycopg.Connection, schema: str) -> int:
    return int(conn.execute(sql.SQL("SELECT coalesce(sum(qty), 0) FROM {}").format(
        sql.Identifier(schema, "items"))).fetchone()[0])


def _open_transaction_seconds(destination: PostgresServer) -> float:
    """How long the oldest transaction of another session in the destination database has been open."""
    with psycopg.connect(destination.dsn(DEST_DATABASE), autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(max(extract(epoch FROM now() - xact_start)), 0) FROM pg_stat_activity "
                           "WHERE datname = %s AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                           (DEST_DATABASE,)).fetchone()
    return float(row[0])


def kill_inside(destination: PostgresServer, work: Path) -> dict[str, Any]:
    """Starts a `sync` and kills its process group once a destination transaction of it was open long enough."""
    env = _connector_env(work, CONNECTOR, destination, DEST_DATABASE)
    # Its log goes to a file: a pipe nobody reads would hold the run up once full.
    log_path = work / "killed_run.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen([sys.executable, "-m", "cdc_pipeline.ops.cli", "sync", CONNECTOR], env=env,
                                   stdout=subprocess.DEVNULL, stderr=log_file, start_new_session=True)
    started = time.monotonic()
    try:
        while _open_transaction_seconds(destination) < KILL_AFTER_SECONDS:
            if process.poll() is not None:
                raise RuntimeError("the run ended before it could be killed inside the transaction: "
                                   f"{log_path.read_text()[-2000:]}")
            if time.monotonic() - started > KILL_DEADLINE_SECONDS:
                raise RuntimeError("no destination transaction stayed open long enough to kill the run inside it")
            time.sleep(0.2)
        killed_after = time.monotonic() - started
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    # The destination ends the killed session's transaction once it sees the connection gone.
    deadline = time.monotonic() + 60
    while _open_transaction_seconds(destination) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    return {"killed_after_seconds": round(killed_after, 1)}


class _Reader(threading.Thread):
    """Sums `qty` in the destination until stopped; counts the reads that saw neither `before` nor `after`."""

    def __init__(self, destination: PostgresServer, schema: str, before: int, after: int) -> None:
        super().__init__(daemon=True)
        self.destination, self.schema, self.before, self.after = destination, schema, before, after
        self.reads = self.partial = 0
        self.seen: set[int] = set()
        self._done = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.destination.dsn(DEST_DATABASE), autocommit=True) as conn:
            while not self._done.wait(READ_INTERVAL_SECONDS):
                total = _qty_total(conn, self.schema)
                self.reads += 1
                if total not in (self.before, self.after):
                    self.partial += 1
                    self.seen.add(total)

    def stop(self) -> None:
        self._done.set()
        self.join()


def run_transaction(rows: int = TRANSACTION_ROWS, source_type: str = "mariadb") -> dict[str, Any]:
    """The scenario on fresh servers (a MariaDB source, or a PostgreSQL one's `public.items`); its figures and
    checks."""
    results: dict[str, Any] = {"rows": rows, "source": source_type}
    with tempfile.TemporaryDirectory(prefix="cdc-bench-transaction-") as tmp, \
            start_source(source_type) as source, \
            start_postgres() as destination:
        work = Path(tmp)
        mariadb = source if isinstance(source, MariaDbServer) else None
        if mariadb is not None:
            mariadb.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
            load_source(mariadb, rows, DATABASE)
            connector = None
        else:
            create_postgres_items(source, DATABASE, rows)
            connector = postgres_load_connector(source)
        # The destination's schema of `items`: the source database's name (MariaDB) or its schema (PostgreSQL).
        schema = DATABASE if mariadb is not None else "public"

        def exact() -> bool:
            theirs = (source_items_fingerprint(mariadb, DATABASE) if mariadb is not None else
                      destination_items_fingerprint(source, "public", DATABASE))
            return theirs == destination_items_fingerprint(destination, schema, DEST_DATABASE)

        def catch_up(new_destination: bool) -> list[dict[str, Any]]:
            return sync_until_done(mariadb, destination, work, new_destination=new_destination, database=DATABASE,
                                   connector=connector)

        results["load"] = summarize_runs(catch_up(new_destination=True))
        results["load"]["exact"] = exact()
        loaded = destination_items_fingerprint(destination, schema, DEST_DATABASE)
        with psycopg.connect(destination.dsn(DEST_DATABASE), autocommit=True) as conn:
            before = _qty_total(conn, schema)
        started = time.monotonic()
        update = "UPDATE items SET qty = qty + 1, note = CONCAT('u', note)"
        if mariadb is not None:
            mariadb.execute([update], database=DATABASE)
        else:
            source.execute([update], dbname=DATABASE)
        results["source_update_seconds"] = round(time.monotonic() - started, 1)

        results["kill"] = kill_inside(destination, work)
        results["kill"]["at_previous_commit"] = destination_items_fingerprint(
            destination, schema, DEST_DATABASE) == loaded

        reader = _Reader(destination, schema, before, before + rows)
        reader.start()
        try:
            runs = catch_up(new_destination=False)
        finally:
            reader.stop()
        caught = summarize_runs(runs)
        caught["rows_per_second"] = round(rows / caught["seconds"]) if caught["seconds"] else None
        caught["exact"] = exact()
        caught["reads"], caught["partial_reads"] = reader.reads, reader.partial
        caught["partial_totals_seen"] = sorted(reader.seen)[:10]
        results["catch_up"] = caught
    results["succeeded"] = bool(results["load"]["exact"] and results["kill"]["at_previous_commit"]
                                and caught["exact"] and caught["partial_reads"] == 0)
    return results


def describe(results: dict[str, Any]) -> str:
    caught, kill = results["catch_up"], results["kill"]
    return "\n".join([
        f"one source transaction of {results['rows']:,} row changes ({results.get('source', 'mariadb')}, the "
        "connector's defaults)",
        f"  killed after {kill['killed_after_seconds']} s inside it: destination at the previous commit: "
        f"{kill['at_previous_commit']}",
        f"  catch-up: {caught['seconds']} s in {caught['runs']} run(s), {caught['rows_per_second']} rows/s, "
        f"peak RSS JVM {caught['peak_rss_mb_jvm']} MB, Python {caught['peak_rss_mb_python']} MB, exact: "
        f"{caught['exact']}",
        f"  reader: {caught['reads']} reads of the destination's total, {caught['partial_reads']} of a partial "
        "transaction",
    ])
