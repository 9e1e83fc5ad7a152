"""Under `skip`, a step undone by its savepoint leaves the run's reads of the destination as they were before it: a
table change the step made (a PostgreSQL source's new column, altered in before the rows) is undone with it, and the
halves the step is narrowed down to alter the table again, so only the event that fails becomes a dead letter; a
claim of the table undone with it is made again by the run's next write of the table."""

from __future__ import annotations

import copy
import uuid
from pathlib import Path

import psycopg
import pytest

from cdc_pipeline import control
from cdc_pipeline.config import parse_config
from cdc_pipeline.sink.apply import BatchApplier
from cdc_pipeline.sink.plan import attach_dml_frames, plan_batch
from tests.helpers.spark import fixture_records, parse_records


@pytest.fixture
def destination(destination_pg) -> str:
    name = f"skip_{uuid.uuid4().hex[:8]}"
    destination_pg.create_database(name)
    return destination_pg.dsn(name)


def _customer(record: dict, customer_id: int, row: int) -> dict:
    record = copy.deepcopy(record)
    payload = record["value"]["payload"]
    payload["after"] = {**payload["after"], "id": customer_id, "email": f"{customer_id}@x.io"}
    payload["source"]["row"] = row
    record["key"]["payload"] = {"id": customer_id}
    return record


def _connector(destination: str):
    return parse_config({
        "destination": {"dsn": destination},
        "connectors": {"pg": {"type": "postgres", "hostname": "localhost", "user": "cdc", "password": "secret",
                              "database": "inventory", "error_strategy": "skip"}},
    }, Path("x.yaml")).connector("pg")


def _apply(applier: BatchApplier, connector, records: list[dict]) -> None:
    parsed = parse_records(records)
    try:
        plan = plan_batch(parsed, connector)
        attach_dml_frames(plan)
        applier.apply(plan)
    finally:
        parsed.release()


@pytest.mark.integration
def test_a_column_added_by_a_step_its_savepoint_undid_is_added_again_for_its_good_events(destination) -> None:
    connector = _connector(destination)
    records = fixture_records()
    two_columns, three_columns = records[14], records[17]  # customers' inserts before and after `score` came
    batch = [two_columns] + [_customer(three_columns, customer_id, row) for row, customer_id in enumerate((3, 4, 5))]
    with psycopg.connect(destination, autocommit=True) as conn:
        control.ensure_control_schema(conn, "cdc")
        conn.execute("CREATE SCHEMA inventory")
        # The destination refuses customer 4 (a constraint added by hand): that one event is the poison.
        conn.execute("CREATE TABLE inventory.customers (id int PRIMARY KEY, email text, CONSTRAINT no_four "
                     "CHECK (id <> 4))")
    with psycopg.connect(destination) as conn:
        _apply(BatchApplier(conn, connector, "cdc"), connector, batch)
    with psycopg.connect(destination) as conn:
        letters = conn.execute("SELECT raw_event FROM cdc.dead_letters").fetchall()
        assert len(letters) == 1 and '"id":4' in letters[0][0], "only the event the destination refuses"
        rows = conn.execute("SELECT id, email, score FROM inventory.customers ORDER BY id").fetchall()
    assert rows == [(1, "a@x.io", None), (3, "3@x.io", "4.50"), (5, "5@x.io", "4.50")]


@pytest.mark.integration
def test_a_claim_its_savepoint_undid_is_made_again_by_the_runs_next_write(destination) -> None:
    connector = _connector(destination)
    first = fixture_records()[14]
    with psycopg.connect(destination, autocommit=True) as conn:
        control.ensure_control_schema(conn, "cdc")
        conn.execute("CREATE SCHEMA inventory")
        conn.execute("CREATE TABLE inventory.customers (id int, email text, CONSTRAINT no_four CHECK (id <> 4))")
    with psycopg.connect(destination) as conn:
        applier = BatchApplier(conn, connector, "cdc")
        _apply(applier, connector, [_customer(first, 4, 0)])  # refused: its step, the claim with it, undone
        _apply(applier, connector, [_customer(first, 5, 1)])
    with psycopg.connect(destination) as conn:
        assert conn.execute("SELECT id FROM inventory.customers").fetchall() == [(5,)]
        owners = conn.execute("SELECT dest_schema, dest_table, connector FROM cdc.table_owners").fetchall()
    assert owners == [("inventory", "customers", "pg")], "the table the run writes is claimed"
