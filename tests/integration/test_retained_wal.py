"""A PostgreSQL connector whose captured tables are quiet while other tables of its database are busy: the change
check asks for a run once its slot holds more unconfirmed WAL than `retained_wal_run_mb`, and that run confirms the
slot past the uncaptured WAL (Debezium's heartbeat writes to the heartbeat table, whose event is committed, not
applied)."""

from __future__ import annotations

import psycopg
import pytest

from cdc_pipeline.config import load_config
from cdc_pipeline.ops import pending
from tests.helpers.postgres_source import SOURCE_SCHEMA, PostgresPipeline

pytestmark = pytest.mark.integration

WRITTEN_ROWS = 20_000  # about 12 MB of WAL in a table the connector does not capture


def _unconfirmed_wal(pipeline: PostgresPipeline) -> int:
    with psycopg.connect(pipeline.source_dsn) as conn:
        return int(conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint FROM pg_replication_slots "
            "WHERE slot_name = %s", (f"cdc_{pipeline.name}",)).fetchone()[0])


def _check(name: str) -> pending.Pending:
    config = load_config()
    return pending.check(config.connector(name), config.destination)


def test_a_run_confirms_the_slot_past_wal_of_tables_it_does_not_capture(pg_pipeline: PostgresPipeline):
    pg_pipeline.source(["CREATE TABLE items (id integer PRIMARY KEY, v text)",
                        "CREATE TABLE other (id integer PRIMARY KEY, t text)", "INSERT INTO items VALUES (1, 'a')"])
    pg_pipeline.write_config(tables=[f"{SOURCE_SCHEMA}.items"], retained_wal_run_mb=4)
    pg_pipeline.sync()
    assert not _check(pg_pipeline.name).work

    before = _unconfirmed_wal(pg_pipeline)
    pg_pipeline.source([f"INSERT INTO other SELECT i, repeat('x', 500) FROM generate_series(1, {WRITTEN_ROWS}) i",
                        "SELECT pg_switch_wal()"])
    written = _unconfirmed_wal(pg_pipeline) - before
    assert written > 8 << 20
    found = _check(pg_pipeline.name)
    assert found.work and "unconfirmed WAL" in found.reason, found

    # The run's idle time must outlast the server's decoding of that WAL and a heartbeat after it: 5 s, not the
    # fixture's 2 s, for a slow machine.
    pg_pipeline.write_config(tables=[f"{SOURCE_SCHEMA}.items"], retained_wal_run_mb=4, idle_timeout_seconds=5)
    pg_pipeline.sync()
    assert _unconfirmed_wal(pg_pipeline) < written // 4, "the run confirmed the slot past the uncaptured WAL"
    pg_pipeline.assert_same("items")
    assert not _check(pg_pipeline.name).work
    assert "cdc_heartbeat" not in {row[0] for row in pg_pipeline.dest_query(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")}
