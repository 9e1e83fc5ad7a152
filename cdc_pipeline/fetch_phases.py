"""The fetch step of a cycle as phases, each with its own exits and budget: the engine's schema snapshot, the bulk
load, then the stream (or Debezium's own data snapshot).

- The schema snapshot (when the cycle begins a bulk load, or resumes one whose engine has no position yet): its
  groups are applied before anything else. It ends when the engine says so: the first streamed record it hands
  over (the runner never puts the end of a snapshot and the start of the stream in one batch), or, on a quiet
  source, Debezium's snapshot metric completed with its queue and ours empty. A PostgreSQL engine emits no schema
  events: its snapshot is over once it streams (its slot holds the position). A snapshot cannot be resumed, so this
  phase runs to its end whatever the budget.
- The bulk load copies the rows before any change of the stream is applied; the streamed batch that ended the
  schema snapshot waits for it. A load that does not finish within the budget ends the run.
- The stream yields groups until the source is idle, paused, or the run's budget (`max_events_per_run`,
  `max_seconds_per_run`) is spent, never splitting the records of one statement between runs, nor ending a run
  (whose last commit moves the applied position and Debezium's offset past its last record) between PostgreSQL
  changes that share one LSN (`may_share_lsn_ahead` of the PostgreSQL source); a group within the run waits the same way after
  an insert seen sharing its LSN (`_lsn_seen_shared`).

Groups and runs end only at source commits. Debezium's transaction metadata brackets each source transaction's
changes with a BEGIN and an END record, and the runner cuts an engine batch after its last END, so a commit falls
between two batches (`FetchedBatch.transaction_open`: a transaction is open after the batch). A group that reaches
its bounds closes at the last commit inside it, the batches after it going on into the next group
(`_take_group`); a group all inside one transaction (one larger than a group's bounds) is handed on whole, and
applied in a destination transaction that spans groups until the group its END is in (`cycle.TransactionSpan`). No
budget or pause ends a run inside a transaction: the run waits for its END (`_await_transaction_end`). A BEGIN
that came last, none of its changes yet, waits for them rather than going downstream (`_begun_tail`), and a group
of no change (a BEGIN or an END alone) takes the next batch whatever its bounds: neither makes a group that commits
nothing.
"""

from __future__ import annotations

import json
import logging
import time
from functools import cached_property
from typing import TYPE_CHECKING, Any, Iterator

from cdc_pipeline import control, faults, sources
from cdc_pipeline.capture.runner import FetchedBatch
from cdc_pipeline.capture.spark import working_on
from cdc_pipeline.convert.schema_infer import SCHEMA_FROM_EVENTS_TYPES
from cdc_pipeline.decode.events import (BEGIN, DATA_CHANGE, OTHER, TRANSACTION, TRANSACTION_BEGUN, TRANSACTION_OPEN,
                                         TRUNCATE, same_stream_position, transaction_state_after)
from cdc_pipeline.errors import RunnerError
from cdc_pipeline.sources.protocol import Source
from cdc_pipeline.sink.plan import LAST_SNAPSHOT_MARKER

if TYPE_CHECKING:
    from cdc_pipeline.cycle import ConnectorSession

log = logging.getLogger(__name__)

ENGINE_START_TIMEOUT_SECONDS = 120.0
# A standing run's budget (max_seconds_per_run) counts from its first change: one that fetched nothing ends after this
# long (the change sensor launches the next), so that a quiet connector's standing run is not ended, and a change
# left to wait for the next one's start, every max_seconds_per_run.
STANDING_RUN_MAX_SECONDS = 3600.0
FETCH_WAIT_SECONDS = 0.5
GROUP_WAIT_SECONDS = 0.05  # a group goes downstream when the engine has had nothing more for this long
# On a quiet source, the schema snapshot is over once Debezium says it completed and both queues stayed empty this
# long (what the engine's thread polled may still be on its way into our queue for a moment).
SCHEMA_SNAPSHOT_SETTLE_SECONDS = 0.5
SETTLE_POLL_SECONDS = 0.05  # the fetch's wait while the schema snapshot may have settled
# How long the load waits, once the schema snapshot settled, for the CREATE TABLE event of a table it copies.
SCHEMA_SNAPSHOT_TABLES_WAIT_SECONDS = 30.0
# How long a group all inside one source transaction waits for more of it before it goes downstream all the same,
# as a part of a destination transaction that spans groups. A transaction's changes come together (its END usually
# in the next engine batch, which a loaded machine may take a second or more to make), a group at its bounds goes
# on at once, and so does one the engine waits on (`DebeziumRunner.waiting_for_room`): this is a last resort.
OPEN_TRANSACTION_GROUP_WAIT_SECONDS = 10.0


