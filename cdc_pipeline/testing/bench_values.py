"""`cdc-pipeline bench --value-mb 1,8,64`: rows of large values loaded and then streamed, against the machine's copy
ceiling for the same bytes, measured in the same run.

Each value size S runs on fresh throwaway servers (a MariaDB source with `max_allowed_packet` at 1 GB, a PostgreSQL
destination). The source table `docs (id INT PRIMARY KEY, note VARCHAR(20), body LONGTEXT, img LONGBLOB)` gets R
rows, each holding S/2 MB of text (tabs, newlines, backslashes, quotes, 2-, 3- and 4-byte characters) and S/2 MB of
bytes (every byte value, 0x00 included), made by the server (`REPEAT`), one row a transaction. Then:

- the copy ceiling: the `mariadb` client in batch mode piped into `psql`'s `COPY ... FROM STDIN` (the bytes as
  `\\x` hex), the plainest pipe of the same bytes (`bench.measure_copy_ceiling`);
- the load: fresh `cdc-pipeline sync` processes of the whole database, the connector's defaults, each process's
  start included, until the bulk snapshot is done and the stream idle;
- the stream: every row updated at the source (new values of the same size, one row a transaction) while no run
  is on, then fresh `sync` processes until they are caught up.

For each: seconds, rows/s, MB/s (1 MB = 2^20 bytes of `body` and `img`), the ratio to the ceiling's MB/s, the peak
resident memory of the driver JVM and of the Python process; after each, whether every value is the source's byte
for byte (the MD5 of every `body`, as UTF-8, and every `img`, and every `note`, on both sides). A `sync` that fails
ends the size's run: it is reported as failed with its error's last line, and the next size runs.
"""

from __future__ import annotations

import logging
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import psycopg
import pymysql
from psycopg import sql

from cdc_pipeline.sources.quoting import quote_mysql
from cdc_pipeline.testing.bench import (CAPTURE_PASSWORD, CAPTURE_USER, SyncFailed, measure_copy_ceiling)
from cdc_pipeline.testing.bench_tables import summarize_runs, sync_until_done
from cdc_pipeline.testing.servers import MariaDbServer, PostgresServer, start_mariadb, start_postgres

log = logging.getLogger(__name__)

DATABASE = "bench_values"
MB = 1 << 20
MAX_ALLOWED_PACKET = 1 << 30
# A transaction of one 64 MB row against MariaDB's default redo log of the throwaway server (32 MB) would spend its
# time in checkpoints.
REDO_LOG_BYTES = 1 << 30
VALUE_SIZES_MB = (1, 8, 64)
# A `sync` process still running after this long is ended and reported as failed: a driver out of heap may hang
# rather than fail.
SYNC_TIMEOUT_SECONDS = 900
# Rows per value size when none is given: 200 rows up to 8 MB (the 8 MB case is issue #39's 1.6 GB), else 512 MB
# worth (at least 4 rows).
ROWS_UP_TO_8_MB = 200
BYTES_ABOVE_8_MB = 512 * MB
MIN_ROWS = 4

# One version of the rows' values per update round: the text's unit (no carriage return: COPY's text format, which
# the ceiling's pipe writes, would read one as a line's end) and the bytes' unit.
TEXT_UNITS = ("tab\there, newline\nbackslash \\ and \\\\n, quotes ' \" | é ü ß € 中文 😀\n",
              "second\tversion \\N \\t 日本語 ✓ 🚀 ñ ø\nand a longer line of plain ASCII text.\n")
BYTE_UNITS = (bytes(range(256)), bytes(reversed(range(256))))

CEILING_SELECT = "id, note, body, CONCAT('\\\\x', HEX(img))"
CEILING_COLUMNS = "id int PRIMARY KEY, note varchar(20), body text, img bytea"
SOURCE_VALUES = "SELECT id, note, MD5(body), MD5(img) FROM docs ORDER BY id"
DESTINATION_VALUES = "SELECT id, note, md5(convert_to(body, 'UTF8')), md5(img) FROM {} ORDER BY id"


