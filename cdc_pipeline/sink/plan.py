"""Planning a parsed batch into ordered steps: a DDL step per schema change, and per table a DML segment for each run
of its data changes between two of its DDL events (and of one value schema); a truncate step in its place; the
snapshot's bookkeeping steps (a snapshot started again, a table's rows to replace, the snapshot's end). Events the
destination already holds (re-deliveries, rows the bulk snapshot copied) are counted and skipped here. The applier
(`apply.py`) then runs the plan in one transaction.
"""

from __future__ import annotations

import logging
import re
from decimal import Decimal
from collections import Counter
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_pipeline import control
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.convert.ddl import DROP_DATABASE, DdlChange, changes_from_schema_event, database_drop, dropped_database
from cdc_pipeline.decode.events import (
    DATA_CHANGE,
    OTHER,
    TRANSACTION,
    SCHEMA_CHANGE,
    TRUNCATE,
    EventRef,
    FieldSpec,
    ParsedBatch,
    StreamRedeliveries,
    fail_on_malformed,
)
from cdc_pipeline.mapping import objmap
from cdc_pipeline.sources import before_snapshot, captures, module_for, stream_passed

log = logging.getLogger(__name__)


@dataclass
class DdlStep:
    """The table changes of one schema-change event."""

    ref: EventRef
    changes: list[DdlChange]


@dataclass
class DmlStep:
    """A run of one table's data changes between two of its DDL events, all with one value schema."""

    source_table: str
    schema_id: str
    first_seq: int
    last_seq: int
    ops: Counter = field(default_factory=Counter)
    last_ref: EventRef | None = None
    fields: list[FieldSpec] = field(default_factory=list)
    frame: DataFrame | None = None
    # The batch's rows, and whether the step holds them all: its `frame` is made from them on first use
    # (`with_frame`), since a group staged whole (`sink/group_stage.py`) never needs one per step.
    rows_of_batch: tuple[DataFrame, bool] | None = None


@dataclass
class TruncateStep:
    """A TRUNCATE of one table, between its changes before and after."""

    ref: EventRef
    source_table: str


# `source.snapshot` of the events of a blocking snapshot; streaming events carry "false", incremental ones
# "incremental".
SNAPSHOT_MARKERS = frozenset({"true", "first", "first_in_data_collection", "last_in_data_collection", "last"})
LAST_SNAPSHOT_MARKER = "last"
# The runner numbers events from 1 at each engine start, and a snapshot is the first thing an engine does.
ENGINE_FIRST_SEQ = 1
SNAPSHOT_RESTART = "restart"
SNAPSHOT_TABLE = "table"
SNAPSHOT_END = "end"


@dataclass
class SnapshotStep:
    """Bookkeeping of a snapshot, so that a snapshot taken again leaves every table exact and counts every event once.

    Debezium cannot resume an interrupted MariaDB/MySQL snapshot: the next engine start takes it again from its
    first event. `restart`: the batch begins a snapshot, so what was applied of an earlier one is superseded (its
    counts become re-deliveries). `table`: the batch's snapshot events of one table (`counts`; '' for events naming
    no table); placed before the table's first snapshot rows, which replace its destination rows. `end`: after the
    snapshot's last row; tables it read no rows of lose the rows an earlier snapshot left.
    """

    kind: str
    ref: EventRef
    source_table: str = ""
    counts: control.BatchCounts = field(default_factory=control.BatchCounts)


@dataclass
class BatchPlan:
    """A batch as ordered steps, with its counts and the position of its last event."""

    parsed: ParsedBatch
    steps: list[DdlStep | DmlStep | TruncateStep | SnapshotStep]
    counts: control.BatchCounts
    last_ref: EventRef | None
    # Tables whose bulk-snapshot position this batch's events pass: the batch's transaction retires them.
    retired_positions: list[str] = field(default_factory=list)
    redelivered_seqs: set[int] = field(default_factory=set)  # the events counted as re-delivered, not applied

    @property
    def batch_id(self) -> int:
        return self.parsed.batch_id


