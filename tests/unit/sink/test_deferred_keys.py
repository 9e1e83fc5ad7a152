"""Withheld keys and indexes against a real destination: recorded and dropped, made again several at once, each
exactly once, foreign keys after the keys they reference, failures named and left recorded."""

from __future__ import annotations

import dataclasses
import time
import uuid

import pytest

from cdc_pipeline import control
from cdc_pipeline.config import DestinationConfig, Secret
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sink import deferred_keys
from cdc_pipeline.sink.key_builds import Builds

CONNECTOR = "shop"


@pytest.fixture
def destination(destination_pg) -> DestinationConfig:
    database = f"keys_{uuid.uuid4().hex[:12]}"
    destination_pg.create_database(database)
    config = DestinationConfig(dsn=Secret(destination_pg.dsn(database)), control_schema="cdc")
    with config.connect() as conn:
        control.ensure_control_schema(conn, "cdc")
        conn.execute("CREATE SCHEMA app")
    return config


def _run(destination: DestinationConfig, *statements: str) -> None:
    with destination.connect() as conn:
        for statement in statements:
            conn.execute(statement)


def _query(destination: DestinationConfig, query: str, params: tuple = ()) -> list[tuple]:
    with destination.connect() as conn:
        return conn.execute(query, params).fetchall()


def _constraints(destination: DestinationConfig, table: str) -> list[tuple[str, str]]:
    return _query(destination, "SELECT conname, contype::text FROM pg_constraint WHERE conrelid = %s::regclass "
                  "AND contype <> 'n' ORDER BY conname", (f"app.{table}",))


def _indexes(destination: DestinationConfig, table: str) -> list[str]:
    return [name for (name,) in _query(destination, "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid "
                                       "= %s::regclass ORDER BY 1", (f"app.{table}",))]


def _recorded(destination: DestinationConfig) -> list[tuple[str, str, str]]:
    return _query(destination, "SELECT dest_table, name, kind FROM cdc.deferred_constraints ORDER BY 1, 2")


def _withhold(destination: DestinationConfig, *tables: str, primary_keys: bool = True) -> None:
    """As a load plans its tables: every table's constraints and indexes, then their primary keys."""
    with destination.connect() as conn, conn.transaction(), conn.cursor() as cur:
        for table in tables:
            deferred_keys.withhold(cur, "cdc", CONNECTOR, "app", table)
        for table in tables if primary_keys else ():
            deferred_keys.withhold_primary_key(cur, "cdc", CONNECTOR, "app", table)


def test_keys_and_indexes_withheld_then_made_again_foreign_keys_last(destination):
    _run(destination,
         "CREATE TABLE app.parent (id int PRIMARY KEY, code text CONSTRAINT parent_code UNIQUE, qty int)",
         "CREATE INDEX parent_qty ON app.parent (qty)",
         "CREATE TABLE app.child (id int PRIMARY KEY, code text CONSTRAINT child_parent REFERENCES app.parent (code))",
         "INSERT INTO app.parent SELECT n, 'c' || n, n % 7 FROM generate_series(1, 20000) n",
         "INSERT INTO app.child SELECT n, 'c' || (n % 100 + 1) FROM generate_series(1, 20000) n")
    _withhold(destination, "child", "parent")
    assert _recorded(destination) == [
        ("child", "child_parent", "constraint"), ("child", "child_pkey", "primary key"),
        ("parent", "parent_code", "constraint"), ("parent", "parent_pkey", "primary key"),
        ("parent", "parent_qty", "index")]
    assert _constraints(destination, "parent") == [] and _indexes(destination, "child") == []

    with destination.connect() as conn:
        made = deferred_keys.restore(conn, destination, CONNECTOR)
    # The foreign key needs the unique key it references: it is made after it, whatever the order of the others.
    assert sorted(made) == ["app.child.child_parent", "app.child.child_pkey", "app.parent.parent_code",
                            "app.parent.parent_pkey", "app.parent.parent_qty"]
    assert made[-1] == "app.child.child_parent"
    assert _constraints(destination, "parent") == [("parent_code", "u"), ("parent_pkey", "p")]
    assert _constraints(destination, "child") == [("child_parent", "f"), ("child_pkey", "p")]
    assert _indexes(destination, "parent") == ["app.parent_code", "app.parent_pkey", "app.parent_qty"]
    assert _recorded(destination) == []


def test_a_primary_key_another_table_references_is_kept(destination):
    _run(destination, "CREATE TABLE app.parent (id int PRIMARY KEY)",
         "CREATE TABLE app.other (id int PRIMARY KEY, parent int CONSTRAINT other_parent REFERENCES app.parent)")
    _withhold(destination, "parent")
    assert _constraints(destination, "parent") == [("parent_pkey", "p")]
    assert _recorded(destination) == []


def test_each_build_is_made_once_and_one_that_exists_is_skipped(destination):
    _run(destination, "CREATE TABLE app.items (id int PRIMARY KEY, n int)",
         "INSERT INTO app.items SELECT n, n FROM generate_series(1, 1000) n")
    _withhold(destination, "items")
    # Made by hand (or by a run killed after its build committed and before this one read the records).
    _run(destination, "ALTER TABLE app.items ADD CONSTRAINT items_pkey PRIMARY KEY (id)")
    builds = Builds(destination, CONNECTOR)
    with destination.connect() as conn:
        withheld = deferred_keys.waiting(conn, "cdc", CONNECTOR, deferred_keys.PRIMARY_KEY, [("app", "items")])
    builds.submit(withheld)
    builds.submit(withheld)  # submitted twice: built once
    assert builds.wait() == ["app.items.items_pkey"]
    builds.close()
    assert _recorded(destination) == [] and _constraints(destination, "items") == [("items_pkey", "p")]
    # A record another run made in the meantime is gone: nothing to do.
    again = Builds(destination, CONNECTOR)
    again.submit(withheld)
    assert again.wait() == []