def default_rows(size_mb: int) -> int:
    """The rows of a value size when `--value-rows` gives none."""
    return ROWS_UP_TO_8_MB if size_mb <= 8 else max(MIN_ROWS, BYTES_ABOVE_8_MB // (size_mb * MB))


def prepare_source(source: MariaDbServer) -> None:
    """Lets the source take and log rows of up to 1 GB: `max_allowed_packet` (connections opened afterwards) and the
    redo log."""
    source.execute([f"SET GLOBAL max_allowed_packet = {MAX_ALLOWED_PACKET}",
                    f"SET GLOBAL innodb_log_file_size = {REDO_LOG_BYTES}"])


def create_docs(source: MariaDbServer, database: str) -> None:
    source.execute(f"CREATE DATABASE {quote_mysql(database)}")
    source.execute("CREATE TABLE docs (id INT PRIMARY KEY, note VARCHAR(20), body LONGTEXT, img LONGBLOB)",
                   database=database)


def write_values(source: MariaDbServer, database: str, size_mb: int, rows: int, version: int) -> None:
    """Inserts (version 0) or updates (later versions) rows 1 to `rows`, one row a transaction, each with about
    `size_mb`/2 MB of text and as many bytes made by the server from `TEXT_UNITS[version]` and `BYTE_UNITS[version]`,
    after a prefix naming the row and version (so that no two rows' values are the same)."""
    text_unit, byte_unit = TEXT_UNITS[version % len(TEXT_UNITS)], BYTE_UNITS[version % len(BYTE_UNITS)]
    half = size_mb * MB // 2
    text_repeats, byte_repeats = half // len(text_unit.encode()), half // len(byte_unit)
    statement = ("INSERT INTO docs VALUES (%s, %s, CONCAT(%s, REPEAT(%s, %s)), CONCAT(%s, REPEAT(%s, %s)))"
                 if version == 0 else
                 "UPDATE docs SET note = %s, body = CONCAT(%s, REPEAT(%s, %s)), img = CONCAT(%s, REPEAT(%s, %s)) "
                 "WHERE id = %s")
    with source.connect(database) as connection, connection.cursor() as cursor:
        for key in range(1, rows + 1):
            note = f"row {key} v{version}"
            value_params = (f"row {key} version {version}\n", text_unit, text_repeats,
                            key.to_bytes(4, "big") + bytes([version]), byte_unit, byte_repeats)
            cursor.execute(statement, (key, note, *value_params) if version == 0 else (note, *value_params, key))


def source_values(source: MariaDbServer, database: str) -> list[tuple[Any, ...]]:
    """Every row's id, note and the MD5 of its `body` and `img`, by id."""
    return [tuple(row) for row in source.query(SOURCE_VALUES, database=database)]


def destination_values(destination: PostgresServer, dbname: str, table: sql.Identifier) -> list[tuple[Any, ...]]:
    """The same of the destination's `table` (`body` as UTF-8); empty when the table is missing."""
    with psycopg.connect(destination.dsn(dbname), autocommit=True) as conn:
        try:
            return [tuple(row) for row in conn.execute(sql.SQL(DESTINATION_VALUES).format(table)).fetchall()]
        except psycopg.errors.UndefinedTable:
            return []


def same_values(source: MariaDbServer, destination: PostgresServer, database: str, dbname: str,
                table: sql.Identifier) -> bool:
    """Whether the destination's `table` holds the source's rows of `docs`, every value byte for byte."""
    theirs, ours = source_values(source, database), destination_values(destination, dbname, table)
    if theirs != ours:
        differing = [key for key, (mine, other) in enumerate(zip(theirs, ours), 1) if mine != other]
        log.warning("%s %s: %d source rows, %d destination rows; rows differing in place: %s", dbname, table,
                    len(theirs), len(ours), differing[:10])
    return theirs == ours


def phase_figures(runs: Sequence[dict[str, Any]], rows: int, data_mb: float, ceiling_mb_per_second: float
                  ) -> dict[str, Any]:
    """A phase's fresh processes together (`summarize_runs`) with its rows/s, MB/s and the ratio to the ceiling."""
    figures = summarize_runs(runs)
    seconds = figures["seconds"]
    mb_per_second = data_mb / seconds if seconds else 0.0
    return {**figures, "rows_per_second": round(rows / seconds, 2) if seconds else None,
            "mb_per_second": round(mb_per_second, 1),
            "to_ceiling": round(mb_per_second / ceiling_mb_per_second, 3) if ceiling_mb_per_second else None}


# A line of a Java stack trace that names no error: a frame, or the count of frames left out.
_STACK_FRAME = re.compile(r"\s*(at \S+\(.*\)|\.\.\. \d+ more)\s*$")


def failure(error: RuntimeError) -> dict[str, Any]:
    """A failed phase: its error's last line and the message's last lines (Java's stack frames left out), and what
    the failing process used."""
    message = str(error).strip()
    lines = [line.strip() for line in message.splitlines() if line.strip() and not _STACK_FRAME.match(line)]
    failed: dict[str, Any] = {"failed": True, "error": lines[-1] if lines else type(error).__name__,
                              "error_tail": "\n".join(lines[-20:])}
    if isinstance(error, SyncFailed):
        # The JVM's OutOfMemoryError is often far above the tail: a driver out of heap fails the job it ran.
        failed.update(seconds=error.seconds, peak_rss_mb_jvm=error.peak_rss_mb_jvm,
                      peak_rss_mb_python=error.peak_rss_mb_python,
                      out_of_memory="java.lang.OutOfMemoryError" in error.stderr)
    return failed


def measure_size(source: MariaDbServer, destination: PostgresServer, work: Path, size_mb: int, rows: int,
                 spark_conf: dict[str, str] | None = None) -> dict[str, Any]:
    """One value size on the servers given (the source prepared by `prepare_source` for values above its default
    packet and redo log): the rows are made, the ceiling copies them, the load and then the stream of every row
    updated are measured and checked. A failed phase ends the size (the stream is not run after a failed load)."""
    database, dbname = DATABASE, f"{DATABASE}_spark"
    pipeline_table = sql.Identifier(database, "docs")
    measured: dict[str, Any] = {"value_mb": size_mb, "rows": rows, "exact": False, "succeeded": False}
    create_docs(source, database)
    started = time.monotonic()
    write_values(source, database, size_mb, rows, version=0)
    measured["write_seconds"] = round(time.monotonic() - started, 2)
    ((count, data_bytes),) = source.query("SELECT COUNT(*), SUM(LENGTH(body) + LENGTH(img)) FROM docs",
                                          database=database)
    data_mb = int(data_bytes) / MB
    measured["data_mb"] = round(data_mb, 1)

    destination.create_database(database)
    ceiling = measure_copy_ceiling(source, destination, database, "docs", CEILING_SELECT, CEILING_COLUMNS)
    ceiling_mb_per_second = data_mb / ceiling.seconds if ceiling.seconds else 0.0
    measured["ceiling"] = {"seconds": round(ceiling.seconds, 2), "mb_per_second": round(ceiling_mb_per_second, 1),
                           "exact": same_values(source, destination, database, database, sql.Identifier("ceiling"))}

    def phase(name: str, new_destination: bool, count: int) -> bool:
        """Syncs until done and records the phase's figures (or its failure); whether it succeeded."""
        try:
            run = sync_until_done(source, destination, work, new_destination=new_destination, database=database,
                                  spark_conf=spark_conf, timeout_seconds=SYNC_TIMEOUT_SECONDS)
        except RuntimeError as error:
            log.error("%d MB values, %s: %s", size_mb, name, error)
            measured[name] = failure(error)
            return False
        measured[name] = {**phase_figures(run, count, data_mb, ceiling_mb_per_second),
                          "exact": same_values(source, destination, database, dbname, pipeline_table)}
        return True

    if not phase("load", True, int(count)):
        return measured
    started = time.monotonic()
    write_values(source, database, size_mb, rows, version=1)
    measured["update_seconds"] = round(time.monotonic() - started, 2)
    if not phase("stream", False, rows):
        return measured
    measured["exact"] = measured["load"]["exact"] and measured["stream"]["exact"]
    measured["succeeded"] = True
    return measured


def run_values(sizes_mb: Sequence[int] = VALUE_SIZES_MB, rows: int | None = None,
               heap: str | None = None) -> dict[str, Any]:
    """Every value size in `sizes_mb`, each on fresh servers, with `rows` rows (else `default_rows`); `heap` sets the
    driver JVM's heap (`spark.driver.memory`) instead of the connector's default."""
    from cdc_pipeline.capture.runner import build_runner

    build_runner()
    spark_conf = {"spark.driver.memory": heap} if heap else None
    measured = []
    for size_mb in sizes_mb:
        with tempfile.TemporaryDirectory(prefix="cdc-bench-") as work:
            with start_mariadb(Path(work)) as source, start_postgres(Path(work)) as destination:
                source.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
                try:
                    prepare_source(source)
                    measured.append(measure_size(source, destination, Path(work), size_mb,
                                                 rows or default_rows(size_mb), spark_conf))
                except (pymysql.MySQLError, psycopg.Error, RuntimeError) as error:  # the rows or the ceiling
                    log.error("%d MB values: %s", size_mb, error)
                    measured.append({"value_mb": size_mb, "rows": rows or default_rows(size_mb), "exact": False,
                                     "succeeded": False, "setup": failure(RuntimeError(str(error)))})
    return values_report(measured, heap)


def values_report(sizes: Sequence[dict[str, Any]], heap: str | None = None) -> dict[str, Any]:
    """`run_values`' report of the sizes measured (`measure_size`): whether every one succeeded and ended exact."""
    return {"heap": heap or "default", "sizes": list(sizes), "succeeded": all(size["succeeded"] for size in sizes),
            "exact": all(size["exact"] for size in sizes)}


def describe(results: dict[str, Any]) -> str:
    """The printed report: a line per value size (load and stream beside the ceiling), then every failure."""
    lines = [f"large values: fresh `cdc-pipeline sync` processes, their start included, the connector's defaults "
             f"(driver heap: {results['heap']}); MB/s of body + img (1 MB = 2^20 bytes) and its ratio to the copy "
             f"ceiling (mariadb | psql COPY) of the same bytes",
             f"{'value':>6} {'rows':>5} {'data MB':>8} {'ceil MB/s':>9} | {'load s':>7} {'MB/s':>6} {'/ceil':>6} "
             f"{'JVM MB':>7} {'Py MB':>6} | {'stream s':>8} {'MB/s':>6} {'/ceil':>6} {'JVM MB':>7} {'Py MB':>6} | "
             f"{'exact':>5}"]
    problems = []
    for size in results["sizes"]:
        ceiling = size.get("ceiling", {})
        cells = [f"{size['value_mb']:>4}MB {size['rows']:>5} {_shown(size.get('data_mb')):>8} "
                 f"{_shown(ceiling.get('mb_per_second')):>9}"]
        for phase, width in (("load", 7), ("stream", 8)):
            figures = size.get(phase)
            if figures is None:
                cells.append(f"{'-':>{width}} {'-':>6} {'-':>6} {'-':>7} {'-':>6}")
            elif figures.get("failed"):
                cells.append(f"{'FAILED':>{width}} {'-':>6} {'-':>6} {_shown(figures.get('peak_rss_mb_jvm')):>7} "
                             f"{_shown(figures.get('peak_rss_mb_python')):>6}")
                problems.append(f"{size['value_mb']} MB, {phase}: failed"
                                + (f" after {figures['seconds']} s" if "seconds" in figures else "")
                                + (" (an OutOfMemoryError in its log)" if figures.get("out_of_memory") else "")
                                + f": {figures['error']}")
            else:
                cells.append(f"{figures['seconds']:>{width}} {figures['mb_per_second']:>6} "
                             f"{_shown(figures['to_ceiling']):>6} {figures['peak_rss_mb_jvm']:>7} "
                             f"{figures['peak_rss_mb_python']:>6}")
                if not figures["exact"]:
                    problems.append(f"{size['value_mb']} MB, {phase}: the destination's values differ")
        if "setup" in size:
            problems.append(f"{size['value_mb']} MB: failed before the load (the rows or the ceiling): "
                            f"{size['setup']['error']}")
        if ceiling and not ceiling["exact"]:
            problems.append(f"{size['value_mb']} MB: the ceiling's copy differs from the source")
        lines.append(" | ".join(cells) + f" | {'yes' if size['exact'] else 'NO':>5}")
    return "\n".join(lines + problems)


def _shown(value: Any) -> str:
    return "-" if value is None else str(value)