def plan_batch(parsed: ParsedBatch, connector: ConnectorConfig, applied_offset: dict | None = None,
               object_map: objmap.ObjectMap | None = None,
               snapshot_positions: dict[str, dict] | None = None, resumed_from: dict | None = None,
               redelivered: StreamRedeliveries | None = None) -> BatchPlan:
    """Splits the batch into DDL steps and per-table DML segments, in source order (converts the DDL, in the names
    and types of `object_map`'s rules).

    Events at or before `applied_offset` (the last event a committed batch applied) are re-deliveries after
    a crash between commit and offset flush: they are counted as such and not applied again. Snapshot events
    have no such order; they are tracked per table instead (`SnapshotStep`). A table the bulk snapshot read under
    one consistent snapshot (`snapshot_positions`, a table without a key) already holds the changes committed
    before that snapshot: those are counted as re-delivered too, until an event of the stream passes the
    snapshot's position (`retired_positions`): from there on the stream holds only later changes, and a position
    kept longer would be compared with positions it has no order with (a binlog started over, a PostgreSQL
    transaction id counter that wrapped). `resumed_from` (the engine's stored offset when the run started) tells a
    re-delivery from an event of a reset or replaced binlog (`events.redelivery_test`). A run passes instead its
    `StreamRedeliveries` (`redelivered`, made from those two offsets and kept across its batches), which also
    counts the events the run was given before as re-deliveries; `applied_offset` and `resumed_from` are then unused.
    """
    steps: list[DdlStep | DmlStep | TruncateStep | SnapshotStep] = []
    open_segments: dict[str, DmlStep] = {}
    counts = control.BatchCounts()
    if redelivered is None:
        redelivered = StreamRedeliveries(applied_offset, resumed_from, connector=connector.name)
    snapshot_steps: dict[str, SnapshotStep] = {}
    redelivered_seqs: set[int] = set()
    placed_snapshot_steps: set[str] = set()
    snapshot_reads: dict[str, bool] = {}  # per table: whether its reads ("r") in this batch are a blocking snapshot's
    snapshot_end_seq = _snapshot_end_seq(parsed.refs)
    unpassed_positions = dict(snapshot_positions or {})
    retired_positions: list[str] = []
    if parsed.refs and parsed.refs[0].seq == ENGINE_FIRST_SEQ and snapshot_marker(parsed.refs[0]):
        steps.append(SnapshotStep(SNAPSHOT_RESTART, parsed.refs[0]))

    ignored_tables: list[str] = []  # tables of schema changes outside the connector's, logged once per batch

    def close_segment(source_table: str) -> None:
        segment = open_segments.pop(source_table, None)
        if segment is not None:
            steps.append(segment)

    for ref in parsed.refs:
        if is_heartbeat(connector, ref) or ref.kind == TRANSACTION:
            # A transaction's BEGIN and END records only say where its changes start and end (`fetch_phases`).
            continue
        change = (ref.op, ref.source_table) if ref.kind == DATA_CHANGE else None
        if redelivered(ref.offset, change) or _read_by_bulk_snapshot(ref, snapshot_positions):
            counts.redelivered += 1
            redelivered_seqs.add(ref.seq)
            if ref.source_table:
                # A step takes its rows by seq range: the table's next changes begin a segment after this one.
                close_segment(ref.source_table)
            continue
        for table, position in list(unpassed_positions.items()):
            if stream_passed(ref.offset, position):
                retired_positions.append(table)
                del unpassed_positions[table]
        source_ms = ref.source_ts_ms
        if source_ms is not None:
            if counts.first_source_ms is None:
                counts.first_source_ms = source_ms
            counts.last_source_ms = source_ms
        if ref.debezium_ts_ms is not None:
            if counts.first_debezium_ms is None:
                counts.first_debezium_ms = ref.debezium_ts_ms
            counts.last_debezium_ms = ref.debezium_ts_ms
        snapshot_table: str | None = None
        if ref.kind == SCHEMA_CHANGE:
            payload = ref.schema_change or {}
            changes = changes_from_schema_event(
                payload, connector=connector.name, connector_type=connector.type,
                letter_casing=connector.letter_casing, destination_schema=connector.destination_schema)
            ignored_tables.extend(change.source_table for change in changes
                                  if not captures(connector, change.source_table))
            changes = [change for change in changes if captures(connector, change.source_table)]
            if object_map:
                changes = [object_map.map_change(change) for change in changes]
            dropped = dropped_database(payload, connector.type)
            if dropped is not None and connector.captures_database(dropped):
                changes.append(database_drop(dropped, str(payload.get("ddl"))))
                for source_table in [table for table in open_segments
                                     if connector.split_table(table)[0] == dropped]:
                    close_segment(source_table)
            for change in changes:
                close_segment(change.source_table)
            if changes:
                counter = "ddls"
                steps.append(DdlStep(ref, changes))
            else:
                counter = "other_events"
            if snapshot_marker(ref):
                snapshot_table = _schema_change_table(ref, connector)
        elif ref.kind == TRUNCATE and ref.source_table and captures(connector, ref.source_table):
            close_segment(ref.source_table)
            counter = "truncates"
            steps.append(TruncateStep(ref, ref.source_table))
        elif ref.kind == DATA_CHANGE and ref.source_table and captures(connector, ref.source_table):
            if ref.op == "r":
                if ref.source_table not in snapshot_reads:
                    snapshot_reads[ref.source_table] = snapshot_marker(ref) is not None
                if snapshot_reads[ref.source_table]:
                    snapshot_table = ref.source_table
                    if snapshot_table not in placed_snapshot_steps:
                        # The table's rows are replaced from here on: nothing of it may stay open before this step.
                        close_segment(snapshot_table)
                        steps.append(snapshot_steps.setdefault(
                            snapshot_table, SnapshotStep(SNAPSHOT_TABLE, ref, snapshot_table)))
                        placed_snapshot_steps.add(snapshot_table)
            segment = open_segments.get(ref.source_table)
            if segment is not None and segment.schema_id != ref.schema_id:
                close_segment(ref.source_table)
                segment = None
            if segment is None:
                segment = DmlStep(ref.source_table, ref.schema_id or "", ref.seq, ref.seq)
                open_segments[ref.source_table] = segment
            segment.last_seq = ref.seq
            segment.last_ref = ref
            segment.ops[ref.op] += 1
            counter = DML_COUNTERS[ref.op]
        else:
            counter = "other_events"
        counts.events += 1
        setattr(counts, counter, getattr(counts, counter) + 1)
        if snapshot_table is not None:
            step = snapshot_steps.setdefault(snapshot_table, SnapshotStep(SNAPSHOT_TABLE, ref, snapshot_table))
            step.counts.events += 1
            setattr(step.counts, counter, getattr(step.counts, counter) + 1)
        if ref.seq == snapshot_end_seq:
            steps.append(SnapshotStep(SNAPSHOT_END, ref))
    steps.extend(open_segments.values())
    # Snapshot events without rows in this batch only add to the counts: their place does not matter.
    steps.extend(step for table, step in snapshot_steps.items() if table not in placed_snapshot_steps)
    if counts.redelivered:
        log.info("%s: skipped %d re-delivered events already applied", connector.name, counts.redelivered)
    if ignored_tables:
        _log_ignored_schema_changes(connector.name, ignored_tables)
    last_ref = next((ref for ref in reversed(parsed.refs) if ref.kind != TRANSACTION), None)
    return BatchPlan(parsed, steps, counts, last_ref, retired_positions, redelivered_seqs)


