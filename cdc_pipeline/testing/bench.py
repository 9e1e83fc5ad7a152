"""`cdc-pipeline bench`: capture and pipeline rates on this machine, measured in one run against a baseline.

It starts its own throwaway MariaDB and PostgreSQL, loads N rows (6 mixed columns) and measures:
(a) raw capture: events/s popped from the Debezium runner and marked complete, nothing applied;
(b) end to end: events/s from the first fetched batch to the last destination commit, through the same
    cycle steps the Dagster job runs;
(c) the apply stage alone: rows/s from a parsed (cached) Spark DataFrame to committed, measured by a third
    connector whose batches are parsed and cached before the clock starts (tables in schema `apply_stage`);
(d) the ratio (b)/(a);
(e) the ceiling of any Spark pipeline on this machine: events/s when each group of batches is fetched and
    read by Spark (both row images of every event, as the pipeline reads them) and marked complete, with
    nothing converted or applied; and its ratio to (a), the most (d) can reach here;
for Debezium's snapshot and for a stream of inserts, updates and deletes. A warm-up pass over fewer rows in
another database runs every measurement once first, so that none of them pays alone for the JVM's compiling
(`run`).

The initial load (`measure_initial_load`, first, on a quiet machine): rows/s of a fresh `cdc-pipeline sync`
process, as a user runs it (the process's start included), copying a table of `--load-rows` rows with the bulk
snapshot engine, beside two figures measured in the same run: (i) the machine's copy ceiling, the plainest pipe
from the source to the destination (the `mariadb` client in batch mode streaming the table into `psql`'s
`COPY ... FROM STDIN`, no conversion), and (ii) the Debezium snapshot engine on the first `--debezium-load-rows`
rows of the same table (it keeps a run's batches in memory, so a whole large table does not fit one run).
`--verify-rows N` measures `cdc-pipeline verify` instead: the wall time of a fresh verify process over the same
table of N rows, loaded by the bulk engine first. `--tables N` measures N small tables against one table of as many
rows instead: their load and a catch-up of changes spread over them (`bench_tables`). `--value-mb 1,8,64` measures
rows of large values instead: their load and a stream updating every row, beside the copy ceiling (`bench_values`).
`--load-only --peer-loaders` measures the initial load against pgloader (MariaDB) or pgcopydb (PostgreSQL), `--runs`
times, each side into fresh destination databases (`peer_loaders`). `--busy-neighbour SECONDS` measures a quiet
connector whose server's other database commits thousands of transactions a second: the latency of its one change
after a quiet spell of SECONDS, scaled by rate (`bench_neighbour`). `--databases N` measures a MariaDB server of N
tenant databases under Dagster's daemon, as one connector or (`--connector-per-database`) N: the time until every
tenant table is exact, peak memory, a trickle's latency across tenants and the runs (`bench_tenants`).
It is a command, not a test.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Sequence

import psycopg
from psycopg import sql
from pyspark.sql import functions as F

from cdc_pipeline import cycle
from cdc_pipeline.config import PipelineConfig, parse_config
from cdc_pipeline.ops.pipeline_server import SERVER_ENV
from cdc_pipeline.testing import peer_chameleon, warm_driver
from cdc_pipeline.testing.servers import (MariaDbServer, PostgresServer, end_process_group, start_mariadb, start_postgres,
                                          start_source)
from cdc_pipeline.sources.quoting import quote_mysql

log = logging.getLogger(__name__)

CAPTURE_USER = "bench"
CAPTURE_PASSWORD = "bench-capture"
DATABASE = "bench"
WARMUP_ROWS = 20_000
LOAD_DATABASE = "bench_load"
LOAD_ROWS = 1_000_000
DEBEZIUM_LOAD_ROWS = 200_000
ITEMS_COLUMNS = "id, name, amount, qty, created, note"
ITEMS_CEILING_COLUMNS = ("id int PRIMARY KEY, name varchar(64), amount numeric(12,2), qty int, created timestamp(3), "
                         "note text")
# A fingerprint of every column of `items` (the source's dialect or PostgreSQL's in {epoch}).
ITEMS_FINGERPRINT = ("SELECT COUNT(*), SUM(id), SUM(qty), SUM(amount), SUM(LENGTH(name)), SUM(LENGTH(note)), "
                     "SUM(CASE WHEN created IS NULL THEN 0 ELSE {epoch} END) FROM {table}")
SOURCE_FINGERPRINT_EPOCH = "UNIX_TIMESTAMP(created) % 100000"
DESTINATION_FINGERPRINT_EPOCH = "(EXTRACT(EPOCH FROM created)::bigint % 100000)"


@dataclass
class Measurement:
    events: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def load_source(source: MariaDbServer, rows: int, database: str = DATABASE, table: str = "items") -> None:
    source.execute([f"CREATE DATABASE IF NOT EXISTS {database}"])
    source.execute(items_table_statements(table, rows), database=database)


def items_table_statements(table: str, rows: int) -> list[str]:
    """The statements creating a table of the bench's shape (`items`: 6 mixed columns) and filling it with `rows`
    rows, ids 1 to `rows`, generated by the server (MariaDB's sequence engine)."""
    return [
        f"""CREATE TABLE {quote_mysql(table)} (id INT PRIMARY KEY, name VARCHAR(64), amount DECIMAL(12,2), qty INT,
            created DATETIME(3), note TEXT)""",
        f"""INSERT INTO {quote_mysql(table)} SELECT seq, CONCAT('item-', seq), seq / 100, seq % 1000,
            TIMESTAMP('2024-01-01') + INTERVAL seq SECOND, REPEAT('x', seq % 50) FROM seq_1_to_{int(rows)}""",
    ]


def change_source(source: MariaDbServer, rows: int, database: str = DATABASE) -> int:
    """A stream of inserts, updates and deletes; returns the number of row changes."""
    inserts, updates, deletes = rows // 2, rows // 4, rows // 4
    source.execute([
        f"""INSERT INTO items SELECT {rows} + seq, CONCAT('new-', seq), seq / 10, seq % 7, NULL, 'n'
            FROM seq_1_to_{inserts}""",
        f"UPDATE items SET qty = qty + 1, note = 'updated' WHERE id <= {updates}",
        f"DELETE FROM items WHERE id > {updates} AND id <= {updates + deletes}",
    ], database=database)
    return inserts + updates + deletes


def bench_config(source: MariaDbServer, destination: PostgresServer, batch_size: int,
                 database: str = DATABASE) -> PipelineConfig:
    """The bench's connectors for one source database; their control schema and tables are in a destination
    database of the same name."""
    connector = {"type": "mariadb", "hostname": "127.0.0.1", "port": source.port, "user": CAPTURE_USER,
                 "password": CAPTURE_PASSWORD, "database": database, "batch_size": batch_size,
                 "idle_timeout_seconds": 0.5, "max_events_per_run": 10_000_000, "max_seconds_per_run": 3600,
                 "snapshot_engine": "debezium"}
    return parse_config({"destination": {"dsn": destination.dsn(database)},
                         # One destination schema each: a destination table has one writer (raw and parse write
                         # none, but the file is checked as any other).
                         "connectors": {"raw": {**connector, "destination_schema": "raw_stage"},
                                        "parse": {**connector, "destination_schema": "parse_stage"},
                                        "pipeline": connector,
                                        "apply": {**connector, "destination_schema": "apply_stage"}}},
                        Path("bench.yaml"))


def measure_raw_capture(config: PipelineConfig, spark: Any, expected: int) -> Measurement:
    """Pops and marks batches as fast as the runner gives them; nothing is parsed or applied."""
    with cycle.ConnectorSession(config.connector("raw"), config.destination, spark) as session:
        runner = session.runner
        events, first, last = 0, None, None
        deadline = time.monotonic() + 3600
        while events < expected and time.monotonic() < deadline:
            batch = runner.fetch(1.0)
            if batch is None:
                continue
            first = first or time.monotonic()
            events += batch.size
            runner.mark_complete(batch.batch_id)
            last = time.monotonic()
        return Measurement(events, (last or 0) - (first or 0))


def measure_parse_only(config: PipelineConfig, spark: Any) -> Measurement:
    """Fetches each group of batches as the pipeline does and has Spark read every row (the sizes of both row
    images), then marks the group complete; nothing is converted or applied."""
    with cycle.ConnectorSession(config.connector("parse"), config.destination, spark) as session:
        events, first, last = 0, None, None
        for parsed in cycle.parse_batches(session, cycle.fetch_batches(session)):
            first = first or session.cycle_stats.first_fetch_at
            if parsed.events is not None:  # a group without data changes (a run's first, of one batch, may be)
                parsed.events.select(F.sum(F.coalesce(F.size("before"), F.lit(0))
                                           + F.coalesce(F.size("after"), F.lit(0)))).collect()
            cycle.mark_batches_complete(session, parsed.batch.batch_ids)
            events += parsed.batch.size
            last = time.monotonic()
        return Measurement(events, (last or 0) - (first or 0))


def measure_pipeline(config: PipelineConfig, spark: Any) -> tuple[Measurement, dict[str, Any]]:
    """One full cycle through the job's steps; returns the end-to-end measurement and the cycle's numbers."""
    with cycle.ConnectorSession(config.connector("pipeline"), config.destination, spark) as session:
        plans = cycle.convert_dml(session, cycle.convert_ddl(session, cycle.parse_batches(
            session, cycle.fetch_batches(session))))
        applied = cycle.apply_batches(session, plans)
        cycle.mark_batches_complete(session, applied)
        stats = session.cycle_stats
        end_to_end = Measurement(stats.counts.events, (stats.last_commit_at or 0) - (stats.first_fetch_at or 0))
        return end_to_end, stats.as_dict()


def measure_apply_stage(config: PipelineConfig, spark: Any) -> Measurement:
    """Rows/s of the apply stage alone: every batch is fetched, parsed and cached before the clock starts (so
    neither the engine nor the parse competes with it for the cores), then the batches are applied one by one."""
    with cycle.ConnectorSession(config.connector("apply"), config.destination, spark) as session:
        applier = session.applier()
        plans = []
        for plan in cycle.convert_dml(session, cycle.convert_ddl(session, cycle.parse_batches(
                session, cycle.fetch_batches(session)))):
            plan.parsed.cache()
            if plan.parsed.events is not None:  # a group without data changes has nothing to parse
                plan.parsed.events.count()
            plans.append(plan)
        rows, applied = 0, []
        started = time.monotonic()
        for plan in plans:
            counts = applier.apply(plan)
            rows += counts.snapshot_rows + counts.inserts + counts.updates + counts.deletes
            applied.extend(plan.parsed.batch.batch_ids)
        seconds = time.monotonic() - started
        for plan in plans:
            plan.parsed.release()
        cycle.mark_batches_complete(session, applied)
        return Measurement(rows, seconds)


def keep_table_state(destination: PostgresServer, database: str, table: str, copy: str) -> None:
    """Copies `table` (schema.table) as `copy`, with its primary key: the state the destination ceiling starts
    from."""
    source, target = _qualified(table), _qualified(copy)
    with psycopg.connect(destination.dsn(database), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(target))
        conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(target, source))
        conn.execute(sql.SQL("INSERT INTO {} SELECT * FROM {}").format(target, source))


