"""Withheld keys and indexes (`deferred_keys`) made again on several destination connections at once, as pg_restore
(`--jobs`) and pgcopydb build them after the data.

Each one is a statement in a transaction of its own, on a connection of its own, which also locks and deletes its
record in `deferred_constraints`: a run killed while building leaves recorded exactly what it had not committed,
and the next run makes it (a record already gone is skipped). Statements that take their table for themselves
(ALTER TABLE ... ADD: ACCESS EXCLUSIVE) run alone on it, while CREATE INDEX statements (SHARE) run side by side, so
no build waits on another one's lock (each session has the destination's `lock_timeout`). A foreign key locks the
table it references too, and needs the keys it references: the foreign keys run last, one at a time.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Iterable

import psycopg
from psycopg import sql

from cdc_pipeline.config import DestinationConfig
from cdc_pipeline.errors import CdcError

log = logging.getLogger(__name__)

CONSTRAINT = "constraint"
INDEX = "index"
PRIMARY_KEY = "primary key"
# A secondary index of the source table, built as soon as the table's rows are copied (`deferred_keys`).
SOURCE_INDEX = "source index"
_CREATE_INDEX = (INDEX, SOURCE_INDEX)
# Statements built at once. An index build is a scan then a sort, bound by the destination's cores (PostgreSQL may
# add its own parallel workers to a large one: max_parallel_maintenance_workers, 2 by default). Two builds keep the
# two cores of a destination like the test machine's busy while one of them reads and the other sorts; more would
# share the same cores and each take its own maintenance_work_mem. Never more than there are statements.
BUILD_CONNECTIONS = 2


@dataclasses.dataclass(frozen=True)
class Withheld:
    """A constraint or index of a destination table, as `deferred_constraints` records it."""

    dest_schema: str
    dest_table: str
    name: str
    kind: str  # CONSTRAINT, INDEX, PRIMARY_KEY or SOURCE_INDEX
    definition: str  # `CONSTRAINT name ...` (PRIMARY_KEY, CONSTRAINT) or a CREATE INDEX statement (the indexes)
    attach: bool = False  # a primary key whose unique index is built (`key_index`): the key is made on it

    def key_index(self) -> sql.Composable | None:
        """A primary key's unique index, built as the table's other indexes are and beside them, before the key is
        made on it (`attach`), as pg_restore and pgcopydb build keys: the ALTER TABLE that makes a key from its
        columns takes the table from every other build for as long as it sorts. None for anything else, or a key
        whose definition a CREATE INDEX does not take (an index tablespace): that one is made in one statement."""
        if self.kind != PRIMARY_KEY or self.attach:
            return None
        prefix = sql.SQL("CONSTRAINT {} PRIMARY KEY ").format(sql.Identifier(self.name)).as_string()
        if not self.definition.startswith(prefix) or "USING INDEX" in self.definition:
            return None
        return sql.SQL("CREATE UNIQUE INDEX IF NOT EXISTS {} ON {} {}").format(
            sql.Identifier(self.name), self.target, sql.SQL(self.definition[len(prefix):]))  # type: ignore[arg-type]

    @property
    def table(self) -> str:
        return f"{self.dest_schema}.{self.dest_table}"

    @property
    def target(self) -> sql.Identifier:
        return sql.Identifier(self.dest_schema, self.dest_table)

    @property
    def foreign_key(self) -> bool:
        prefix = sql.SQL("CONSTRAINT {} FOREIGN KEY").format(sql.Identifier(self.name)).as_string()
        return self.kind == CONSTRAINT and self.definition.startswith(prefix)

    def statement(self) -> sql.Composable:
        # The definition is the destination's own rendering of it (pg_get_constraintdef, pg_get_indexdef) or one
        # composed by `psycopg.sql` (SOURCE_INDEX), run as it is; no source name is formatted into it here.
        if self.kind in _CREATE_INDEX:
            return sql.SQL(self.definition)  # type: ignore[arg-type]
        if self.attach:
            return sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY USING INDEX {}").format(
                self.target, sql.Identifier(self.name), sql.Identifier(self.name))
        return sql.SQL("ALTER TABLE {} ADD {}").format(self.target, sql.SQL(self.definition))  # type: ignore[arg-type]

    def shares_table_with(self, other: "Withheld") -> bool:
        """Whether both may be built on the same table at the same moment (two CREATE INDEX statements)."""
        return self._creates_index and other._creates_index

    @property
    def _creates_index(self) -> bool:
        return self.kind in _CREATE_INDEX or self.key_index() is not None

    def __str__(self) -> str:
        return f"{self.table}.{self.name}"


class Builds:
    """Withheld constraints and indexes of a connector being made on up to `connections` destination connections
    of their own: `submit` queues them (each built once), `wait` returns once every one queued is made or has
    failed, and raises naming each that failed (those stay recorded for the next run). `seconds`: how long at
    least one was being built."""

    def __init__(self, destination: DestinationConfig, connector: str, position: Any = None,
                 connections: int = BUILD_CONNECTIONS) -> None:
        self.destination, self.connector, self.position = destination, connector, position
        self.connections = max(1, connections)
        self.made: list[str] = []
        self._changed = threading.Condition()
        self._queued: list[Withheld] = []
        self._running: list[Withheld] = []
        self._submitted: set[tuple[str, str, str]] = set()
        self._threads: list[threading.Thread] = []
        # Workers that have not yet found the queue empty: one that did is leaving (closing its connection) and
        # takes nothing more, so it is not counted though its thread may still be alive.
        self._workers = 0
        self._failures: list[CdcError] = []
        self._stopping = False
        self._busy_since: float | None = None
        self._busy_seconds = 0.0

    @property
    def seconds(self) -> float:
        with self._changed:
            busy = 0.0 if self._busy_since is None else time.monotonic() - self._busy_since
            return self._busy_seconds + busy

    def submit(self, items: Iterable[Withheld]) -> None:
        with self._changed:
            for item in items:
                key = (item.dest_schema, item.dest_table, item.name)
                if key not in self._submitted:
                    self._submitted.add(key)
                    self._queued.append(item)
            self._threads = [thread for thread in self._threads if thread.is_alive()]
            wanted = min(self.connections, len(self._queued) + len(self._running))
            for _ in range(wanted - self._workers):
                thread = threading.Thread(target=self._work, name="key-build", daemon=True)
                self._threads.append(thread)
                self._workers += 1
                thread.start()
            self._changed.notify_all()

    def wait(self) -> list[str]:
        """Waits for every statement queued; returns the names of those made (`schema.table.name`) or raises."""
        self._join()
        if self._failures:
            first = self._failures[0]
            raise CdcError("; ".join(failure.message for failure in self._failures), connector=self.connector,
                           table=first.table, position=self.position)
        return self.made

    def close(self) -> None:
        """Starts no other statement and waits for those being built (the run ends: the rest stay recorded)."""
        with self._changed:
            self._stopping = True
            self._queued.clear()
            self._changed.notify_all()
        self._join()

    def _join(self) -> None:
        while True:
            with self._changed:
                alive = [thread for thread in self._threads if thread.is_alive()]
            if not alive:
                return
            for thread in alive:
                thread.join()

    def _work(self) -> None:
        conn = None
        try:
            while (item := self._take()) is not None:
                follow: Withheld | None = None
                try:
                    if conn is None:
                        conn = self.destination.connect(self.connector)
                    follow = self._build(conn, item)
                except Exception as exc:  # noqa: BLE001 - raised by wait(), in the caller's thread
                    self._failed(item, exc.message if isinstance(exc, CdcError) else str(exc).strip())
                    if conn is not None and conn.broken:
                        conn = None
                finally:
                    self._done(item, follow)
        finally:
            if conn is not None:
                conn.close()

    def _take(self) -> Withheld | None:
        """The next statement none being built stands in the way of (waiting while each does), or None."""
        with self._changed:
            while self._queued and not self._stopping:
                for item in self._queued:
                    if self._may_start(item):
                        self._queued.remove(item)
                        self._running.append(item)
                        if self._busy_since is None:
                            self._busy_since = time.monotonic()
                        return item
                self._changed.wait()
            self._workers -= 1
            return None

    def _may_start(self, item: Withheld) -> bool:
        if item.foreign_key:
            return not self._running and all(queued.foreign_key for queued in self._queued)
        return not any(running.foreign_key or (running.table == item.table and not item.shares_table_with(running))
                       for running in self._running)

    def _done(self, item: Withheld, follow: Withheld | None = None) -> None:
        with self._changed:
            self._running.remove(item)
            if follow is not None and not self._stopping:
                self._queued.insert(0, follow)
            if not self._running and self._busy_since is not None:
                self._busy_seconds += time.monotonic() - self._busy_since
                self._busy_since = None
            self._changed.notify_all()

    def _failed(self, item: Withheld, reason: str) -> None:
        with self._changed:
            self._failures.append(CdcError(f"cannot make {item.kind} {item.name} of {item.table} again after the bulk "
                                           f"snapshot: {reason}", connector=self.connector, table=item.table,
                                           position=self.position))

    def _build(self, conn: psycopg.Connection, item: Withheld) -> Withheld | None:
        """Makes the statement's constraint or index and forgets its record, in one transaction; does nothing when
        the record is gone (made by another run), and only forgets it when the table is gone or already has it.
        A primary key's unique index (`key_index`) is built in a transaction of its own, its record kept: what is
        left, making the key on it, is returned (a run killed between the two builds the index again, at once)."""
        records = sql.Identifier(self.destination.control_schema, "deferred_constraints")
        started = time.monotonic()
        with conn.transaction(), conn.cursor() as cur:
            where = sql.SQL("WHERE connector = %s AND dest_schema = %s AND dest_table = %s AND name = %s")
            key = (self.connector, item.dest_schema, item.dest_table, item.name)
            if cur.execute(sql.SQL("SELECT 1 FROM {} {} FOR UPDATE").format(records, where), key).fetchone() is None:
                return
            regclass = item.target.as_string(conn)
            exists, has_primary_key = cur.execute(
                "SELECT to_regclass(%s) IS NOT NULL, EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = "
                "to_regclass(%s) AND contype = 'p')", (regclass, regclass)).fetchone()
            made = exists
            key_index = item.key_index()
            if exists and key_index is not None and not has_primary_key:
                cur.execute(key_index)
                log.info("%s: made the unique index of primary key %s in %.1f s", self.connector, item,
                         time.monotonic() - started)
                return dataclasses.replace(item, attach=True)
            if exists and not (item.kind == PRIMARY_KEY and has_primary_key):
                try:
                    with conn.transaction():
                        cur.execute(item.statement())
                except (psycopg.errors.DuplicateObject, psycopg.errors.DuplicateTable):
                    pass  # made already (by hand, or by a schema change of the stream)
                except psycopg.errors.UndefinedObject as exc:
                    if item.kind != SOURCE_INDEX:
                        raise
                    # The column's destination type has no operator class of the source's access method (a type
                    # rule changed it): no later run could build it either.
                    made = False
                    log.warning("%s: the source's index %s is left out: %s", self.connector, item,
                                str(exc).strip().splitlines()[0])
            cur.execute(sql.SQL("DELETE FROM {} {}").format(records, where), key)
        if made:
            log.info("%s: made %s %s in %.1f s", self.connector, item.kind, item, time.monotonic() - started)
            with self._changed:
                self.made.append(str(item))