IGNORED_TABLES_NAMED = 5  # the tables a batch's line about ignored schema changes names, of how many


def _log_ignored_schema_changes(connector: str, tables: list[str]) -> None:
    """One line per batch for the schema changes of tables outside the connector's (a server's other databases: their
    DDL is in the schema history every engine reads), naming the first few: a line each would be thousands of log
    records in a run on a server of many databases."""
    distinct = list(dict.fromkeys(tables))
    named = ", ".join(distinct[:IGNORED_TABLES_NAMED])
    more = f" and {len(distinct) - IGNORED_TABLES_NAMED} more" if len(distinct) > IGNORED_TABLES_NAMED else ""
    log.info("%s: ignored %d schema change(s) of %d table(s) outside the connector's tables: %s%s", connector,
             len(tables), len(distinct), named, more)


DML_COUNTERS = {"r": "snapshot_rows", "c": "inserts", "u": "updates", "d": "deletes"}
# What `table_counts` counts per table.
TABLE_COUNTERS = control.TABLE_STAT_COUNTERS


def table_counts(plan: "BatchPlan") -> dict[str, Counter]:
    """The plan's changes per source table: row changes by kind, truncates and schema changes (a database's drop
    names no table of its own)."""
    by_table: dict[str, Counter] = {}
    for step in plan.steps:
        if isinstance(step, DmlStep):
            counter = by_table.setdefault(step.source_table, Counter())
            for op, count in step.ops.items():
                counter[DML_COUNTERS[op]] += count
        elif isinstance(step, TruncateStep):
            by_table.setdefault(step.source_table, Counter())["truncates"] += 1
        elif isinstance(step, DdlStep):
            for change in step.changes:
                if change.kind != DROP_DATABASE:
                    by_table.setdefault(change.source_table, Counter())["ddls"] += 1
    return by_table


def _read_by_bulk_snapshot(ref: EventRef, positions: dict[str, dict] | None) -> bool:
    """Whether a row change or truncate of a table the bulk snapshot read under one consistent snapshot was
    committed before that snapshot (its rows already hold it)."""
    if not positions or ref.kind not in (DATA_CHANGE, TRUNCATE) or ref.source_table not in positions:
        return False
    return before_snapshot(ref.offset, positions[ref.source_table])