def measure_destination_ceiling(destination: PostgresServer, database: str, before: str, after: str,
                                key: str = "id") -> Measurement:
    """The destination alone writing the same net changes the pipeline applied, as the pipeline writes them: the
    net rows (those `after` holds and `before` does not hold as they are) and the deleted keys, already as COPY
    text in memory, are copied into temporary staging tables and merged into `before` (DELETE ... USING, INSERT
    ... ON CONFLICT DO UPDATE) in one transaction. Returns the rows written and the seconds from BEGIN to COMMIT.
    """
    target, current, key_name = _qualified(before), _qualified(after), sql.Identifier(key)
    with psycopg.connect(destination.dsn(database)) as conn, conn.cursor() as cur:
        upserts = _copy_out(cur, sql.SQL("SELECT * FROM {} EXCEPT SELECT * FROM {}").format(current, target))
        deletes = _copy_out(cur, sql.SQL("SELECT {k} FROM {b} EXCEPT SELECT {k} FROM {a}").format(
            k=key_name, b=target, a=current))
        columns = [row[0] for row in cur.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
            "ORDER BY attnum", (before,)).fetchall()]
        conn.commit()
        updates = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(name))
                                     for name in columns if name != key)
        started = time.monotonic()
        cur.execute(sql.SQL("CREATE TEMP TABLE ceiling_deletes ON COMMIT DROP AS SELECT {} FROM {} LIMIT 0").format(
            key_name, target))
        with cur.copy("COPY ceiling_deletes FROM STDIN") as copy:
            copy.write(deletes)
        cur.execute(sql.SQL("DELETE FROM {} AS t USING ceiling_deletes AS s WHERE t.{k} = s.{k}").format(
            target, k=key_name))
        cur.execute(sql.SQL("CREATE TEMP TABLE ceiling_upserts ON COMMIT DROP AS SELECT * FROM {} LIMIT 0").format(
            target))
        with cur.copy("COPY ceiling_upserts FROM STDIN") as copy:
            copy.write(upserts)
        cur.execute(sql.SQL("INSERT INTO {} SELECT * FROM ceiling_upserts ON CONFLICT ({}) DO UPDATE SET {}").format(
            target, key_name, updates))
        conn.commit()
        seconds = time.monotonic() - started
    return Measurement(upserts.count(b"\n") + deletes.count(b"\n"), seconds)


def _qualified(name: str) -> sql.Identifier:
    return sql.Identifier(*name.split("."))


def _copy_out(cur: Any, query: sql.Composable) -> bytes:
    with cur.copy(sql.SQL("COPY ({}) TO STDOUT").format(query)) as copy:
        return b"".join(bytes(block) for block in copy)


def measure_phases(source: MariaDbServer, destination: PostgresServer, spark: Any, rows: int, batch_size: int,
                   database: str) -> dict[str, Any]:
    """Loads `rows` into a new source database and measures its snapshot, then a stream of changes to it."""
    destination.create_database(database)
    load_source(source, rows, database)
    config = bench_config(source, destination, batch_size, database)
    results: dict[str, Any] = {}
    for phase in ("snapshot", "stream"):
        expected = rows if phase == "snapshot" else change_source(source, rows, database)
        raw = measure_raw_capture(config, spark, expected)
        parse_only = measure_parse_only(config, spark)
        end_to_end, cycle_stats = measure_pipeline(config, spark)
        if phase == "stream":
            keep_table_state(destination, database, "apply_stage.items", "apply_stage.items_ceiling")
        apply_stage = measure_apply_stage(config, spark)
        ceiling = measure_destination_ceiling(destination, database, "apply_stage.items_ceiling",
                                              "apply_stage.items") if phase == "stream" else None
        results[phase] = {
            "raw_capture_events_per_second": round(raw.rate),
            "pipeline_events_per_second": round(end_to_end.rate),
            "apply_rows_per_second": round(apply_stage.rate),
            **({"destination_ceiling_rows_per_second": round(ceiling.rate), "destination_ceiling_rows": ceiling.events,
                "apply_to_ceiling_ratio": round(apply_stage.rate / ceiling.rate, 3) if ceiling.rate else None}
               if ceiling else {}),
            "pipeline_to_capture_ratio": round(end_to_end.rate / raw.rate, 3) if raw.rate else None,
            "parse_only_events_per_second": round(parse_only.rate),
            "parse_only_to_capture_ratio": round(parse_only.rate / raw.rate, 3) if raw.rate else None,
            "events": end_to_end.events,
            "cycle": cycle_stats,
        }
    return results


