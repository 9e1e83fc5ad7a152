"""`cdc-pipeline bench --bank N`: a bank of N accounts on a MariaDB or PostgreSQL source (`--load-source`) whose
every source transaction keeps the total, applied with the connector's defaults by fresh `cdc-pipeline sync`
processes while a reader of the destination sums the balances every `READ_PAUSE_SECONDS`.

On throwaway servers: `accounts` (N rows of 100) is loaded by a first run. Then:

- the catch-up: a backlog written while no run is on (`transfers` transactions of `PAIRS` transfers each, a debit and a credit statement, with
  `WHOLE_TABLE_TRANSACTIONS` transactions that move money between every even and every odd account among them) is
  caught up by fresh `sync` processes;
- the stream: a `sync --linger` process (the connector's `linger_seconds`) follows a writer committing transfers at `STREAM_RATE` transactions/s for
  `stream_seconds`, with a whole-table transaction every `STREAM_WHOLE_TABLE_EVERY_SECONDS`; once the writer stops,
  fresh `sync` processes until caught up.

Every read must see the bank's total (`partial_reads` counts those that did not: a source transaction applied in
part); at the end of each phase the destination must equal the source (`exact`).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psycopg
from psycopg import sql

from cdc_pipeline.config import DEFAULT_LINGER_SECONDS
from cdc_pipeline.testing.bench import CAPTURE_PASSWORD, CAPTURE_USER, _connector_env, measure_sync_process
from cdc_pipeline.testing.bench_tables import summarize_runs, sync_until_done
from cdc_pipeline.testing.servers import MariaDbServer, PostgresServer, start_postgres, start_source

ACCOUNTS = 20_000
BALANCE = 100
TRANSFERS = 3_000  # the backlog's transfer transactions
PAIRS = 10  # transfers per transfer transaction (two row changes each)
WHOLE_TABLE_TRANSACTIONS = 2  # among the backlog's transfers
STREAM_SECONDS = 60.0
STREAM_RATE = 20.0  # transactions/s while streaming
STREAM_WHOLE_TABLE_EVERY_SECONDS = 15.0
READ_PAUSE_SECONDS = 0.005
DATABASE = "bank"
CONNECTOR = "load_spark"  # the connector `measure_sync_process` configures for the bulk engine
DEST_DATABASE = f"{DATABASE}_spark"
STREAM_END_TIMEOUT_SECONDS = 600.0


class _Source:
    """The bank on its source: MariaDB's database `bank` or PostgreSQL's `bank.public`."""

    def __init__(self, server: MariaDbServer | PostgresServer) -> None:
        self.server = server
        self.mariadb = isinstance(server, MariaDbServer)

    def create(self, accounts: int) -> None:
        numbers = f"seq_1_to_{accounts}" if self.mariadb else f"generate_series(1, {accounts}) AS seq"
        statements = ["CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL)",
                      f"INSERT INTO accounts SELECT seq, {BALANCE} FROM {numbers}"]
        if self.mariadb:
            self.server.execute(f"CREATE DATABASE {DATABASE}")
            self.server.execute(statements, database=DATABASE)
        else:
            self.server.create_database(DATABASE)
            self.server.execute(statements, dbname=DATABASE)

    def connect(self) -> Any:
        if isinstance(self.server, MariaDbServer):
            return self.server.connect(DATABASE)
        return psycopg.connect(self.server.dsn(DATABASE))

    def connector(self) -> dict[str, Any]:
        """The connector's source fields (`measure_sync_process`): the connector's defaults otherwise."""
        if isinstance(self.server, MariaDbServer):
            return {"type": "mariadb", "hostname": "127.0.0.1", "port": self.server.port, "user": CAPTURE_USER,
                    "tables": [f"{DATABASE}.accounts"]}
        return {"type": "postgres", "hostname": self.server.host, "port": self.server.port,
                "user": self.server.superuser, "tables": ["public.accounts"]}

    def rows(self) -> list[tuple[int, int]]:
        with self.connect() as conn:
            cursor = conn.cursor()
            cursor.execute("SELECT id, balance FROM accounts ORDER BY id")
            return [(int(key), int(balance)) for key, balance in cursor.fetchall()]


def transfer_statements(accounts: int, rng: random.Random) -> list[str]:
    """One transfer transaction's statements: PAIRS transfers between two distinct accounts, each a debit and a
    credit."""
    statements = []
    for _ in range(PAIRS):
        payer, payee = rng.sample(range(1, accounts + 1), 2)
        amount = rng.randint(1, 50)
        statements += [f"UPDATE accounts SET balance = balance - {amount} WHERE id = {payer}",
                       f"UPDATE accounts SET balance = balance + {amount} WHERE id = {payee}"]
    return statements


def whole_table_statements(step: int) -> list[str]:
    """One transaction of every account (an even number of them): the even ones gain `step`, the odd ones lose it,
    in two statements."""
    return [f"UPDATE accounts SET balance = balance + {step} WHERE id % 2 = 0",
            f"UPDATE accounts SET balance = balance - {step} WHERE id % 2 = 1"]


def _commit_each(source: _Source, transactions: Callable[[], list[str] | None]) -> int:
    """Commits each transaction `transactions()` gives until it gives None; returns the row changes written."""
    changes = 0
    with source.connect() as conn:
        cursor = conn.cursor()
        while (statements := transactions()) is not None:
            if source.mariadb:
                conn.begin()  # (the server's connection commits each statement otherwise)
            for statement in statements:
                cursor.execute(statement)
                changes += cursor.rowcount
            conn.commit()
    return changes


def write_backlog(source: _Source, accounts: int, transfers: int, rng: random.Random) -> int:
    """The backlog's transactions; returns its row changes."""
    whole_at = {transfers * (index + 1) // (WHOLE_TABLE_TRANSACTIONS + 1): index + 1
                for index in range(WHOLE_TABLE_TRANSACTIONS)}
    written = 0

    def next_transaction() -> list[str] | None:
        nonlocal written
        if written >= transfers + len(whole_at):
            return None
        written += 1
        step = whole_at.get(written)
        return whole_table_statements(step) if step else transfer_statements(accounts, rng)

    return _commit_each(source, next_transaction)