def snapshot_marker(ref: EventRef) -> str | None:
    """The event's `source.snapshot` marker when it belongs to a blocking snapshot, else None."""
    marker = str(ref.source.get("snapshot") or "").lower()
    return marker if marker in SNAPSHOT_MARKERS else None


def _snapshot_end_seq(refs: list[EventRef]) -> int | None:
    """The seq of the snapshot's last row when this batch holds it (Debezium marks only that row "last")."""
    for ref in reversed(refs):
        if ref.kind == DATA_CHANGE and ref.op == "r":
            return ref.seq if snapshot_marker(ref) == LAST_SNAPSHOT_MARKER else None
    return None


def _schema_change_table(ref: EventRef, connector: ConnectorConfig) -> str:
    """The connector's table a snapshot schema event is about, named as its data events name it (`db.table`;
    `schema.table` for sources whose source block has a schema: SQL Server, Oracle), or '' when it names none of
    them."""
    container = ref.source.get("schema") if "schema" in ref.source else ref.source.get("db")
    table = ref.source.get("table")
    if not container or not table or table == "null" or "," in table:
        return ""
    source_table = f"{container}.{table}"
    return source_table if captures(connector, source_table) else ""


def is_heartbeat(connector: ConnectorConfig, ref: EventRef) -> bool:
    """Whether an event is the connector's heartbeat, not the source's: Debezium's heartbeat message of any connector
    (`HeartbeatImpl`: a struct value, {ts_ms}, with no source block and no op; a tombstone has no value), or a
    write of the connector's heartbeat table (a PostgreSQL source's, `is_heartbeat_table`). Neither is applied nor counted."""
    if ref.kind == DATA_CHANGE:
        return module_for(connector.type).is_heartbeat_table(connector, ref.source_table)
    return (ref.kind == OTHER and ref.schema_id is not None and ref.op is None and ref.source_table is None
            and not ref.raw_source)


SNAPSHOT_INCLUDE_LIST = "snapshot.include.collection.list"


def snapshot_reads(connector: ConnectorConfig, source_table: str) -> bool:
    """Whether Debezium's snapshot reads the table: every captured table, unless the connector's
    `snapshot.include.collection.list` (regular expressions matched against the whole `db.table`, case aside, as
    Debezium matches them) narrows it. A table the snapshot does not read keeps its rows."""
    patterns = [part.strip() for part in connector.debezium.get(SNAPSHOT_INCLUDE_LIST, "").split(",") if part.strip()]
    return not patterns or any(re.fullmatch(pattern, source_table, re.IGNORECASE) for pattern in patterns)


def attach_dml_frames(plan: BatchPlan) -> None:
    """Gives each DML segment its columns from the batch's value schema, and its rows (lazily, in Spark: see
    `with_frame`).

    The events DataFrame holds the batch's data changes only. When one segment has them all (one table, one
    schema: the usual batch) it is the segment's frame as is. Otherwise the parsed rows are cached and each
    segment takes those of its schema id (a value schema belongs to one table) within its seq range, and the
    malformed lines in that range (they have no schema id; see `parse_events`): they fail the segment naming their
    seq, so they are never lost.
    """
    segments = [step for step in plan.steps if isinstance(step, DmlStep)]
    data_changes = sum(1 for ref in plan.parsed.refs if ref.kind == DATA_CHANGE)
    whole = len(segments) == 1 and sum(segments[0].ops.values()) == data_changes
    if segments and not whole:
        plan.parsed.cache()
    events = plan.parsed.events
    for step in segments:
        assert events is not None, "a batch with data changes has their frame"
        step.fields = plan.parsed.fields(step.schema_id)
        step.frame = None
        step.rows_of_batch = (events, whole)


def with_frame(step: DmlStep) -> DmlStep:
    """The step, with its rows (`frame`) made from the batch's on first use."""
    if step.frame is None and step.rows_of_batch is not None:
        events, whole = step.rows_of_batch
        step.frame = fail_on_malformed(events if whole else events.where(
            seq_between(step.first_seq, step.last_seq)
            & ((F.col("schema_id") == step.schema_id) | F.col("schema_id").isNull())))
    return step


def seq_between(first: int, last: int) -> Column:
    """Whether a row's seq lies in [first, last], with the bounds as decimals: Spark writes a long literal into the
    code it generates, so every group's segments would be compiled anew, and keeps a decimal one as a reference,
    so a table's segments share one compiled filter across groups."""
    return F.col("seq").cast(_SEQ_DECIMAL).between(F.lit(Decimal(first)).cast(_SEQ_DECIMAL),
                                                   F.lit(Decimal(last)).cast(_SEQ_DECIMAL))


_SEQ_DECIMAL = "decimal(20,0)"