def measure_copy_ceiling(source: MariaDbServer, destination: PostgresServer, database: str, table: str,
                         select: str = ITEMS_COLUMNS, columns: str = ITEMS_CEILING_COLUMNS) -> Measurement:
    """The plainest pipe: the `mariadb` client streams the table (batch mode, unbuffered) into `psql`'s COPY.

    `select` is the list the client reads (its batch mode escapes tabs, newlines and backslashes as COPY's text
    format does), `columns` the destination table `ceiling`'s columns."""
    destination.execute(f"CREATE TABLE ceiling ({columns})", dbname=database)
    env = {**os.environ, "MYSQL_PWD": CAPTURE_PASSWORD, "PGCLIENTENCODING": "UTF8"}
    return _measure_ceiling_pipe(
        ["mariadb", "-h", "127.0.0.1", "-P", str(source.port), "-u", CAPTURE_USER, "-N", "-B", "--quick",
         "--default-character-set=utf8mb4", "--max-allowed-packet=1G", "-e",
         f"SELECT {select} FROM {quote_mysql(table)}", database],
        ["psql", "-q", "-v", "ON_ERROR_STOP=1", destination.dsn(database), "-c",
         "COPY ceiling FROM STDIN WITH (NULL 'NULL')"], destination, database, env)


def _measure_ceiling_pipe(reader_command: list[str], writer_command: list[str], destination: PostgresServer,
                          database: str, env: dict[str, str] | None = None) -> Measurement:
    """The rows the reader's output piped into the writer put in the destination's table `ceiling`, and the wall
    seconds of the pipe."""
    started = time.monotonic()
    reader = subprocess.Popen(reader_command, stdout=subprocess.PIPE, env=env)
    writer = subprocess.run(writer_command, stdin=reader.stdout, capture_output=True, text=True, env=env)
    reader.stdout.close()
    reader.wait()
    seconds = time.monotonic() - started
    if reader.returncode or writer.returncode:
        raise RuntimeError(f"the copy ceiling pipe failed: {writer.stderr.strip()}")
    count = destination.query("SELECT count(*) FROM ceiling", dbname=database)[0][0]
    return Measurement(int(count), seconds)


class SyncFailed(RuntimeError):
    """A `cdc-pipeline sync` process of the bench ended with an error: its stderr's tail (the whole in `stderr`), and
    what it had used."""

    def __init__(self, message: str, seconds: float, peak_rss_mb_jvm: int, peak_rss_mb_python: int,
                 stderr: str = "") -> None:
        super().__init__(message)
        self.stderr = stderr
        self.seconds = seconds
        self.peak_rss_mb_jvm = peak_rss_mb_jvm
        self.peak_rss_mb_python = peak_rss_mb_python


def write_sync_config(work: Path, source: MariaDbServer | None, database: str, engine: str, tables: Sequence[str],
                      connector: dict[str, Any] | None = None, spark_conf: dict[str, str] | None = None) -> str:
    """Writes the connectors file (and makes the Dagster home) of the connector `measure_sync_process` runs, in
    `work`; returns the connector's name (`load_<engine>`)."""
    name = f"load_{engine}"
    source_fields = connector or {"type": "mariadb", "hostname": "127.0.0.1", "port": source.port if source else 0,
                                  "user": CAPTURE_USER, "tables": [f"{database}.{table}" for table in tables]}
    config = {"destination": {"dsn": "${BENCH_DEST_DSN}"}, "connectors": {name: {
        # The connector's defaults, as a user runs it: only the snapshot engine is named (the bench compares both).
        **source_fields, "password": "${BENCH_SOURCE_PASSWORD}", "database": database, "snapshot_engine": engine}}}
    if spark_conf:
        config["spark"] = {"conf": spark_conf}
    (work / f"{name}.yaml").write_text(json.dumps(config))
    (work / f"dagster_{name}").mkdir(exist_ok=True)
    return name