class _Reader(threading.Thread):
    """Sums the destination's balances until stopped; counts the reads that did not see the bank's total."""

    def __init__(self, destination: PostgresServer, schema: str, total: int) -> None:
        super().__init__(daemon=True)
        self.destination, self.total = destination, total
        self.query = sql.SQL("SELECT coalesce(sum(balance), 0) FROM {}").format(sql.Identifier(schema, "accounts"))
        self.reads = self.partial = 0
        self.seen: set[int] = set()
        self._done = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.destination.dsn(DEST_DATABASE), autocommit=True) as conn:
            while not self._done.wait(READ_PAUSE_SECONDS):
                total = int(conn.execute(self.query).fetchone()[0])
                self.reads += 1
                if total != self.total:
                    self.partial += 1
                    self.seen.add(total - self.total)

    def stop(self) -> dict[str, Any]:
        self._done.set()
        self.join()
        return {"reads": self.reads, "partial_reads": self.partial, "partial_offsets_seen": sorted(self.seen)[:10]}


def _destination_schema(destination: PostgresServer) -> str:
    """Where the connector put `accounts`: the source database's name (MariaDB) or its schema (PostgreSQL)."""
    with psycopg.connect(destination.dsn(DEST_DATABASE), autocommit=True) as conn:
        return conn.execute("SELECT table_schema FROM information_schema.tables WHERE table_name = 'accounts' "
                            "ORDER BY table_schema = 'public' LIMIT 1").fetchone()[0]


def _destination_rows(destination: PostgresServer, schema: str) -> list[tuple[int, int]]:
    with psycopg.connect(destination.dsn(DEST_DATABASE), autocommit=True) as conn:
        query = sql.SQL("SELECT id, balance FROM {} ORDER BY id").format(sql.Identifier(schema, "accounts"))
        return [(int(key), int(balance)) for key, balance in conn.execute(query).fetchall()]


def _sync_until_idle(source: _Source, destination: PostgresServer, work: Path,
                     new_destination: bool = False) -> list[dict[str, Any]]:
    return sync_until_done(source.server if isinstance(source.server, MariaDbServer) else None, destination, work,
                           new_destination, DATABASE, connector=source.connector())