def test_a_broken_key_names_its_table_and_reason_and_stays_recorded_while_the_others_are_made(destination):
    _run(destination,
         "CREATE TABLE app.users (id int PRIMARY KEY, email text CONSTRAINT users_email UNIQUE, age int)",
         "CREATE INDEX users_age ON app.users (age)",
         "CREATE TABLE app.orders (id int PRIMARY KEY, total int)",
         "CREATE INDEX orders_total ON app.orders (total)")
    _withhold(destination, "orders", "users", primary_keys=False)
    _run(destination, "INSERT INTO app.users VALUES (1, 'same@x', 30), (2, 'same@x', 40)")
    with destination.connect() as conn, pytest.raises(CdcError) as failure:
        deferred_keys.restore(conn, destination, CONNECTOR, position={"pos": 7})
    message = str(failure.value)
    assert "cannot make constraint users_email of app.users again" in message
    assert "could not create unique index" in message and "table 'app.users'" in message and "7" in message
    assert _recorded(destination) == [("users", "users_email", "constraint")]
    assert _indexes(destination, "users") == ["app.users_age", "app.users_pkey"]
    assert _indexes(destination, "orders") == ["app.orders_pkey", "app.orders_total"]


def test_keys_that_take_their_table_for_themselves_are_built_one_after_the_other(destination):
    # A lock wait of a millisecond fails a statement: two unique keys of one table built side by side would.
    hurried = DestinationConfig(dsn=destination.dsn, control_schema="cdc", lock_timeout_seconds=0.001)
    _run(destination,
         "CREATE TABLE app.wide (id int PRIMARY KEY, a int CONSTRAINT wide_a UNIQUE, b int CONSTRAINT wide_b UNIQUE, "
         "c int)", "CREATE INDEX wide_c1 ON app.wide (c)", "CREATE INDEX wide_c2 ON app.wide (c, id)",
         "INSERT INTO app.wide SELECT n, n, -n, n % 10 FROM generate_series(1, 200000) n")
    _withhold(destination, "wide")
    with destination.connect() as conn:
        withheld = deferred_keys.waiting(conn, "cdc", CONNECTOR)
    builds = Builds(hurried, CONNECTOR, connections=3)
    builds.submit(withheld)
    assert len(builds.wait()) == 5
    builds.close()
    assert builds.seconds > 0
    assert _constraints(destination, "wide") == [("wide_a", "u"), ("wide_b", "u"), ("wide_pkey", "p")]


def test_a_primary_key_is_built_as_a_unique_index_beside_the_other_indexes_then_made_on_it(destination):
    _run(destination,
         "CREATE TABLE app.items (id int PRIMARY KEY, qty int, note text)",
         "CREATE INDEX items_qty ON app.items (qty)",
         "INSERT INTO app.items SELECT n, n % 7, 'n' || n FROM generate_series(1, 20000) n")
    _withhold(destination, "items")
    with destination.connect() as conn:
        items = {item.kind: item for item in deferred_keys.waiting(conn, "cdc", CONNECTOR)}
    key, index = items["primary key"], items["index"]
    # The key's unique index shares the table with the other index build; making the key on it does not.
    assert key.shares_table_with(index) and key.key_index() is not None
    attach = dataclasses.replace(key, attach=True)
    assert not attach.shares_table_with(index) and attach.key_index() is None

    # A run killed between the two: the unique index is there, the record too; the next build makes the key on it.
    with destination.connect() as conn:
        conn.execute(key.key_index())
    builds = Builds(destination, CONNECTOR)
    builds.submit([key, index])
    assert sorted(builds.wait()) == ["app.items.items_pkey", "app.items.items_qty"]
    assert _constraints(destination, "items") == [("items_pkey", "p")]
    assert _indexes(destination, "items") == ["app.items_pkey", "app.items_qty"]
    assert _recorded(destination) == []


class _SlowToLeave(Builds):
    """A build connection that is slow to close: a worker that found the queue empty is still alive for a while."""

    def _take(self):
        item = super()._take()
        if item is None:
            time.sleep(0.5)
        return item


def test_a_build_submitted_while_the_last_worker_leaves_is_made_before_wait_returns(destination):
    _run(destination, "CREATE TABLE app.first (id int PRIMARY KEY)", "CREATE TABLE app.second (id int PRIMARY KEY)")
    _withhold(destination, "first", "second")
    with destination.connect() as conn:
        first = deferred_keys.waiting(conn, "cdc", CONNECTOR, deferred_keys.PRIMARY_KEY, [("app", "first")])
        second = deferred_keys.waiting(conn, "cdc", CONNECTOR, deferred_keys.PRIMARY_KEY, [("app", "second")])
    builds = _SlowToLeave(destination, CONNECTOR, connections=1)
    builds.submit(first)
    deadline = time.monotonic() + 30
    while builds.made != ["app.first.first_pkey"] and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    # The worker has found nothing more to build and is leaving; the next table's key comes now (a table's last
    # chunk copied, or the load's last submit before it waits).
    builds.submit(second)
    assert sorted(builds.wait()) == ["app.first.first_pkey", "app.second.second_pkey"]
    builds.close()
    assert _constraints(destination, "second") == [("second_pkey", "p")]
    assert _recorded(destination) == []
