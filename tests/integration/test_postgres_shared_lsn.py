"""PostgreSQL writes many rows of a COPY under one WAL record, so their changes share one LSN: runs cut by a budget or
a pause in such a stream neither skip the rest of the rows at that LSN nor apply any of them twice, on keyed and
keyless tables. A run ends only at a source commit, so a COPY is applied whole whatever cuts the run."""

from __future__ import annotations

import logging
import threading
import time

import psycopg
import pytest
from psycopg import sql

from cdc_pipeline import control
from cdc_pipeline.config import load_config
from cdc_pipeline.ops import requests

pytestmark = pytest.mark.integration

ROWS = 8_000
BUDGET_ROWS = 6_000
BUDGET_RUNS = 8


def _copy(pipe, table: str, first: int, count: int) -> None:
    """COPYs `count` rows into `table` in one transaction (heap_multi_insert: up to a page of rows per WAL record)."""
    with psycopg.connect(pipe.source_dsn) as conn, conn.cursor() as cur:
        with cur.copy(sql.SQL("COPY {} (id, v) FROM STDIN").format(sql.Identifier("public", table))) as copy:
            for i in range(first, first + count):
                copy.write_row((i, f"row {i} of a COPY"))


def _ask(pipe, kind: str) -> None:
    """Submits the request and serves it, as the request sensor does."""
    with psycopg.connect(pipe.dest_dsn, autocommit=True) as conn:
        control.ensure_control_schema(conn, "cdc")
        requests.submit_request(conn, "cdc", pipe.name, kind, None)
        [outcome] = requests.serve_pending_requests(conn, "cdc", load_config(pipe.config_path))
    assert outcome.status == requests.DONE, outcome.reason


def _two_tables_copied(pipe, rows: int = ROWS) -> None:
    """A keyed and a keyless table, loaded by a first sync with one row each, then `rows` COPYed into each, one
    transaction a table, while no run streams."""
    pipe.source(["CREATE TABLE keyed (id integer PRIMARY KEY, v text)", "CREATE TABLE loose (id integer, v text)",
                 "ALTER TABLE loose REPLICA IDENTITY FULL",
                 "INSERT INTO keyed VALUES (0, 'before')", "INSERT INTO loose VALUES (0, 'before')"])
    pipe.write_config(tables=TABLES)
    pipe.sync()
    _copy(pipe, "keyed", 1, rows)
    _copy(pipe, "loose", 1, rows)


def _assert_exact(pipe, rows: int = ROWS) -> None:
    for table in ("keyed", "loose"):
        assert len(pipe.dest_rows(table)) == rows + 1, table
        pipe.assert_same(table)


TABLES = ["public.keyed", "public.loose"]


def test_runs_cut_by_their_budget_inside_copies_end_exact(pg_pipeline, caplog):
    """Runs whose time budget is spent by their first batch, inside a COPY's transaction (rows sharing an LSN), go on
    to its commit, in one destination transaction over the groups it spans: a table holds all of a COPY or none of
    it, and the runs end exact."""
    _two_tables_copied(pg_pipeline, BUDGET_ROWS)
    pg_pipeline.write_config(tables=TABLES, batch_size=200, apply_batch_events=200, max_seconds_per_run=0.5)
    spanned = 0
    # A run whose budget passes before the engine's first batch fetches nothing (a slow start): the next one goes on.
    for _ in range(BUDGET_RUNS + 1):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="cdc_pipeline"):
            pg_pipeline.sync()
        spanned += any("spanned" in record.getMessage() for record in caplog.records)
        for table in ("keyed", "loose"):
            assert len(pg_pipeline.dest_rows(table)) in (1, BUDGET_ROWS + 1), f"{table} holds part of a COPY"
    assert spanned, "a run's budget was spent inside a COPY, and the run applied the COPY whole"
    pg_pipeline.write_config(tables=TABLES)
    pg_pipeline.sync()

    _assert_exact(pg_pipeline, BUDGET_ROWS)


def test_a_pause_inside_a_copy_ends_the_run_where_no_change_of_its_lsn_is_left(pg_pipeline):
    """A pause ends the run at its next look at the state, after any batch: rows of the LSN its last change has are
    fetched and applied with it, none left for the next run to skip as applied."""
    _two_tables_copied(pg_pipeline)
    pg_pipeline.write_config(tables=TABLES, batch_size=300, apply_batch_events=300)
    paused = threading.Event()

    def pause_once_rows_land() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if len(pg_pipeline.dest_rows("keyed")) > 1:
                _ask(pg_pipeline, requests.PAUSE)
                paused.set()
                return
            time.sleep(0.05)

    pauser = threading.Thread(target=pause_once_rows_land, daemon=True)
    pauser.start()
    pg_pipeline.sync()
    pauser.join(timeout=130)
    assert paused.is_set(), "no row was applied in time to pause the run"
    # Paused once the first COPY was applied (whole): the run ends at the next source commit, not inside a COPY.
    assert len(pg_pipeline.dest_rows("keyed")) == ROWS + 1
    assert len(pg_pipeline.dest_rows("loose")) in (1, ROWS + 1), "the pause ended the run inside a COPY"

    _ask(pg_pipeline, requests.RESUME)
    pg_pipeline.sync()
    _assert_exact(pg_pipeline)