def measure_sync_process(source: MariaDbServer | None, destination: PostgresServer, work: Path, database: str,
                         engine: str, tables: Sequence[str], new_destination: bool = True,
                         connector: dict[str, Any] | None = None, spark_conf: dict[str, str] | None = None,
                         timeout_seconds: float | None = None,
                         extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """A fresh `cdc-pipeline sync` process copying `tables` with the snapshot engine `engine`: its wall time (the
    process's start included), its summary, and the peak resident memory of its Python process and of the JVM
    it starts (children's peak RSS, from the kernel). `spark_conf` goes to the connectors file's `spark: conf:`.
    Raises SyncFailed when the process fails, or has not ended after `timeout_seconds` (then it and its JVM are
    ended). `extra_env` goes to the process's environment (a pipeline server's: SyncFailed too when the cycle
    then ran cold)."""
    dest_database = f"{database}_{engine}"
    if new_destination:
        destination.create_database(dest_database)
    name = write_sync_config(work, source, database, engine, tables, connector, spark_conf)
    env = {**_connector_env(work, name, destination, dest_database), **(extra_env or {})}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "cdc_pipeline.ops.cli", "sync", name, "--json"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks = _PeakMemory(process.pid)
    peaks.start()
    try:
        out, err = process.communicate(timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        out, err = _end_process(process)
        err += f"\nthe bench ended the process: it had not ended after {timeout_seconds} s"
    seconds = time.monotonic() - started
    peaks.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode:
        raise SyncFailed(f"cdc-pipeline sync ({engine}) failed: {err.strip()[-2000:]}", seconds=round(seconds, 2),
                         peak_rss_mb_jvm=peaks.jvm_mb, peak_rss_mb_python=peaks.python_mb, stderr=err)
    summary = json.loads(out.strip().splitlines()[-1])
    if (extra_env or {}).get(SERVER_ENV) and not summary.get("served_by"):
        raise SyncFailed(f"cdc-pipeline sync ({engine}) was to run its cycle on the pipeline server at "
                         f"{extra_env[SERVER_ENV]}, and ran cold: {err.strip()[-2000:]}", seconds=round(seconds, 2),
                         peak_rss_mb_jvm=peaks.jvm_mb, peak_rss_mb_python=peaks.python_mb, stderr=err)
    rows = int(summary["snapshot_rows"])
    events = int(summary.get("events") or 0)
    return {"rows": rows, "seconds": round(seconds, 2), "rows_per_second": round(rows / seconds),
            "events": events, "events_per_second": round(events / seconds),
            "load_seconds": summary.get("load_seconds"), "cpu_seconds": round(
                after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "peak_rss_mb_python": peaks.python_mb, "peak_rss_mb_jvm": peaks.jvm_mb, "cycle": summary}


def _end_process(process: subprocess.Popen) -> tuple[str, str]:
    """Kills a `sync` process and the JVM it started (a hung driver does not always end with its parent); returns
    what it had written."""
    children = _children(process.pid)
    process.kill()
    for child in children:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return process.communicate()


def _connector_env(work: Path, name: str, destination: PostgresServer, dest_database: str) -> dict[str, str]:
    """The environment of a `cdc-pipeline` process of the connector `measure_sync_process` configured."""
    return {**os.environ, "CDC_PIPELINE_CONFIG": str(work / f"{name}.yaml"),
            "BENCH_DEST_DSN": destination.dsn(dest_database), "BENCH_SOURCE_PASSWORD": CAPTURE_PASSWORD,
            "DAGSTER_HOME": str(work / f"dagster_{name}")}


def run_verify(rows: int) -> dict[str, Any]:
    """The cost of `cdc-pipeline verify`: a table of `rows` rows is loaded by the bulk engine, then a fresh verify
    process compares it (no recheck: the source is quiet) and its wall time is measured."""
    from cdc_pipeline.capture.runner import build_runner

    build_runner()
    with tempfile.TemporaryDirectory(prefix="cdc-bench-") as work:
        with start_mariadb(Path(work)) as source, start_postgres(Path(work)) as destination:
            source.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
            load_source(source, rows, LOAD_DATABASE, "items")
            load = measure_sync_process(source, destination, Path(work), LOAD_DATABASE, "spark", ["items"])
            started = time.monotonic()
            process = subprocess.run([sys.executable, "-m", "cdc_pipeline.ops.cli", "verify", "load_spark", "--json",
                                      "--rechecks", "0"],
                                     env=_connector_env(Path(work), "load_spark", destination, f"{LOAD_DATABASE}_spark"),
                                     capture_output=True, text=True)
            seconds = time.monotonic() - started
    if process.returncode not in (0, 1):
        raise RuntimeError(f"cdc-pipeline verify failed: {process.stderr.strip()[-2000:]}")
    report = json.loads(process.stdout)
    (table,) = report["tables"]
    return {"rows": rows, "seconds": round(seconds, 2), "rows_per_second": round(rows / seconds),
            "chunks": table["chunks"], "equal": not report["differs"], "load_seconds": load["seconds"]}


class _PeakMemory(threading.Thread):
    """Samples the peak resident memory (VmHWM) of a process and of the JVM among its children until stopped."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.python_mb = 0
        self.jvm_mb = 0
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.wait(0.2):
            self.python_mb = max(self.python_mb, _peak_mb(self.pid))
            for child in _children(self.pid):
                if b"java" in _read(f"/proc/{child}/cmdline"):
                    self.jvm_mb = max(self.jvm_mb, _peak_mb(child))

    def stop(self) -> None:
        self._stopped.set()
        self.join()


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def _peak_mb(pid: int) -> int:
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith(b"VmHWM:"):
            return int(line.split()[1]) // 1024
    return 0


def _children(pid: int) -> list[int]:
    return [int(child) for child in _read(f"/proc/{pid}/task/{pid}/children").split()]


def measure_initial_load(source: MariaDbServer, destination: PostgresServer, work: Path, rows: int,
                         debezium_rows: int, peer: bool = False, database: str = LOAD_DATABASE,
                         served: bool = False) -> dict[str, Any]:
    """The copy ceiling, the bulk snapshot engine, the Debezium snapshot engine and (`peer`) pg_chameleon, in that
    order, on a table `items` in the source's `database`. `served`: the bulk engine's fresh `sync` process runs its
    cycle on a pipeline server, started and warmed by one load of the same table (not counted) before it, and
    stopped after it."""
    destination.create_database(database)
    load_source(source, rows, database, "items")
    ceiling = measure_copy_ceiling(source, destination, database, "items")
    if served:
        bulk, served_figures = _measure_served_load(source, destination, work, database)
    else:
        bulk, served_figures = measure_sync_process(source, destination, work, database, "spark", ["items"]), None
    results: dict[str, Any] = {"rows": rows, "ceiling_rows_per_second": round(ceiling.rate), "served": served_figures,
                               "ceiling_seconds": round(ceiling.seconds, 2), "bulk": bulk,
                               "bulk_to_ceiling_ratio": round(bulk["rows_per_second"] / ceiling.rate, 3),
                               "load_to_ceiling_ratio": round(bulk["rows"] / bulk["load_seconds"] / ceiling.rate, 3)
                               if bulk.get("load_seconds") else None,
                               "exact": same_items(source, destination, database, f"{database}_spark")}
    if debezium_rows:
        load_source(source, debezium_rows, database, "items_debezium")
        debezium = measure_sync_process(source, destination, work, database, "debezium", ["items_debezium"])
        results["debezium"] = debezium
        results["debezium_to_ceiling_ratio"] = round(debezium["rows_per_second"] / ceiling.rate, 3)
    if peer:
        peer_chameleon.add_initial_load(results, source, destination, CAPTURE_USER, CAPTURE_PASSWORD, database)
    return results


def _measure_served_load(source: MariaDbServer, destination: PostgresServer, work: Path,
                         database: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The bulk engine's load of `items` by a fresh `sync` process through a pipeline server (`measure_initial_load`);
    its figures and the server's (its start, its first load, its peak memory)."""
    from cdc_pipeline.testing import bench_server  # it imports this module

    name = write_sync_config(work, source, database, "spark", ["items"])
    dest_database = f"{database}_spark"
    server, started, served_env = bench_server.serve_connector(work, name, destination, dest_database)
    try:
        warm_up = measure_sync_process(source, destination, work, database, "spark", ["items"], extra_env=served_env)
        destination.drop_database(dest_database)
        bulk = measure_sync_process(source, destination, work, database, "spark", ["items"], extra_env=served_env)
        figures = {"start_seconds": round(started, 2), "first_load_seconds": warm_up["seconds"],
                   "peak_rss_mb": bench_server.server_peak_mb(server)}
    finally:
        end_process_group(server)
    return bulk, figures


def measure_backlog(source: MariaDbServer, destination: PostgresServer, work: Path, changes: int,
                    peer: bool = False, database: str = "bench_backlog") -> dict[str, Any]:
    """Fresh `cdc-pipeline sync` processes, one after another as the change sensor launches them, catching up a
    backlog of `changes` row changes (half inserts, a quarter updates, a quarter deletes) made while the connector
    did not run: the runs it took, wall rate with each process's start, CPU, the peak memory of the JVM and of
    Python (default memory), and whether the destination ended equal to the source. With `peer`, pg_chameleon
    copies the table too before the changes are made, and catches up the same backlog after cdc-pipeline."""
    load_source(source, changes, database, "items")
    measure_sync_process(source, destination, work, database, "spark", ["items"])  # the initial load
    peer_backlog = (peer_chameleon.PeerBacklog(source, destination, CAPTURE_USER, CAPTURE_PASSWORD, database)
                    if peer else None)
    if peer_backlog:
        peer_backlog.initialise()
    made = change_source(source, changes, database)
    runs = []
    while True:
        run = measure_sync_process(source, destination, work, database, "spark", ["items"], new_destination=False)
        runs.append(run)
        if not run["cycle"].get("budget_spent"):
            break
    # A run's fixed cost: a fresh process with nothing to do.
    idle = measure_sync_process(source, destination, work, database, "spark", ["items"], new_destination=False)
    seconds = sum(run["seconds"] for run in runs)
    events = sum(run["events"] for run in runs)
    cycle_seconds = sum_cycle_seconds(runs)
    results = {"changes": made, "runs": len(runs), "events": events, "seconds": round(seconds, 2),
               "events_per_second": round(events / seconds),
               "cpu_seconds": round(sum(r["cpu_seconds"] for r in runs), 1),
               "peak_rss_mb_python": max(r["peak_rss_mb_python"] for r in runs),
               "peak_rss_mb_jvm": max(r["peak_rss_mb_jvm"] for r in runs), "cycle_seconds": cycle_seconds,
               "exact": same_items(source, destination, database, f"{database}_spark"),
               # A run's fixed cost: from the first run's process start to its first row moved.
               "first_row_seconds": runs[0]["cycle"].get("first_row_seconds"),
               "nothing_to_do_run_seconds": idle["seconds"], "nothing_to_do_run_cpu_seconds": idle["cpu_seconds"]}
    if peer_backlog:
        peer_chameleon.add_backlog(results, peer_backlog)
    return results


def sum_cycle_seconds(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The seconds of each phase of the cycles of `measure_sync_process` runs, summed over the runs."""
    cycle_seconds: dict[str, float] = {}
    for run in runs:
        for key, value in run["cycle"].items():
            if key.endswith("_seconds") and key != "first_row_seconds":
                cycle_seconds[key] = round(cycle_seconds.get(key, 0.0) + value, 3)
    return cycle_seconds


def same_items(source: MariaDbServer, destination: PostgresServer, database: str, dest_database: str) -> bool:
    """Whether the destination's copy of `items` holds what the source's does (a fingerprint of every column)."""
    theirs = source_items_fingerprint(source, database)
    ours = destination_items_fingerprint(destination, database, dest_database)
    same = theirs == ours
    if not same:
        log.warning("the destination's items differ from the source's: source %s, destination %s", theirs, ours)
    return same


def source_items_fingerprint(source: MariaDbServer, database: str) -> list[Decimal]:
    """A fingerprint of every column of the source's `items`."""
    return source_fingerprints(source, database, ["items"])["items"]


def destination_items_fingerprint(destination: PostgresServer, database: str,
                                  dest_database: str) -> list[Decimal] | None:
    """The same fingerprint of the destination's copy of `items` (schema `database` in `dest_database`); None while
    the destination lacks it."""
    return destination_fingerprints(destination, database, dest_database, ["items"])["items"]


def source_fingerprints(source: MariaDbServer, database: str, tables: Sequence[str]) -> dict[str, list[Decimal]]:
    """A fingerprint of every column of each of the source's `tables` (of the `items` shape), on one connection."""
    fingerprints = {}
    with source.connect(database) as connection, connection.cursor() as cursor:
        for table in tables:
            cursor.execute(ITEMS_FINGERPRINT.format(table=quote_mysql(table), epoch=SOURCE_FINGERPRINT_EPOCH))
            fingerprints[table] = [Decimal(str(value)) for value in cursor.fetchone()]
    return fingerprints


def destination_fingerprints(destination: PostgresServer, database: str, dest_database: str,
                             tables: Sequence[str]) -> dict[str, list[Decimal] | None]:
    """The same fingerprint of the destination's copy of each of `tables` (schema `database` in `dest_database`),
    on one connection; None for a table the destination lacks."""
    fingerprints: dict[str, list[Decimal] | None] = {}
    with psycopg.connect(destination.dsn(dest_database), autocommit=True) as conn:
        for table in tables:
            query = sql.SQL(ITEMS_FINGERPRINT).format(table=sql.Identifier(database, table),
                                                      epoch=sql.SQL(DESTINATION_FINGERPRINT_EPOCH))
            try:
                row = conn.execute(query).fetchone()
            except psycopg.errors.UndefinedTable:
                fingerprints[table] = None
                continue
            fingerprints[table] = [Decimal(str(value)) for value in row]
    return fingerprints


def run_backlog(changes: int, peer: bool = False) -> dict[str, Any]:
    from cdc_pipeline.capture.runner import build_runner

    build_runner()
    with tempfile.TemporaryDirectory(prefix="cdc-bench-") as work:
        with start_mariadb(Path(work)) as source, start_postgres(Path(work)) as destination:
            source.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
            return measure_backlog(source, destination, Path(work), changes, peer)


def create_postgres_items(source: PostgresServer, database: str, rows: int) -> None:
    """Creates `database` on a PostgreSQL source and in it `public.items` of the bench's shape with `rows` rows (ids 1
    to `rows`), generated by the server as `items_table_statements` does on MariaDB."""
    source.create_database(database)
    source.execute([f"CREATE TABLE items ({ITEMS_CEILING_COLUMNS})",
                    f"INSERT INTO items SELECT i, 'item-' || i, i / 100.0, i % 1000, timestamp '2024-01-01' + "
                    f"i * interval '1 second', repeat('x', i % 50) FROM generate_series(1, {int(rows)}) AS i"],
                   dbname=database)


def measure_postgres_copy_ceiling(source: PostgresServer, destination: PostgresServer, database: str) -> Measurement:
    """The plainest pipe from a PostgreSQL source: `psql` streaming `COPY items TO STDOUT` into `psql`'s `COPY
    ceiling FROM STDIN` (no conversion), the table `ceiling` made in the destination's `database`."""
    destination.execute(f"CREATE TABLE ceiling ({ITEMS_CEILING_COLUMNS})", dbname=database)
    return _measure_ceiling_pipe(["psql", "-X", "-q", source.dsn(database), "-c", "COPY items TO STDOUT"],
                                 ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", destination.dsn(database), "-c",
                                  "COPY ceiling FROM STDIN"], destination, database)


def postgres_load_connector(source: PostgresServer) -> dict[str, Any]:
    """The source fields of `measure_sync_process`'s connector for the PostgreSQL source's `public.items`."""
    return {"type": "postgres", "hostname": source.host, "port": source.port, "user": source.superuser,
            "tables": ["public.items"]}


def measure_postgres_initial_load(source: PostgresServer, destination: PostgresServer, work: Path, rows: int,
                                  database: str = LOAD_DATABASE) -> dict[str, Any]:
    """The initial load from a PostgreSQL source (a logical-decoding server): its copy ceiling
    (`measure_postgres_copy_ceiling`) and the bulk engine in a fresh `cdc-pipeline sync` process, on a table of the
    bench's shape in a new source `database`."""
    create_postgres_items(source, database, rows)
    destination.create_database(database)
    ceiling = measure_postgres_copy_ceiling(source, destination, database)
    bulk = measure_sync_process(None, destination, work, database, "spark", ["items"],
                                connector=postgres_load_connector(source))
    load_rate = bulk["rows"] / bulk["load_seconds"] if bulk.get("load_seconds") else 0.0
    return {"source": "postgres", "rows": rows, "ceiling_rows_per_second": round(ceiling.rate),
            "ceiling_seconds": round(ceiling.seconds, 2), "bulk": bulk,
            "bulk_to_ceiling_ratio": round(bulk["rows_per_second"] / ceiling.rate, 3),
            "load_to_ceiling_ratio": round(load_rate / ceiling.rate, 3)}


def run_initial_load(rows: int, debezium_rows: int, source_type: str = "mariadb", peer: bool = False,
                     served: bool = False) -> dict[str, Any]:
    from cdc_pipeline.capture.runner import build_runner

    build_runner()
    with tempfile.TemporaryDirectory(prefix="cdc-bench-") as work:
        with start_source(source_type, Path(work)) as source, start_postgres(Path(work)) as destination:
            if isinstance(source, PostgresServer):
                return measure_postgres_initial_load(source, destination, Path(work), rows)
            source.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
            return measure_initial_load(source, destination, Path(work), rows, debezium_rows, peer, served=served)


def _server_cpu_seconds(pid: int) -> float:
    """CPU seconds of a server process and of its children it has reaped (PostgreSQL's backends)."""
    fields = _read(f"/proc/{pid}/stat").decode().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(value) for value in fields[11:15]) / ticks


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def measure_idle_and_latency(source: MariaDbServer, destination: PostgresServer, work: Path, checks: int,
                             seconds: float, rate: float, interval: int) -> dict[str, Any]:
    """An idle connector under `trigger: changes`: the CPU of one change check (`pending.check`, what its sensor
    runs: this process and both servers; the sensor's query of Dagster's runs and the daemon's tick excluded) over
    `checks` checks, and per minute at `interval`; then a light steady load of `rate` inserts/s for `seconds`, with
    a loop standing in for the daemon (each `interval` it checks and starts a fresh `cdc-pipeline sync` process
    when there is work), and the latency of every change from its source commit to its arrival in the
    destination."""
    from cdc_pipeline.ops import pending
    from cdc_pipeline.config import load_config

    database, name = "bench_idle", "idle"
    source.execute("CREATE DATABASE bench_idle")
    source.execute("CREATE TABLE items (id INT PRIMARY KEY, at DOUBLE NOT NULL)", database=database)
    destination.create_database(database)
    config = {"destination": {"dsn": "${BENCH_DEST_DSN}"}, "connectors": {name: {
        "type": "mariadb", "hostname": "127.0.0.1", "port": source.port, "user": CAPTURE_USER,
        "password": "${BENCH_SOURCE_PASSWORD}", "database": database, "tables": [f"{database}.items"],
        "check_interval_seconds": interval}}}
    path = work / f"{name}.yaml"
    path.write_text(json.dumps(config))
    (work / "dagster_idle").mkdir(exist_ok=True)
    env = {"CDC_PIPELINE_CONFIG": str(path), "BENCH_DEST_DSN": destination.dsn(database),
           "BENCH_SOURCE_PASSWORD": CAPTURE_PASSWORD, "DAGSTER_HOME": str(work / "dagster_idle")}
    os.environ.update(env)

    def start_run() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "cdc_pipeline.ops.cli", "sync", name], env={**os.environ, **env},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    if start_run().wait():
        raise RuntimeError("the first run of the idle connector failed")
    config = load_config()

    # The change sensor's own check (assets/change_sensor.py adds a query of Dagster's runs to it).
    def evaluate() -> bool:
        return pending.check(config.connector(name), config.destination).work

    evaluate()  # imports and first connections outside the measurement
    servers = (source.pid, destination.pid)
    cpu_before = _process_cpu() + sum(map(_server_cpu_seconds, servers))
    started = time.monotonic()
    launched = sum(evaluate() for _ in range(checks))
    idle_seconds = time.monotonic() - started
    cpu_per_check = (_process_cpu() + sum(map(_server_cpu_seconds, servers)) - cpu_before) / checks
    results: dict[str, Any] = {"checks": checks, "runs_requested_while_idle": launched,
                               "cpu_ms_per_check": round(cpu_per_check * 1000, 1),
                               "wall_ms_per_check": round(idle_seconds / checks * 1000, 1),
                               "check_interval_seconds": interval,
                               "cpu_seconds_per_minute": round(cpu_per_check * 60 / interval, 3)}

    written: dict[int, float] = {}
    arrived: dict[int, float] = {}
    stop = threading.Event()

    def write() -> None:
        with source.connect(database) as connection, connection.cursor() as cursor:
            i, begin = 0, time.monotonic()
            while not stop.is_set() and time.monotonic() - begin < seconds:
                i += 1
                now = time.time()
                cursor.execute("INSERT INTO items VALUES (%s, %s)", (i, now))
                connection.commit()
                written[i] = now
                time.sleep(max(0.0, begin + i / rate - time.monotonic()))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    runs: list[subprocess.Popen] = []
    deadline = time.monotonic() + seconds + 180
    import psycopg

    with psycopg.connect(destination.dsn(database), autocommit=True) as conn:
        next_check = time.monotonic()
        while time.monotonic() < deadline and (writer.is_alive() or len(arrived) < len(written)):
            now = time.monotonic()
            if now >= next_check:
                next_check = now + interval
                if (not runs or runs[-1].poll() is not None) and evaluate():
                    runs.append(start_run())
            if conn.execute("SELECT to_regclass('bench_idle.items') IS NOT NULL").fetchone()[0]:
                for key, _ in conn.execute("SELECT id, at FROM bench_idle.items WHERE id > %s",
                                           (max(arrived, default=0),)).fetchall():
                    arrived.setdefault(int(key), time.time())
            time.sleep(0.1)
    stop.set()
    for process in runs:
        process.wait()
    latencies = [arrived[key] - written[key] for key in written if key in arrived]
    results.update({"changes": len(written), "changes_per_second": rate, "arrived": len(latencies),
                    "runs_launched": len(runs), "latency_p50_seconds": round(percentile(latencies, 0.5), 2),
                    "latency_p95_seconds": round(percentile(latencies, 0.95), 2),
                    "latency_max_seconds": round(max(latencies, default=float("nan")), 2)})
    return results


def run_idle(checks: int, seconds: float, rate: float, interval: int) -> dict[str, Any]:
    from cdc_pipeline.capture.runner import build_runner

    build_runner()
    with tempfile.TemporaryDirectory(prefix="cdc-bench-") as work:
        with start_mariadb(Path(work)) as source, start_postgres(Path(work)) as destination:
            source.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
            return measure_idle_and_latency(source, destination, Path(work), checks, seconds, rate, interval)


def run(rows: int, batch_size: int, warmup_rows: int = WARMUP_ROWS) -> dict[str, Any]:
    """Measures `rows` after a warm-up pass over `warmup_rows` in another database (0: none).

    The warm-up runs every measurement once and is discarded: the JVM compiles Debezium's, Spark's and the
    generated code on first use (its compiler threads take a core for seconds), and whichever measurement came
    first would pay for it and the others not.
    """
    from cdc_pipeline.capture.runner import build_runner
    from cdc_pipeline.capture.spark import build_spark_session

    build_runner()
    with tempfile.TemporaryDirectory(prefix="cdc-bench-") as work:
        with start_mariadb(Path(work)) as source, start_postgres(Path(work)) as destination:
            source.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
            return measure_throughput(source, destination, build_spark_session(), rows, batch_size, warmup_rows)


def measure_throughput(source: MariaDbServer, destination: PostgresServer, spark: Any, rows: int, batch_size: int,
                       warmup_rows: int = WARMUP_ROWS, database: str = DATABASE) -> dict[str, Any]:
    """`run`'s measurements on running servers (the source has the bench's capture user): the warm-up pass in
    `<database>_warmup`, then `rows` in `database`."""
    results: dict[str, Any] = {"rows": rows, "batch_size": batch_size, "warmup_rows": warmup_rows}
    if warmup_rows:
        started = time.monotonic()
        cold = measure_phases(source, destination, spark, warmup_rows, batch_size, f"{database}_warmup")
        results["warmup"] = {"seconds": round(time.monotonic() - started, 1),
                             **{phase: {key: value for key, value in cold[phase].items() if key != "cycle"}
                                for phase in ("snapshot", "stream")}}
    results.update(measure_phases(source, destination, spark, rows, batch_size, database))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    from cdc_pipeline.testing import bench_tables, bench_values, peer_loaders

    parser = argparse.ArgumentParser(prog="cdc-pipeline bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--warmup-rows", type=int, default=WARMUP_ROWS,
                        help="rows of the discarded warm-up pass that runs every measurement once first (0: none)")
    parser.add_argument("--load-rows", type=int, default=LOAD_ROWS,
                        help="rows of the initial-load measurement (0: none)")
    parser.add_argument("--debezium-load-rows", type=int, default=DEBEZIUM_LOAD_ROWS,
                        help="rows the Debezium snapshot engine copies in the initial-load measurement (0: none)")
    parser.add_argument("--load-only", action="store_true", help="only the initial-load measurement")
    parser.add_argument("--load-source", choices=("mariadb", "postgres"), default="mariadb",
                        help="the initial load's source type (postgres: the ceiling and the bulk engine only)")
    parser.add_argument("--backlog-changes", type=int, default=0,
                        help="only: a fresh sync process catching up this many changes (with peak memory)")
    parser.add_argument("--idle-only", action="store_true",
                        help="only the idle connector's cost and the change latency under a light load")
    parser.add_argument("--idle-checks", type=int, default=40, help="sensor evaluations measured while idle")
    parser.add_argument("--latency-seconds", type=float, default=120, help="how long the light load lasts")
    parser.add_argument("--latency-rate", type=float, default=50, help="changes/s of the light load")
    parser.add_argument("--check-interval", type=int, default=15, help="the change sensor's interval (s)")
    parser.add_argument("--verify-rows", type=int, default=0,
                        help="only: the wall time of `cdc-pipeline verify` over a table of this many rows")
    parser.add_argument("--peer", action="store_true",
                        help="with the initial load (MariaDB) and --backlog-changes: also pg_chameleon "
                             f"{peer_chameleon.PEER_VERSION} on the same servers (installed on first use)")
    parser.add_argument("--peer-loaders", action="store_true",
                        help="with --load-only: the initial load against pgloader (--load-source mariadb) or pgcopydb "
                             "(postgres), --runs times, each into fresh destination databases (installed from "
                             "Debian's packages when missing; `peer_loaders`)")
    parser.add_argument("--warm-driver-runs", type=int, default=0,
                        help="only: fresh client processes applying a catch-up's first group through a warm driver "
                             "(a Spark Connect server with the pipeline's driver settings; `warm_driver`)")
    parser.add_argument("--tables", type=int, default=0,
                        help="only: N tables of --table-rows rows each against one table of N times as many rows, "
                             "loaded and then catching up --spread-changes changes (`bench_tables`)")
    parser.add_argument("--table-rows", type=int, default=bench_tables.TABLE_ROWS, help="rows of each of --tables")
    parser.add_argument("--spread-changes", type=int, default=bench_tables.SPREAD_CHANGES,
                        help="with --tables: row changes written while no run is on, each on a random table")
    parser.add_argument("--changes-per-transaction", type=int, default=bench_tables.CHANGES_PER_TRANSACTION,
                        help="with --tables: the changes of each source transaction")
    parser.add_argument("--runs", type=int, default=1,
                        help="with --tables: rounds of both sides, each on fresh servers; with --peer-loaders: runs "
                             "on the same servers, alternating which side goes first (medians reported)")
    parser.add_argument("--value-mb", type=lambda text: [int(size) for size in text.split(",")], default=None,
                        help="only: rows of values of these sizes in MB (e.g. 1,8,64: half text, half bytes), loaded "
                             "and then every row updated and streamed, beside the copy ceiling (`bench_values`)")
    parser.add_argument("--value-rows", type=int, default=None,
                        help="with --value-mb: rows of each size (default: 200 up to 8 MB, else 512 MB worth)")
    parser.add_argument("--heap", default=None,
                        help="with --value-mb: the driver JVM's heap (spark.driver.memory) instead of the default")
    parser.add_argument("--transaction-rows", type=int, default=None,
                        help="only: one source transaction of this many row changes (one UPDATE of every row), a "
                             "run killed inside it, then caught up while a reader checks it is never seen in part "
                             "(`bench_transaction`; the source type from --load-source)")
    parser.add_argument("--bank", type=int, default=0, metavar="ACCOUNTS",
                        help="only: a bank of ACCOUNTS accounts (--load-source) whose every transaction keeps the "
                             "total, caught up after a backlog and then streamed, while a reader checks that no "
                             "read sees a transaction in part (`bench_bank`)")
    parser.add_argument("--bank-transfers", type=int, default=None,
                        help="with --bank: transfer transactions in the backlog (default 3000)")
    parser.add_argument("--bank-stream-seconds", type=float, default=None,
                        help="with --bank: how long the writer commits while a lingering run streams (default 60)")
    parser.add_argument("--served-runs", type=int, default=0, metavar="N",
                        help="only: N rounds of a backlog caught up by a fresh `sync` cold and by one through a "
                             "pipeline server (`cdc-pipeline serve`; `bench_server`; MariaDB)")
    parser.add_argument("--served", action="store_true",
                        help="with --freshness or --databases: a pipeline server beside the daemon, its runs' cycles "
                             "run there; with --peer-loaders, or --load-only from MariaDB: our fresh `sync` processes "
                             "run their cycles on one (warmed by one load first, not counted)")
    parser.add_argument("--served-changes", type=int, default=None, help="with --served-runs: changes per backlog "
                                                                          "(default 2048)")
    parser.add_argument("--freshness", action="store_true",
                        help="only: latency of a trickle and of a busy source, and the runs of a quiet one, with the "
                             "change sensor under Dagster's daemon (`bench_freshness`; from a checkout; the source "
                             "type from --load-source)")
    parser.add_argument("--linger", type=lambda text: [None if v == "default" else float(v) for v in text.split(",")],
                        default=[None], help="with --freshness: a round per linger_seconds (e.g. default,1,10,30)")
    parser.add_argument("--quiet-seconds", type=float, default=60, help="with --freshness")
    parser.add_argument("--trickle-seconds", type=float, default=None,
                        help="with --freshness (default 120) or --databases (default 60)")
    parser.add_argument("--trickle-interval", type=float, default=None,
                        help="with --freshness (default 3) or --databases (default 2): s between rows")
    parser.add_argument("--busy-seconds", type=float, default=30, help="with --freshness")
    parser.add_argument("--busy-rate", type=float, default=50, help="with --freshness: rows/s")
    parser.add_argument("--fresh-check-interval", type=int, default=None,
                        help="with --freshness: the connector's check_interval_seconds (default: its default)")
    parser.add_argument("--keep-work", type=Path, default=None,
                        help="with --freshness or --databases: work in this new directory and leave it (servers' "
                             "files, the daemon's log, the Dagster instance)")
    parser.add_argument("--busy-neighbour", type=float, default=0, metavar="SECONDS",
                        help="only: a quiet connector while another database of its server commits "
                             "--neighbour-rate transactions/s for SECONDS, then one row of its own (`bench_neighbour`)")
    parser.add_argument("--neighbour-rate", type=float, default=7000, help="with --busy-neighbour: transactions/s")
    parser.add_argument("--time-scale", type=float, default=1,
                        help="with --busy-neighbour: the spell S times faster and shorter, checks S times as often")
    parser.add_argument("--neighbour-budget", type=float, default=20,
                        help="with --busy-neighbour: the connector's max_seconds_per_run")
    parser.add_argument("--neighbour-check-interval", type=int, default=5,
                        help="with --busy-neighbour: the connector's check_interval_seconds")
    parser.add_argument("--databases", type=int, default=0, metavar="N",
                        help="only: a MariaDB server of N tenant databases under Dagster's daemon, one connector "
                             "of them all (`bench_tenants`; from a checkout)")
    parser.add_argument("--tenant-tables", type=int, default=5, help="with --databases: tables per database")
    parser.add_argument("--connector-per-database", action="store_true",
                        help="with --databases: N connectors of one database each instead of one")
    parser.add_argument("--dagster", choices=("dev", "daemon", "service"), default="dev",
                        help="with --databases or --freshness: how Dagster runs: `dagster dev` (the README's way: its "
                             "webserver, its daemon and one code server), `dagster-daemon run` alone (which starts "
                             "its code server again every minute), or as a service (`dagster code-server start`, the "
                             "daemon and the webserver on a workspace of it: docs/operations.md)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.databases:
        from cdc_pipeline.testing import bench_tenants

        tenants = bench_tenants.run_tenants(args.databases, args.tenant_tables, args.trickle_seconds or 60,
                                            args.trickle_interval or 2, args.connector_per_database,
                                            keep=args.keep_work, served=args.served, dagster=args.dagster)
        print(json.dumps(tenants, indent=2) if args.json else bench_tenants.describe(tenants))
        return 0 if tenants["exact_seconds"] is not None and not tenants["trickle"]["not_applied"] else 1
    if args.busy_neighbour:
        from cdc_pipeline.testing import bench_neighbour

        busy = bench_neighbour.run_busy_neighbour(args.busy_neighbour, args.neighbour_rate, args.time_scale,
                                                  args.neighbour_budget, args.neighbour_check_interval)
        print(json.dumps(busy, indent=2) if args.json else bench_neighbour.describe(busy))
        return 0 if busy["latency_seconds"] is not None else 1
    if args.freshness:
        from cdc_pipeline.testing import bench_freshness

        fresh = bench_freshness.run_freshness(args.linger, args.quiet_seconds, args.trickle_seconds or 120,
                                              args.trickle_interval or 3, args.busy_seconds, args.busy_rate,
                                              args.fresh_check_interval, args.keep_work, args.load_source,
                                              args.served, args.dagster)
        print(json.dumps(fresh, indent=2) if args.json else bench_freshness.describe(fresh))
        return 0
    if args.served_runs:
        from cdc_pipeline.testing import bench_server

        served = bench_server.run_served(args.served_runs, args.served_changes or bench_server.CHANGES)
        print(json.dumps(served, indent=2) if args.json else bench_server.describe(served))
        return 0 if served["exact"] else 1
    if args.bank:
        from cdc_pipeline.testing import bench_bank

        bank = bench_bank.run_bank(args.load_source, args.bank, args.bank_transfers or bench_bank.TRANSFERS,
                                   args.bank_stream_seconds or bench_bank.STREAM_SECONDS)
        print(json.dumps(bank, indent=2) if args.json else bench_bank.describe(bank))
        return 0 if bank["succeeded"] else 1
    if args.transaction_rows:
        from cdc_pipeline.testing import bench_transaction

        whole = bench_transaction.run_transaction(args.transaction_rows, args.load_source)
        print(json.dumps(whole, indent=2) if args.json else bench_transaction.describe(whole))
        return 0 if whole["succeeded"] else 1
    if args.value_mb:
        values = bench_values.run_values(args.value_mb, args.value_rows, args.heap)
        print(json.dumps(values, indent=2) if args.json else bench_values.describe(values))
        return 0 if values["succeeded"] and values["exact"] else 1
    if args.tables:
        spread = bench_tables.run_tables(args.tables, args.table_rows, args.spread_changes,
                                         args.changes_per_transaction, args.runs)
        print(json.dumps(spread, indent=2) if args.json else bench_tables.describe(spread))
        return 0
    if args.peer_loaders:
        if not args.load_only or not args.load_rows:
            parser.error("--peer-loaders measures the initial load: give --load-only and --load-rows N")
        loaders = peer_loaders.run_peer_loaders(args.load_source, args.load_rows, args.runs, args.served)
        print(json.dumps(loaders, indent=2) if args.json else peer_loaders.describe(loaders))
        return 0 if loaders["median"]["exact"] else 1
    if args.peer and args.load_source == "postgres" and not args.backlog_changes:
        parser.error("--peer measures pg_chameleon from MariaDB only")
    if args.warm_driver_runs:
        warm = warm_driver.run_warm_driver(args.warm_driver_runs)
        print(json.dumps(warm, indent=2) if args.json else
              f"warm driver (Spark Connect server, started in {warm['server_start_seconds']} s, RSS "
              f"{warm['server_rss_mb']} MB): a fresh client's first row moved {warm['first_row_seconds_median']} s "
              f"after its process started (median of {warm['runs']}: {warm['first_row_seconds']}; the server's first "
              f"query of the shape: {warm['server_first_query_run']['committed']} s); a group of "
              f"{warm['changes']} changes; destination exact: {warm['exact']}")
        return 0
    if args.verify_rows:
        cost = run_verify(args.verify_rows)
        print(json.dumps(cost, indent=2) if args.json else
              f"verify of {cost['rows']} rows ({cost['chunks']} chunks) by a fresh `cdc-pipeline verify` process: "
              f"{cost['seconds']} s, {cost['rows_per_second']} rows/s; tables equal: {cost['equal']}")
        return 0
    if args.backlog_changes:
        backlog = run_backlog(args.backlog_changes, args.peer)
        print(json.dumps(backlog, indent=2) if args.json else
              f"backlog of {backlog['changes']} changes caught up by a fresh `cdc-pipeline sync` process: "
              f"{backlog['events_per_second']} changes/s ({backlog['seconds']} s wall in {backlog['runs']} run(s), "
              f"{backlog['cpu_seconds']} CPU s, peak RSS: JVM {backlog['peak_rss_mb_jvm']} MB, Python "
              f"{backlog['peak_rss_mb_python']} MB; destination exact: {backlog['exact']}); first row moved "
              f"{backlog['first_row_seconds']} s after the process started; a run with nothing to "
              f"do: {backlog['nothing_to_do_run_seconds']} s")
        if "peer" in backlog and not args.json:
            print(peer_chameleon.describe_backlog(backlog))
        return 0
    if args.idle_only:
        idle = run_idle(args.idle_checks, args.latency_seconds, args.latency_rate, args.check_interval)
        print(json.dumps(idle, indent=2) if args.json else print_idle(idle))
        return 0
    if args.served and (args.load_source == "postgres" or not args.load_only):
        parser.error("--served measures a MariaDB load (--load-only) here; --peer-loaders --served a PostgreSQL one")
    load = (run_initial_load(args.load_rows, args.debezium_load_rows, args.load_source, args.peer, args.served)
            if args.load_rows else None)
    results = {} if args.load_only else run(args.rows, args.batch_size, args.warmup_rows)
    if load is not None:
        results["initial_load"] = load
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    if load is not None:
        print_initial_load(load)
    if args.load_only:
        return 0
    print(f"{args.rows} rows, batch size {args.batch_size}, after a warm-up pass over {args.warmup_rows} rows")
    print(f"{'':10} {'(a) capture ev/s':>17} {'(b) pipeline ev/s':>18} {'(c) apply rows/s':>17} {'(d) b/a':>8}"
          f" {'(e) parse-only ev/s':>20} {'e/a':>6}")
    for phase in ("snapshot", "stream"):
        r = results[phase]
        print(f"{phase:10} {r['raw_capture_events_per_second']:>17} {r['pipeline_events_per_second']:>18} "
              f"{r['apply_rows_per_second']:>17} {r['pipeline_to_capture_ratio']:>8}"
              f" {r['parse_only_events_per_second']:>20} {r['parse_only_to_capture_ratio']:>6}")
    return 0


def print_initial_load(load: dict[str, Any]) -> None:
    bulk = load["bulk"]
    print(f"initial load of {load['rows']} rows (a fresh `cdc-pipeline sync` process, its start included):")
    pipe = "psql COPY TO | psql COPY" if load.get("source") == "postgres" else "mariadb | psql COPY"
    print(f"  (i) copy ceiling ({pipe}): {load['ceiling_rows_per_second']:>9} rows/s "
          f"({load['ceiling_seconds']} s)")
    print(f"  bulk snapshot engine (spark):           {bulk['rows_per_second']:>9} rows/s ({bulk['seconds']} s wall, "
          f"load {bulk['load_seconds']} s, {bulk['cpu_seconds']} CPU s, peak RSS: JVM {bulk['peak_rss_mb_jvm']} MB, "
          f"Python {bulk['peak_rss_mb_python']} MB)  bulk / ceiling = {load['bulk_to_ceiling_ratio']}")
    print(f"  bulk load phase / ceiling = {load['load_to_ceiling_ratio']}; destination exact: {load.get('exact')}; "
          f"first row moved {bulk['cycle'].get('first_row_seconds')} s after the process started")
    served = load.get("served")
    if served:
        print(f"  the sync's cycle ran on a pipeline server (started in {served['start_seconds']} s; its first load, "
              f"not counted, {served['first_load_seconds']} s; peak {served['peak_rss_mb']} MB resident, its Python "
              "and JVM): the JVM figures above are the client's")
    if "debezium" in load:
        debezium = load["debezium"]
        print(f"  (ii) Debezium snapshot engine ({debezium['rows']} rows): {debezium['rows_per_second']:>9} rows/s "
              f"({debezium['seconds']} s wall)  debezium / ceiling = {load['debezium_to_ceiling_ratio']}")
    if "peer" in load:
        print(peer_chameleon.describe_initial_load(load))


def print_idle(idle: dict[str, Any]) -> str:
    return (f"idle connector (trigger: changes, checked every {idle['check_interval_seconds']} s): "
            f"{idle['cpu_ms_per_check']} ms CPU per check ({idle['wall_ms_per_check']} ms wall; sensor, source "
            f"and destination), {idle['cpu_seconds_per_minute']} CPU s/minute; {idle['runs_requested_while_idle']} "
            f"runs requested in {idle['checks']} idle checks\n"
            f"latency under {idle['changes_per_second']} changes/s ({idle['changes']} changes, {idle['runs_launched']} "
            f"runs launched): p50 {idle['latency_p50_seconds']} s, p95 {idle['latency_p95_seconds']} s, "
            f"max {idle['latency_max_seconds']} s")
