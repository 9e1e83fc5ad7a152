"""A control schema made by this version is not made again: a run's start takes no lock on the control tables, so
connectors whose runs start together do not deadlock on them (ALTER TABLE ... IF NOT EXISTS locks its table)."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from cdc_pipeline import control

pytestmark = pytest.mark.integration


def test_a_made_control_schema_is_not_locked_again(destination_pg):
    name = f"ctl_{uuid.uuid4().hex[:8]}"
    destination_pg.create_database(name)
    with psycopg.connect(destination_pg.dsn(name), autocommit=True) as first:
        control.ensure_control_schema(first, "cdc")
        with psycopg.connect(destination_pg.dsn(name)) as busy:
            # Another connector's run in its load's transaction.
            busy.execute("DELETE FROM cdc.bulk_load_chunks WHERE connector = 'other'")
            busy.execute("LOCK TABLE cdc.stats, cdc.connector_state, cdc.bulk_loads IN ROW EXCLUSIVE MODE")
            with psycopg.connect(destination_pg.dsn(name), autocommit=True) as second:
                second.execute("SET lock_timeout = '500ms'")
                control.ensure_control_schema(second, "cdc")  # would wait on the ALTERs' locks, and time out
        first.execute("DROP TABLE cdc.control_version")  # a schema an earlier version made: migrated again
        control.ensure_control_schema(first, "cdc")
        assert first.execute("SELECT count(*) FROM cdc.control_version").fetchone()[0] == 1