class FetchCycle:
    """The fetch step's shared state: the group being gathered, the run's budget, the batch carried between phases.

    Iterating it runs the phases in order and yields groups of consecutive batches of up to `apply_batch_events`
    events and `apply_batch_mb` of rows, each as soon as the engine has nothing more ready, so the engine goes on capturing while a group is
    applied downstream. A run's first group holds one runner batch (`batch_size` events, with the rest of a statement
    it starts): the cold JVM's first Spark job then parses, stages and merges a few hundred events, not twenty thousand,
    and the next group, gathered meanwhile, is a full one.
    """

    def __init__(self, session: "ConnectorSession") -> None:
        assert session.runner is not None
        self.session = session
        self.runner = session.runner
        self.connector = session.connector
        self.started = time.monotonic()
        self.group: list[FetchedBatch] = []
        self.group_events = 0
        self.group_bytes = 0
        self.groups = 0  # taken so far in this run
        self.events = 0
        self.last_batch_at = self.started
        self.first_change_at: float | None = None  # when the run fetched its first row change (`_holds_change`)
        self.carried: FetchedBatch | None = None  # fetched by a phase, applied by the next
        self.settled_at: float | None = None  # the schema snapshot settled with a loaded table's CREATE awaited
        self.budget_spent = False  # the run ends at the next cut between statements
        self.last_offset: dict[str, Any] | None = None  # the source offset of the last batch fetched
        self.loaded = False  # this run finished a bulk load before its stream
        self.last_fetched: FetchedBatch | None = None  # the last batch added (its group may be handed on already)
        self.last_continued = False  # it went on at the offset the batch before it ended at
        # PostgreSQL: the last change fetched, which may share its LSN with changes still to come, and since when
        # the stream waits for a record past it (`_await_past_open_change`).
        self.open_change: tuple[dict[str, Any] | None, float] | None = None
        # Where the stream stands after the last batch fetched (`events.transaction_state_after`).
        self.transaction_state = ""
        # Since when the stream, drained, waits for more of the open transaction (`_await_transaction_end`).
        self.transaction_wait: float | None = None

    @property
    def deadline(self) -> float:
        return self.started + self.connector.max_seconds_per_run

    @property
    def stream_deadline(self) -> float:
        """When the stream's budget ends: `deadline`; for a standing run (`ConnectorSession.standing`),
        max_seconds_per_run after its first row change, or STANDING_RUN_MAX_SECONDS after its start while it fetched
        none (the time it stood quiet does not count)."""
        if not self.session.standing:
            return self.deadline
        if self.first_change_at is None:
            return self.started + max(STANDING_RUN_MAX_SECONDS, self.connector.max_seconds_per_run)
        return self.first_change_at + self.connector.max_seconds_per_run

    def __iter__(self) -> Iterator[list[FetchedBatch]]:
        if self.session.awaits_schema_snapshot:
            if not (yield from self._schema_snapshot()):
                return
        if self.session.bulk_load_pending:
            if not self._bulk_load():
                return
            self.loaded = True
        yield from self._stream()
        log.info("%s: fetched %d events", self.connector.name, self.events)

    # The schema snapshot.

    def _schema_snapshot(self) -> Iterator[list[FetchedBatch]]:
        """Yields the schema snapshot's groups; returns whether the cycle goes on (not paused, engine alive)."""
        if self.connector.type in SCHEMA_FROM_EVENTS_TYPES:
            return self._await_streaming()
        goes_on = True
        while True:
            if self.session.halted():
                log.info("%s: paused during the schema snapshot", self.connector.name)
                goes_on = False
                break
            # Once the snapshot's tables exist the load need not wait for the fetch's timeout to see it settled.
            batch = self._fetch(SETTLE_POLL_SECONDS if not self.group and self._load_tables_created() else None)
            now = time.monotonic()
            if batch is not None and batch.streamed:
                log.info("%s: the schema snapshot ended; the stream's first batch waits for the bulk load",
                         self.connector.name)
                self.carried = batch
                break
            if batch is not None:
                continued = self._add(batch, now)
                if continued is not None:
                    yield continued
                continue
            if self.group:
                yield self._take_group()
                continue
            if self._snapshot_settled(now) and not self._load_tables_awaited(now):
                log.info("%s: the schema snapshot completed", self.connector.name)
                break
            self._raise_unless_engine_alive(now, "start polling", started=self.runner.is_polling())
            if self.runner.state == "STOPPED":
                goes_on = False
                break
        if self.group:
            yield self._take_group()
        return goes_on

    def _await_streaming(self) -> bool:
        """A PostgreSQL engine has its position once it streams; the changes it streams meanwhile wait in its
        queue. Returns whether the cycle goes on."""
        while not self.runner.is_streaming():
            if self.session.halted():
                return False
            self._raise_unless_engine_alive(time.monotonic(), "start streaming", started=False)
            if self.runner.state == "STOPPED":
                return False
            time.sleep(0.05)
        return True

    def _snapshot_settled(self, now: float) -> bool:
        """Debezium's snapshot completed and nothing of it is left on the way to us (its queue and ours empty), for
        SCHEMA_SNAPSHOT_SETTLE_SECONDS since its last batch. A load waits no longer than for its own tables: once
        the snapshot's events came and every table it copies has its destination table, what may still be on the
        way is about other tables, and is applied as the stream's first changes."""
        snapshot = self.runner.snapshot_status()
        if not (snapshot.get("completed") and self.runner.engine_queue_empty() and self.runner.queued_batches() == 0):
            return False
        return now - self.last_batch_at >= SCHEMA_SNAPSHOT_SETTLE_SECONDS or self._load_tables_created()

    def _load_tables_created(self) -> bool:
        """Whether a load is pending, the schema snapshot's events came, and every table it copies exists."""
        return self.session.bulk_load_pending and self.events > 0 and not self.session.tables_awaiting_creation()

    def _load_tables_awaited(self, now: float) -> bool:
        """Whether the load is to wait for more of the schema snapshot: a table it copies has no destination table
        yet, its CREATE TABLE event still on its way from the engine (a loaded machine can hold it past the settle
        time). After SCHEMA_SNAPSHOT_TABLES_WAIT_SECONDS the load starts all the same, and fails naming the table."""
        if not self.session.bulk_load_pending:
            return False
        awaited = self.session.tables_awaiting_creation()
        if not awaited:
            return False
        if self.settled_at is None:
            self.settled_at = now
            log.info("%s: the schema snapshot completed; the load waits for its CREATE TABLE of %s",
                     self.connector.name, ", ".join(awaited))
        return now - self.settled_at < SCHEMA_SNAPSHOT_TABLES_WAIT_SECONDS

    def _raise_unless_engine_alive(self, now: float, waiting_to: str, started: bool) -> None:
        """Raises the engine's failure, or a timeout when it has not `started` within the start timeout."""
        self.runner.raise_if_failed()
        if not started and self.runner.state != "STOPPED" and now - self.started > ENGINE_START_TIMEOUT_SECONDS:
            raise RunnerError(f"the Debezium engine did not {waiting_to} within {ENGINE_START_TIMEOUT_SECONDS:.0f} s "
                              f"(state {self.runner.state})", connector=self.connector.name)

    # The bulk load.

    def _bulk_load(self) -> bool:
        """Runs the load before any change of the stream; returns whether it finished (the stream may follow)."""
        return self.session.run_bulk_load(self.deadline)

    # The stream.

    def _stream(self) -> Iterator[list[FetchedBatch]]:
        session, runner, connector = self.session, self.runner, self.connector
        streaming_since: float | None = None
        polling_since: float | None = None
        source_lost_since: float | None = None
        streamed = False  # the engine was seen streaming (streaming_since: seen streaming with nothing to fetch)
        idle_mark: tuple[dict[str, Any] | None, float] | None = None  # the engine's read position, queue empty
        wal_mark: int | None = None  # PostgreSQL: where its WAL ended when the idle mark was taken
        session.streaming = True
        first = True
        halted = False  # the connector was paused: the run ends at the next cut between offsets
        while True:
            if session.stop_fetching:
                break
            halted = halted or session.halted()
            if halted and not self._last_change_open() and not self.open_transaction:
                log.info("%s: paused; the cycle ends after the batches it fetched", connector.name)
                break
            asked = time.monotonic()
            # The stream's first fetch after batches of this run (a schema snapshot, a load) does not wait long: a
            # source quiet since then ends the run at once (`_fetched_past`).
            # So does one after a load, while it waits for the record past its mark (`received_past`: a heartbeat
            # alone is no batch to wake the fetch).
            awaits_mark = self.loaded and (first or wal_mark is not None)
            batch = self._fetch(SETTLE_POLL_SECONDS if first and self.last_offset is not None or awaits_mark
                                else None)
            first = False
            now = time.monotonic()
            continues = batch is not None and self.last_fetched is not None \
                and _continues_statement(self.last_fetched, batch)
            open_change = batch is None and self._last_change_open()
            if (self.budget_spent or halted) and not continues and not open_change and not self.open_transaction:
                # The run's budget was spent at the last batch (or the connector was paused while a change that
                # may share its LSN with the next was fetched last). A batch fetched now is not applied (nor marked
                # complete): the engine gives it to the next run.
                if self.budget_spent:
                    session.cycle_stats.budget_spent = True
                else:
                    log.info("%s: paused; the cycle ends after the batches it fetched", connector.name)
                break
            if batch is not None:
                faults.pause_point(faults.FETCHED)
                full = self._add(batch, now)
                if full is not None:
                    yield full
                if not session.snapshot_ended and session.takes_data_snapshot:
                    session.snapshot_ended = _ends_snapshot(batch)
                if not streamed and session.streams:
                    # Also while batches keep coming (a backlog), so that a source lost right after it counts as lost.
                    streamed = runner.is_streaming()
                if connector.max_events_per_run is not None and self.events >= connector.max_events_per_run \
                        and not session.in_data_snapshot() and not self.budget_spent:
                    log.info("%s: reached max_events_per_run (%d)", connector.name, connector.max_events_per_run)
                    self.budget_spent = True
            elif self.open_transaction:
                # Nothing more yet of a source transaction open after the last batch: the group goes on up to
                # its last commit, and whole once it waited long enough or the engine waits for the bytes it holds
                # (it then spans groups); else the stream waits for the rest, never idle inside a transaction.
                cut = self._last_source_commit()
                if self.group and cut:
                    yield self._take_group(cut)
                    continue
                self._await_transaction_end(now)
                if self.group and (self.runner.waiting_for_room() or self._open_group_waited(now)):
                    yield self._take_group()
                    continue
            elif open_change and (self.budget_spent or halted or self._lsn_seen_shared()):
                self._await_past_open_change(now)
            elif self.group and (held := self._begun_tail()) > 0:
                # The group goes downstream, but a source transaction's BEGIN that came last, nothing of it yet,
                # waits for what it begins (a group of it alone would commit nothing but move the offset).
                yield self._take_group(held)
                continue
            elif not session.streams and runner.is_polling():
                # Snapshot modes without streaming: the cycle ends once the snapshot is done and nothing more comes.
                polling_since = polling_since or now
                snapshot = runner.snapshot_status()
                quiet = now - max(self.last_batch_at, polling_since) >= connector.idle_timeout_seconds
                if quiet and not snapshot.get("running") and (
                        snapshot.get("completed") or snapshot.get("aborted") or self.events
                        or now - polling_since >= 3 * connector.idle_timeout_seconds):
                    break
            elif runner.is_streaming():
                if source_lost_since is not None:
                    log.warning("%s: the log reader is connected to the source again after %.1f s", connector.name,
                                now - source_lost_since)
                    source_lost_since = None
                if streaming_since is None:
                    # Recorded once the queue is drained: a snapshot's batches may still be queued when streaming
                    # starts.
                    session.record_streaming()
                # Idle counts from when streaming connected, not from engine start: the log reader may connect late.
                # Where the end is a position the reader must reach (MariaDB/MySQL), from the start of the fetch that
                # found nothing (after a load: from its end); where it is time alone (PostgreSQL: the WAL of tables
                # not captured is decoded meanwhile, see limitations.md), from when streaming was seen.
                streaming_since = streaming_since or (asked if self.source.current_position is not None else now)
                # A run that applied something lingers: its quiet counts only once the linger's extra wait is over,
                # so the idle mark and the end come `linger_seconds` after the last change, not idle_timeout_seconds.
                quiet_for = now - max(self.last_batch_at, streaming_since) - self._linger_extra()
                if quiet_for < 0:
                    # Lingering after a change: marks taken before it no longer tell where the quiet began, and
                    # without a mark (and short of the idle timeout) nothing below ends the run.
                    idle_mark = wal_mark = None
                elif (idle_mark is None or idle_mark[1] < self.last_batch_at) \
                        and self._marks_idle(quiet_for, first=idle_mark is None):
                    # Where the source's log ends now. Once the engine's reader has read up to there and nothing came
                    # for the rest of the idle timeout, every change before it is applied (what the change sensor
                    # reads the source's log from).
                    idle_mark = (sources.source_position(connector), now)
                    if self.source.mark_wal_end is not None:
                        wal_mark = self.source.mark_wal_end(connector)
                if idle_mark is not None and idle_mark[0] is not None and self._fetched_past(idle_mark[0]) \
                        and self._engine_drained():
                    # A batch at or past the mark was fetched already (on a source quiet since the schema snapshot
                    # or the load: the snapshot's own position), so no change before it is still on its way.
                    session.checked_end = idle_mark[0]
                    break
                if self.loaded and wal_mark is not None and self._wal_mark_passed(wal_mark):
                    # After this run's load, as after a MariaDB one (`_fetched_past`): every change made before the
                    # mark, the load's included, is applied; a source quiet since ends the run without the idle wait.
                    break
                if quiet_for >= connector.idle_timeout_seconds:
                    end = idle_mark[0] if idle_mark is not None else None
                    if end is None:
                        # PostgreSQL: once Debezium handed over a record past the WAL written before the quiet began
                        # (the heartbeat row the mark wrote) and it all reached us: a transaction of tens of MB is
                        # decoded and converted for longer than the idle timeout, after its walsender sent it. Until
                        # then the run waits, within its budget.
                        if wal_mark is None or self._wal_mark_passed(wal_mark):
                            break
                    # A reader quiet yet still reading (a large transaction of tables it does not capture, which may
                    # hide a captured change behind it) goes on, within the run's budget; so does one whose mark is
                    # too fresh to say that nothing came after it.
                    elif now - idle_mark[1] >= connector.idle_timeout_seconds / 2 and self._reader_reached(end) \
                            and self._engine_drained():
                        # Recorded once the groups fetched before it are applied (`apply_batches`).
                        session.checked_end = end
                        break
            elif runner.state in ("STOPPED", "FAILED"):
                runner.raise_if_failed()
                break
            elif streaming_since is not None or streamed:
                # It streamed and is not connected now: the source went away (a restart, the network). Debezium's
                # log reader reconnects by itself; a run that waits too long fails instead of looking idle.
                if source_lost_since is None:
                    source_lost_since = now
                    log.warning("%s: the log reader lost its connection to the source; waiting up to %.0f s for "
                                "Debezium to reconnect", connector.name, connector.source_lost_timeout_seconds)
                elif now - source_lost_since >= connector.source_lost_timeout_seconds:
                    raise RunnerError(
                        f"lost the streaming connection to the source {connector.hostname}:{connector.port} and "
                        f"Debezium did not reconnect within {connector.source_lost_timeout_seconds:.0f} s "
                        f"(source_lost_timeout_seconds): check that the source runs and is reachable; the next run "
                        "resumes from the last batch marked complete",
                        connector=connector.name)
            elif not runner.is_polling() and now - self.started > ENGINE_START_TIMEOUT_SECONDS:
                raise RunnerError(f"the Debezium engine did not start polling within "
                                  f"{ENGINE_START_TIMEOUT_SECONDS:.0f} s (state {runner.state})",
                                  connector=connector.name)
            if now >= self.stream_deadline and not session.in_data_snapshot():
                # Debezium's own data snapshot cannot be resumed: it is finished whatever the budget (it keeps one
                # group in memory at a time, see apply_batches).
                if not self.budget_spent:
                    log.info("%s: reached max_seconds_per_run (%s)", connector.name, connector.max_seconds_per_run)
                self.budget_spent = True
        if self.group:
            yield self._take_group()

    def _last_change_open(self) -> bool:
        """Whether the last change fetched may share its offset with changes the engine has not handed over yet (a
        PostgreSQL insert, the source's `may_share_lsn_ahead`) unless every batch the engine handed over was fetched
        and a record after it was handed over (the runner's received offset): until then the run does not end,
        whatever its budget or a pause; the next batch fetched tells whether it goes on at that offset
        (`_continues_statement`)."""
        last = self.last_fetched
        if last is None or self.source.may_share_lsn_ahead is None:
            return False
        if not last.index or not self.source.may_share_lsn_ahead(last.index[-1], self.connector):
            return False
        received = self.runner.received_offset()  # read before the queues: a batch queued since is seen there
        return not (self._engine_drained() and sources.pg_record_follows(received, last.last_offset))

    def _lsn_seen_shared(self) -> bool:
        """Whether the last change fetched shares its offset with the change before it (in its batch, or in the
        batch it went on from): the rows of a multi-row WAL record, whose rest may still come. Only then does a
        group wait for a record past it before it is handed on within the run (a change alone at its LSN, a
        trickle's insert, goes on at once: the run's end still waits, `_last_change_open`)."""
        last = self.last_fetched
        return last is not None and (self.last_continued or len(last.index) >= 2 and same_stream_position(
            last.index[-2].get("offset"), last.index[-1].get("offset")))

    def _await_past_open_change(self, now: float) -> None:
        """The group waits for a record past its last change (`_last_change_open`): on a quiet source the heartbeat
        row, written once per such change, is one. Fails the run, nothing of the group applied, when the engine
        stops or none comes within `source_lost_timeout_seconds`: the next run fetches the group again."""
        self.runner.raise_if_failed()
        assert self.last_fetched is not None
        last = self.last_fetched.last_offset
        if self.open_change is None or self.open_change[0] != last:
            self.open_change = (last, now)
            assert self.source.mark_wal_end is not None  # a change that may share its LSN is PostgreSQL's
            self.source.mark_wal_end(self.connector)
            return
        waited = now - self.open_change[1]
        if self.runner.state == "STOPPED" or waited >= self.connector.source_lost_timeout_seconds:
            raise RunnerError(
                f"the engine handed over nothing past the change at {json.dumps(last)} for {waited:.0f} s (state "
                f"{self.runner.state}): the changes that share its LSN cannot be told complete, so the group it ends "
                "is not applied; the next run fetches it again", connector=self.connector.name, position=last)

    @property
    def open_transaction(self) -> bool:
        """Whether a source transaction with changes is open after the last batch fetched (its END not yet)."""
        return self.transaction_state == TRANSACTION_OPEN

    def _await_transaction_end(self, now: float) -> None:
        """The stream waits for the rest of the source transaction open after its last batch. Fails the run, the
        transaction's groups rolled back, when the engine stops or hands over nothing more of it for
        `source_lost_timeout_seconds` while it has nothing on its way (the wait does not count while the engine's
        thread hands a batch over or waits for room): the next run fetches the transaction again from its start."""
        self.runner.raise_if_failed()
        if self.transaction_wait is None or not self._engine_drained():
            self.transaction_wait = now
            return
        waited = now - self.transaction_wait
        if self.runner.state == "STOPPED" or waited >= self.connector.source_lost_timeout_seconds:
            raise RunnerError(
                "the engine handed over nothing more of the source transaction open after "
                f"{json.dumps(self.last_offset)} for {waited:.0f} s (state {self.runner.state}), and no END of "
                "it: what of it was applied is rolled back; the next run applies it again from its start",
                connector=self.connector.name, position=self.last_offset)

    def _open_group_waited(self, now: float) -> bool:
        """Whether the stream waited OPEN_TRANSACTION_GROUP_WAIT_SECONDS for more of the transaction its open group
        ends inside, the engine drained all the while (`_await_transaction_end`'s wait: the time the stream was
        suspended while a group applied does not count, nor the time the engine spent handing a batch over)."""
        if self.transaction_wait is None or now - self.transaction_wait < OPEN_TRANSACTION_GROUP_WAIT_SECONDS:
            return False
        log.info("%s: nothing more of the source transaction open after %s for %.0f s: its %d events fetched so far "
                 "go on as a part of a destination transaction that spans groups", self.connector.name,
                 json.dumps(self.last_offset), now - self.transaction_wait, self.group_events)
        return True

    def _linger_extra(self) -> float:
        """How much longer than `idle_timeout_seconds` a quiet stream waits before it ends: `linger_seconds` (the
        session's: Dagster runs take the connector's, `cdc-pipeline sync` none unless --linger) once the run fetched
        a batch or loaded a table, so a run goes on while changes keep coming, the JVM's start paid once; none for a
        run that found nothing (a check's false alarm), which ends as soon as it finds the source idle; none once a
        request served meanwhile awaits the next run (`ConnectorSession.next_run_awaited`) or while other work waits
        for the machine (`ConnectorSession.linger_yields`). A standing run (`ConnectorSession.stands`) waits until
        its budget ends, found it something or not, while it stands and nothing of the above ends it."""
        linger = max(0.0, self.session.linger_seconds - self.connector.idle_timeout_seconds) \
            if self.events or self.loaded else 0.0
        stands = self.session.stands()
        if not (linger or stands) or self.session.next_run_awaited() or self.session.linger_yields():
            return 0.0
        return float("inf") if stands else linger  # a standing run's budget (max_seconds_per_run) ends it

    # Shared by the phases.

    @cached_property
    def source(self) -> Source:
        """The connector's source package, which the stream's end asks (its log position, its WAL mark)."""
        return sources.module_for(self.connector.type)

    def _marks_idle(self, quiet_for: float, first: bool) -> bool:
        """Whether the stream, quiet for `quiet_for`, takes its idle mark now (`first`: its first of the run): once
        quiet for half the idle timeout, or at once after batches of this run (a binlog position a batch fetched may
        be at already, `_fetched_past`). A PostgreSQL mark writes the heartbeat row, which the runner hands over as a
        batch while batches of the run are in flight: it waits for their groups to be applied (for the idle timeout
        at most), so that the row is committed by the runner, not applied as a group of its own that brings the next
        mark; a run that loaded takes its first mark at once, as a MariaDB one does after batches of the run."""
        idle = self.connector.idle_timeout_seconds
        if self.source.mark_wal_end is None:
            return quiet_for >= idle / 2 or self.last_offset is not None
        return quiet_for >= idle or ((quiet_for >= idle / 2 or first and self.loaded)
                                     and self.runner.in_flight_batches() == 0)

    def _wal_mark_passed(self, wal_mark: int) -> bool:
        """Whether Debezium handed over a record at or past a PostgreSQL mark (the source's `mark_wal_end`) and
        nothing the engine read is still on its way to us: every change committed before the mark was fetched."""
        assert self.source.received_past is not None  # only a source that marks its WAL's end has a mark
        return self._engine_drained() and self.source.received_past(self.runner.received_offset(), wal_mark)

    def _fetched_past(self, end: dict[str, Any]) -> bool:
        """Whether the last batch fetched in this run is at or past the source position `end` (a binlog position;
        its own snapshot's position counts): every change written before `end` was then fetched, in order."""
        return sources.position_reached(self.last_offset, end)

    def _engine_drained(self) -> bool:
        """Whether nothing the engine read is on its way to us: Debezium's queue and ours empty, no batch being
        handed over (a batch of multi-MB values spends seconds there, or waits for room while groups apply), and no
        record between the two, which the engine holds while it converts it (`DebeziumRunner.drained`)."""
        return self.runner.drained()

    def _reader_reached(self, end: dict[str, Any]) -> bool:
        """Whether the engine's log reader has read the source's log up to `end` (a reader whose position cannot be
        read counts as there)."""
        reader = self.runner.read_position()
        if reader is None or "file" not in end:
            return True
        return sources.stream_passed(reader, end)

    def _fetch(self, wait_seconds: float | None = None) -> FetchedBatch | None:
        if self.carried is not None:
            batch, self.carried = self.carried, None
            return batch
        after = f" after source position {json.dumps(self.last_offset)}" if self.last_offset else ""
        with self.session.phase(control.PHASE_FETCHING, "fetch"), \
                working_on(f"the Debezium engine captured the changes{after}"):
            return self.runner.fetch(wait_seconds if wait_seconds is not None
                                     else GROUP_WAIT_SECONDS if self.group else FETCH_WAIT_SECONDS)

    def _add(self, batch: FetchedBatch, now: float) -> list[FetchedBatch] | None:
        """Adds a fetched batch to the open group; returns the group it closed, when the batch did not fit in it
        (the records of one statement are never split)."""
        stats = self.session.cycle_stats
        stats.first_fetch_at = stats.first_fetch_at or now
        closed = None
        # The open group's last batch, when there is one, is the last batch fetched.
        follows = self.last_fetched is not None and _continues_statement(self.last_fetched, batch)
        continues = bool(self.group) and follows
        # A group of no change (a BEGIN alone, the END of a DDL's transaction, heartbeats) takes the next batch
        # whatever its bounds: a group of it alone would commit nothing but move the offset.
        no_change = bool(self.group) and all(entry.get("kind") in (TRANSACTION, OTHER)
                                             for member in self.group for entry in member.index)
        self.transaction_state = transaction_state_after(batch.index, self.transaction_state)
        batch.transaction_open = self.open_transaction
        if not self._heartbeats_only(batch):
            self.transaction_wait = None
        if self.group and not continues and not no_change \
                and self._over_bounds(self.group_events, self.group_bytes, batch):
            cut = self._last_source_commit()
            # A run's first group, short by design, goes on to its first commit within a group's bounds.
            first_awaits_commit = self.groups == 0 and not cut and not self._over_bounds(
                self.group_events, self.group_bytes, batch, first=False)
            if not first_awaits_commit:
                # Closed at its last source commit, the batches after it going on with this one, unless those would
                # not fit either (or it has none: all inside one transaction): then whole, a part of a spanning
                # transaction.
                rest = self.group[cut:]
                whole = not 0 < cut < len(self.group) or self._over_bounds(
                    sum(member.size for member in rest), sum(member.bytes for member in rest), batch)
                closed = self._take_group(None if whole else cut)
        self.group.append(batch)
        self.group_events += batch.size
        self.group_bytes += batch.bytes
        # A transaction's BEGIN and END records are no events of the run's budget (nor of what it says it fetched).
        events = batch.size - sum(1 for entry in batch.index if entry.get("kind") == TRANSACTION)
        if self.first_change_at is None and self._holds_change(batch):
            self.first_change_at = now
        self.events += events
        self.last_batch_at = now
        self.last_offset = batch.last_offset
        self.last_continued, self.last_fetched = follows, batch
        return closed

    def _holds_change(self, batch: FetchedBatch) -> bool:
        """Whether the batch holds a row change of one of the connector's tables: what starts a standing run's budget
        (`stream_deadline`), not its heartbeats nor the schema changes of other tables, which a busy server or
        PostgreSQL's heartbeat bring all the time."""
        return any(entry.get("kind") in (DATA_CHANGE, TRUNCATE) and entry.get("table")
                   and not self.source.is_heartbeat_table(self.connector, entry["table"])
                   and sources.captures(self.connector, entry["table"]) for entry in batch.index)

    def _heartbeats_only(self, batch: FetchedBatch) -> bool:
        """Whether the batch holds only heartbeats (Debezium's records with neither op nor table, and PostgreSQL's
        heartbeat table's writes with their BEGIN and END): no sign that an open transaction goes on."""
        beats = [entry for entry in batch.index if entry.get("kind") != TRANSACTION]
        return bool(beats) and all(entry.get("kind") == OTHER
                                   or self.source.is_heartbeat_table(self.connector, entry.get("table"))
                                   for entry in beats)

    def _over_bounds(self, events: int, size: int, batch: FetchedBatch, first: bool = True) -> bool:
        """Whether a group of `events` and `size` bytes would pass its bounds with `batch` (a run's first group holds
        `batch_size` events, unless not `first`: see the class)."""
        limit = self.connector.apply_batch_events if self.groups or not first else min(
            self.connector.batch_size, self.connector.apply_batch_events)
        return events + batch.size > limit or size + batch.bytes > self.connector.apply_batch_mb << 20

    def _begun_tail(self) -> int:
        """How many of the open group's batches go downstream when the engine has nothing more ready: all of them,
        but the batch that starts with a BEGIN the stream stands just after (`TRANSACTION_BEGUN`: Debezium handed
        the BEGIN over before the first change of its transaction) when the batches before it end at a source
        commit. Its changes follow at once; handed on alone, it would make a group of no change (a run's first
        group, short by design, among them)."""
        if self.transaction_state != TRANSACTION_BEGUN:
            return len(self.group)
        for at in range(len(self.group) - 1, -1, -1):
            entries = self.group[at].index
            begins = [n for n, entry in enumerate(entries) if _is_begin(entry)]
            if not begins:
                if all(entry.get("kind") == OTHER for entry in entries):
                    continue  # heartbeats after the BEGIN
                return len(self.group)
            before = entries[:begins[-1]]
            at_commit = at == 0 or not self.group[at - 1].transaction_open and not _continues_statement(
                self.group[at - 1], self.group[at])
            return at if at_commit and all(entry.get("kind") == OTHER for entry in before) else len(self.group)
        return len(self.group)

    def _last_source_commit(self) -> int:
        """How many of the open group's batches end at a source commit or outside any transaction: the index after
        the last batch after which no source transaction is open and whose statement the next does not go on; 0
        when there is none."""
        for cut in range(len(self.group), 0, -1):
            if not self.group[cut - 1].transaction_open and not _ends_begun(self.group[cut - 1]) and (
                    cut == len(self.group) or not _continues_statement(self.group[cut - 1], self.group[cut])):
                return cut
        return 0

    def _take_group(self, cut: int | None = None) -> list[FetchedBatch]:
        """Hands on the open group, or its first `cut` batches (up to its last source commit), the rest staying."""
        cut = len(self.group) if cut is None else cut
        group, self.group = self.group[:cut], self.group[cut:]
        # The stream is suspended while the group is applied: a wait for the rest of an open transaction starts
        # again once it goes on.
        self.transaction_wait = None
        self.group_events = sum(batch.size for batch in self.group)
        self.group_bytes = sum(batch.bytes for batch in self.group)
        self.groups += 1
        return group


def _continues_statement(last: FetchedBatch, batch: FetchedBatch) -> bool:
    """Whether `batch` starts with a record of the statement whose record ended `last` (they share one offset):
    such batches are applied together and never split between groups or runs (`events.same_stream_position`)."""
    return bool(batch.index) and same_stream_position(last.last_offset, batch.index[0].get("offset"))


def _ends_begun(batch: FetchedBatch) -> bool:
    """Whether the last record of the batch, heartbeats aside, is a source transaction's BEGIN: a cut after it is
    not at a source commit (its changes come in the next batch)."""
    last = next((entry for entry in reversed(batch.index) if entry.get("kind") != OTHER), None)
    return last is not None and _is_begin(last)


def _is_begin(entry: dict[str, Any]) -> bool:
    """Whether an index entry is a source transaction's BEGIN record."""
    return entry.get("kind") == TRANSACTION and entry.get("status") == BEGIN


def _ends_snapshot(batch: FetchedBatch) -> bool:
    """Whether the batch holds the last event of the engine's snapshot (Debezium marks it `snapshot: last`)."""
    return any(str((entry.get("source") or {}).get("snapshot")).lower() == LAST_SNAPSHOT_MARKER
               for entry in batch.index)