def _stream(source: _Source, destination: PostgresServer, work: Path, accounts: int, seconds: float,
            rng: random.Random) -> dict[str, Any]:
    """A `sync --linger` process following the writer; then fresh processes until caught up."""
    env = _connector_env(work, CONNECTOR, destination, DEST_DATABASE)
    log_path = work / "stream_run.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen([sys.executable, "-m", "cdc_pipeline.ops.cli", "sync", CONNECTOR, "--linger",
                                    "--json"], env=env, stdout=subprocess.PIPE,
                                   stderr=log_file, text=True)
    began = time.monotonic()
    transactions = 0
    next_whole = began + STREAM_WHOLE_TABLE_EVERY_SECONDS
    whole = 0

    def next_transaction() -> list[str] | None:
        nonlocal transactions, next_whole, whole
        now = time.monotonic()
        if now - began >= seconds:
            return None
        time.sleep(max(0.0, began + transactions / STREAM_RATE - now))
        transactions += 1
        if time.monotonic() >= next_whole:
            next_whole += STREAM_WHOLE_TABLE_EVERY_SECONDS
            whole += 1
            return whole_table_statements(100 + whole)
        return transfer_statements(accounts, rng)

    changes = _commit_each(source, next_transaction)
    try:
        out, _ = process.communicate(timeout=STREAM_END_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    if process.returncode:
        raise RuntimeError(f"the lingering sync failed: {log_path.read_text()[-2000:]}")
    summary = json.loads(out.strip().splitlines()[-1])
    after = _sync_until_idle(source, destination, work)
    return {"seconds": round(seconds, 1), "transactions": transactions, "whole_table_transactions": whole,
            "changes": changes, "lingering_run_events": summary.get("events"), "runs_after": len(after)}


def run_bank(source_type: str = "mariadb", accounts: int = ACCOUNTS, transfers: int = TRANSFERS,
             stream_seconds: float = STREAM_SECONDS) -> dict[str, Any]:
    """The scenario on fresh servers; its figures and checks."""
    from cdc_pipeline.capture.runner import build_runner

    build_runner()
    accounts += accounts % 2  # an even number: a whole-table transaction keeps the total
    results: dict[str, Any] = {"source": source_type, "accounts": accounts}
    rng = random.Random(51)
    with tempfile.TemporaryDirectory(prefix="cdc-bench-bank-") as tmp:
        work = Path(tmp)
        with start_source(source_type, work) as server, start_postgres(work) as destination:
            if isinstance(server, MariaDbServer):
                server.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
            source = _Source(server)
            source.create(accounts)
            load = summarize_runs(_sync_until_idle(source, destination, work, new_destination=True))
            schema = _destination_schema(destination)
            load["exact"] = _destination_rows(destination, schema) == source.rows()
            results["load"] = load
            total = accounts * BALANCE

            changes = write_backlog(source, accounts, transfers, rng)
            reader = _Reader(destination, schema, total)
            reader.start()
            try:
                caught = summarize_runs(_sync_until_idle(source, destination, work))
            finally:
                reads = reader.stop()
            caught.update(reads)
            caught["backlog_changes"] = changes
            caught["changes_per_second"] = round(changes / caught["seconds"]) if caught["seconds"] else None
            caught["exact"] = _destination_rows(destination, schema) == source.rows()
            results["catch_up"] = caught

            reader = _Reader(destination, schema, total)
            reader.start()
            try:
                streamed = _stream(source, destination, work, accounts, stream_seconds, rng)
            finally:
                reads = reader.stop()
            streamed.update(reads)
            streamed["exact"] = _destination_rows(destination, schema) == source.rows()
            results["stream"] = streamed
    results["succeeded"] = bool(load["exact"] and caught["exact"] and streamed["exact"]
                                and caught["partial_reads"] == 0 and streamed["partial_reads"] == 0)
    return results


def describe(results: dict[str, Any]) -> str:
    caught, streamed = results["catch_up"], results["stream"]
    return "\n".join([
        f"a bank of {results['accounts']:,} accounts on {results['source']} (the connector's defaults)",
        f"  catch-up of {caught['backlog_changes']:,} changes: {caught['seconds']} s in {caught['runs']} run(s), "
        f"{caught['changes_per_second']} changes/s, peak RSS JVM {caught['peak_rss_mb_jvm']} MB, exact: "
        f"{caught['exact']}; reader: {caught['reads']} reads, {caught['partial_reads']} of a partial transaction",
        f"  stream of {streamed['transactions']} transactions ({streamed['whole_table_transactions']} of the whole "
        f"table, {streamed['changes']:,} changes) in {streamed['seconds']} s by `sync --linger` (linger_seconds {DEFAULT_LINGER_SECONDS:g}) "
        f"(+{streamed['runs_after']} run(s) after): exact: {streamed['exact']}; reader: {streamed['reads']} reads, "
        f"{streamed['partial_reads']} of a partial transaction",
        "  " + ("OK" if results["succeeded"] else "FAILED"),
    ])
