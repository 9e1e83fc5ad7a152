"""A batch of Debezium change events: its index on the driver, and its row images in Spark.

The runner writes, for each event, an index entry with what planning needs (kind, table, op, source block,
offset, and a schema change's payload), so the driver never collects events from Spark, and for each data change
a Spark row with its row images only: seq, schema id, op, before, after (`row_events`; the whole JSON line, with
key, source block and offset, is made only for a dead letter: `ParsedBatch.data_line`). Row images are string
maps, so one row type serves every table and every version of its schema; a JSON line (a replayed dead letter's)
is parsed into the same (`parse_events`, `ROW_IMAGES`). The per-column types come from the batch's value schemas
(see `FieldSpec`).

The batch's records in the stream: which share one offset (`same_stream_position`) and which a run was given before
(`redelivery_test`, `StreamRedeliveries`), by each source's order of its offsets, which its package's `positions`
room holds (a binlog's `offset_order`, PostgreSQL's `pg_stream_offset`, SQL Server's and Oracle's `stream_order`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_pipeline.capture.runner import FetchedBatch
from cdc_pipeline.decode.offsets import public_offset
from cdc_pipeline import sources
from cdc_pipeline.sources import (binlog_base, binlog_redelivery_test, offset_order, pg_before, pg_redelivery_test,
                                  pg_stream_offset)
from cdc_pipeline.sources.protocol import Source

log = logging.getLogger(__name__)

_STRING_MAP = T.MapType(T.StringType(), T.StringType())

ROW_IMAGES = T.StructType([
    T.StructField("seq", T.LongType()),
    T.StructField("schema", T.StringType()),
    T.StructField("value", T.StructType([
        T.StructField("op", T.StringType()),
        T.StructField("before", _STRING_MAP),
        T.StructField("after", _STRING_MAP),
    ])),
])

DML_OPS = ("c", "r", "u", "d")
STREAMED_OPS = ("c", "u", "d")  # a streamed row change (a read "r" is a snapshot's)
TRUNCATE_OP = "t"
SCHEMA_CHANGE = "schema_change"
DATA_CHANGE = "data_change"
TRUNCATE = "truncate"
OTHER = "other"
TRANSACTION = "transaction"  # a source transaction's BEGIN or END record (Debezium's transaction metadata)
BEGIN, END = "BEGIN", "END"

_POSITION_KEYS = ("file", "pos", "row", "gtid", "lsn", "txId", "change_lsn", "commit_lsn", "event_serial_no", "scn",
                  "commit_scn", "snapshot")


@dataclass(frozen=True)
class FieldSpec:
    """One column of a row image as Debezium describes it: Connect type, logical name, parameters."""

    name: str
    type: str
    logical: str | None
    parameters: dict[str, str]
    optional: bool


@dataclass(frozen=True)
class EventRef:
    """What the planner needs of one event: order, kind, table, schema and op, its source block and offset,
    and the payload of a schema change."""

    seq: int
    kind: str
    source_table: str | None
    schema_id: str | None
    op: str | None
    raw_source: dict[str, Any]
    schema_change: dict[str, Any] | None = None
    offset: dict[str, Any] | None = None
    debezium_ts_ms: int | None = None  # when Debezium processed the change (data changes and truncates)
    # A transaction's BEGIN or END record: its status and the transaction's id (Debezium's).
    transaction: tuple[str, str] | None = None

    @cached_property
    def source(self) -> dict[str, str]:
        """The source block with every value as text (JSON text for numbers and booleans)."""
        return {key: value if isinstance(value, str) else json.dumps(value) for key, value in self.raw_source.items()}

    @property
    def source_ts_ms(self) -> int | None:
        """When the change happened in the source (not when Debezium processed it)."""
        ts_ms = self.raw_source.get("ts_ms")
        return None if ts_ms is None else int(ts_ms)

    @property
    def position(self) -> dict[str, Any]:
        """The event's source position (binlog file/pos/row, LSN, ...), for messages and the applied record."""
        return {key: self.source[key] for key in _POSITION_KEYS if self.source.get(key) not in (None, "null")}


def event_ref(entry: dict[str, Any]) -> EventRef:
    """The EventRef of one index entry of the runner (see `EventSerializer.indexEntry` in the runner)."""
    ref = EventRef(
        seq=entry["seq"], kind=entry["kind"], source_table=entry.get("table"), schema_id=entry.get("schema"),
        op=entry.get("op"), raw_source=entry.get("source") or {}, offset=entry.get("offset"),
        # A copy: the source block added below must not change the entry, which a batch is planned from again.
        schema_change=None if entry.get("change") is None else dict(entry["change"]),
        debezium_ts_ms=entry.get("ts_ms"),
        transaction=(entry.get("status"), entry.get("id")) if entry["kind"] == TRANSACTION else None,
    )
    if ref.schema_change is not None:
        ref.schema_change["source"] = ref.source
    return ref


@dataclass
class ParsedBatch:
    """A batch ready to plan: the index of its events on the driver, and its row images as a lazy DataFrame."""

    batch: FetchedBatch
    events: DataFrame | None  # None: a batch without data changes (schema changes, heartbeats), Spark not involved
    refs: list[EventRef] = field(default_factory=list)
    cached: bool = False
    lines: DataFrame | None = None  # (seq, line): the JSON lines parsed (none for the runner's rows: `row_lines`)

    def data_line(self, seq: int) -> str:
        """The whole JSON line of one data change, as the runner writes it (for dead letters only): from the
        runner when it keeps its records, else (a replayed dead letter, a test's, a runner batch that keeps none)
        the line with the row images alone that Spark parsed, or the runner's row written as one (`row_lines`)."""
        line = self.batch.line(seq)
        if line is not None:
            return line
        if self.events is None:
            raise ValueError("the batch keeps no lines")
        lines = self.lines if self.lines is not None else row_lines(self.events)
        rows = lines.where(F.col("seq") == seq).limit(1).collect()
        if not rows:
            raise ValueError(f"event {seq} is not among the batch's data changes")
        return rows[0].line

    @property
    def batch_id(self) -> int:
        return self.batch.batch_id

    def fields(self, schema_id: str, image: str = "after") -> list[FieldSpec]:
        return row_image_fields(self.batch.schemas[schema_id], image)

    def cache(self) -> None:
        """Keeps the parsed row images once computed, for batches whose several segments each read them."""
        if not self.cached and self.events is not None:
            self.events = self.events.cache()
            self.cached = True

    def release(self) -> None:
        if self.cached and self.events is not None:
            self.events.unpersist()


def event_refs(batch: FetchedBatch) -> list[EventRef]:
    """The batch's index as EventRefs in source order."""
    return sorted((event_ref(entry) for entry in batch.index), key=lambda ref: ref.seq)


def has_data_changes(batch: FetchedBatch) -> bool:
    return any(entry.get("kind") == DATA_CHANGE for entry in batch.index)


def parse_index(batch: FetchedBatch) -> ParsedBatch:
    """A batch without data changes (a schema snapshot's, heartbeats): its index is all there is to parse."""
    return ParsedBatch(batch=batch, events=None, refs=event_refs(batch))


def row_events(rows: DataFrame, batch: FetchedBatch) -> ParsedBatch:
    """The batch's index as EventRefs in source order, and the runner's rows of its data changes (`batch_dataframe`:
    seq, schema, op, before, after) as the events, lazily: nothing to parse."""
    events = rows.select(
        # As text: Spark's generated code inlines a number literal, so a new class per batch would be compiled (and
        # run interpreted until the JIT catches up); a string literal is a reference, and the code is reused.
        F.lit(str(batch.batch_id)).alias("batch_id"),
        "seq",
        F.col("schema").alias("schema_id"),
        "op", "before", "after",
        F.lit(False).alias("malformed"),  # the runner's rows are typed: only a JSON line can be malformed
    )
    return ParsedBatch(batch=batch, events=events, refs=event_refs(batch))


def row_lines(events: DataFrame) -> DataFrame:
    """(seq, line): the events of `row_events` written as JSON lines with their row images alone, which
    `parse_events` reads back to the same rows (a dead letter's line when its runner batch keeps no records)."""
    value = F.struct("op", "before", "after").alias("value")
    return events.select("seq", F.to_json(F.struct("seq", F.col("schema_id").alias("schema"), value)).alias("line"))


def parse_events(data_lines: DataFrame, batch: FetchedBatch) -> ParsedBatch:
    """`row_events` of JSON lines (a `line` column: a replayed dead letter's, a test's), each a data change with its
    row images at least ({seq, schema, value: {op, before, after}}; a whole line too), parsed lazily in Spark."""
    parsed = data_lines.select(F.from_json("line", ROW_IMAGES).alias("e"), _line_seq().alias("line_seq"), "line")
    value = F.col("e.value")
    events = parsed.select(
        F.lit(str(batch.batch_id)).alias("batch_id"),  # as text: see `row_events`
        # From the line's first field, so that a step (and the skip strategy's halving) finds a malformed line too.
        F.coalesce("line_seq", F.raise_error(F.concat(F.lit("an event line without its seq: "),
                                                      F.substring("line", 1, 200)))).alias("seq"),
        F.col("e.schema").alias("schema_id"),
        value["op"].alias("op"),
        value["before"].alias("before"),
        value["after"].alias("after"),
        # A line that is not the JSON it should be parses to nulls: `fail_on_malformed` makes it fail where it is
        # used, never go missing.
        (F.col("e.seq").isNull() | (F.col("e.seq") != F.col("line_seq")) | value["op"].isNull()).alias("malformed"),
    )
    lines = data_lines.select(_line_seq().alias("seq"), "line")
    return ParsedBatch(batch=batch, events=events, refs=event_refs(batch), lines=lines)


def fail_on_malformed(frame: DataFrame) -> DataFrame:
    """The frame (of `ParsedBatch.events`), failing with the event's seq when it holds a malformed line.

    Applied to a step's rows after they are chosen, so that only the step holding the line fails, and not a cached
    batch's other steps."""
    return frame.withColumn("op", F.when(F.col("malformed"), F.raise_error(F.concat(
        F.lit("malformed event line (seq "), F.col("seq").cast("string"), F.lit(" of runner batch "),
        F.col("batch_id"), F.lit(")")))).otherwise(F.col("op")))


def _line_seq() -> Column:
    """The seq of a runner line read from its first field (`{"seq":N,...`), without parsing the rest."""
    return F.regexp_extract("line", r'^\{"seq":(\d+)[,}]', 1).try_cast(T.LongType())


_UNINDEXED_SOURCE_FIELDS = frozenset({"version", "connector", "name", "ts_us", "ts_ns"})


def index_entry(line: str) -> dict[str, Any]:
    """The index entry of one of the runner's JSON lines, computed from the line: what the runner's
    `EventSerializer.indexEntry` makes (`tests/integration/test_runner_index.py` compares the two). Used to replay a dead
    letter, whose line is all that is kept of it."""
    event = json.loads(line)
    entry: dict[str, Any] = {"seq": event["seq"]}
    value = event.get("value")
    kind = OTHER
    if isinstance(value, dict) and _is_transaction_marker(value):
        kind = TRANSACTION
        entry["status"], entry["id"] = value["status"], value["id"]
        if value.get("event_count") is not None:
            entry["event_count"] = value["event_count"]
    elif isinstance(value, dict) and event.get("schema") is not None:
        entry["schema"] = event["schema"]
        source = value.get("source")
        if source is not None:
            entry["source"] = {k: v for k, v in source.items() if v is not None and k not in _UNINDEXED_SOURCE_FIELDS}
        if "ddl" in value or "tableChanges" in value:
            kind = SCHEMA_CHANGE
            entry["change"] = {"databaseName": value.get("databaseName"), "ddl": value.get("ddl"),
                               "tableChanges": value.get("tableChanges") or []}
        else:
            op = value.get("op")
            entry["op"] = op
            if value.get("ts_ms") is not None:
                entry["ts_ms"] = value["ts_ms"]
            kind = DATA_CHANGE if op in DML_OPS else TRUNCATE if op == TRUNCATE_OP else OTHER
            if source is not None and source.get("table") is not None:
                container = source.get("schema") if "schema" in source else source.get("db")
                entry["table"] = source["table"] if container is None else f"{container}.{source['table']}"
    entry["kind"] = kind
    entry["offset"] = public_offset(event.get("offset"))
    return entry


def _is_transaction_marker(value: dict[str, Any]) -> bool:
    """Whether an event's value is a transaction's BEGIN or END record (`EventSerializer.isTransactionMarker`)."""
    return "status" in value and "id" in value and "event_count" in value and "op" not in value \
        and "source" not in value


TRANSACTION_BEGUN, TRANSACTION_OPEN = "begun", "open"  # `transaction_state_after`; "" when none


def transaction_state_after(entries: list[dict[str, Any]], state: str) -> str:
    """Where the stream stands after these index entries (in stream order), given where it stood before them: inside
    a source transaction that has changes (TRANSACTION_OPEN: its BEGIN and a streamed row change came, its END did
    not), after a BEGIN only (TRANSACTION_BEGUN: Debezium also gives one before a MySQL DDL, whose END comes only
    with the next transaction's BEGIN), or outside any (""). A schema change ends a transaction (MySQL's DDL
    commits implicitly; no other source's schema change is inside one); a snapshot's reads, heartbeats and changes
    seen without their BEGIN leave the state as it was."""
    for entry in entries:
        kind = entry.get("kind")
        if kind == TRANSACTION:
            state = TRANSACTION_BEGUN if entry.get("status") == BEGIN else ""
        elif kind == SCHEMA_CHANGE:
            state = ""
        elif kind == DATA_CHANGE and state and entry.get("op") in STREAMED_OPS:
            state = TRANSACTION_OPEN
    return state


def index_entry_of(ref: EventRef) -> dict[str, Any]:
    """The index entry an EventRef was made from (what a dead letter keeps of an event that is not a data change)."""
    entry: dict[str, Any] = {"seq": ref.seq, "kind": ref.kind, "source": ref.raw_source, "offset": ref.offset}
    for key, value in (("table", ref.source_table), ("schema", ref.schema_id), ("op", ref.op),
                       ("ts_ms", ref.debezium_ts_ms)):
        if value is not None:
            entry[key] = value
    if ref.schema_change is not None:
        entry["change"] = {key: value for key, value in ref.schema_change.items() if key != "source"}
    return entry


def row_image_fields(value_schema: dict[str, Any], image: str = "after") -> list[FieldSpec]:
    """The columns of the `after` (or `before`) struct of a Debezium value schema, in order."""
    for envelope_field in value_schema.get("fields", []):
        if envelope_field.get("field") == image:
            return [
                FieldSpec(
                    name=column["field"],
                    type=column.get("type", "string"),
                    logical=column.get("name"),
                    parameters={str(k): str(v) for k, v in (column.get("parameters") or {}).items()},
                    optional=bool(column.get("optional", True)),
                )
                for column in envelope_field.get("fields", [])
            ]
    return []


# Sources whose package orders its streaming offsets (`stream_order`: the transaction's order, the transaction, the
# record's place in it; `ORDERED_WITHIN_TRANSACTION`: whether records come in that place's order within it).
_ORDERED_SOURCES = tuple(source for source in sources.packages() if source.stream_order is not None)


def _ordered_place(offset: dict[str, Any] | None) -> tuple[Source, tuple[Any, Any, Any]] | None:
    """The source package that orders a streaming offset, and where the offset lies (`stream_order`), or None."""
    for module in _ORDERED_SOURCES:
        place = module.stream_order(offset)
        if place is not None:
            return module, place
    return None


def _ordered_before(module: Source, place: tuple[Any, Any, Any], other: tuple[Any, Any, Any], *,
                    or_same: bool = False) -> bool:
    """Whether a record (its `stream_order` place) comes before `other` (or is it, with `or_same`): by transaction,
    then within one transaction by place when its records come in that order. Records of two transactions that
    share an order (which one stream never gives) are not ordered."""
    if place[0] != other[0]:
        return place[0] < other[0]
    if place[1] != other[1] or not module.ORDERED_WITHIN_TRANSACTION:
        return False
    return place[2] <= other[2] if or_same else place[2] < other[2]


def same_stream_position(first: dict[str, Any] | None, second: dict[str, Any] | None) -> bool:
    """Whether two streamed records share one offset: the records of one statement that Debezium splits (the
    schema changes of a multi-table `DROP TABLE a, b` or `RENAME TABLE`, PostgreSQL's TRUNCATE of several tables).
    A run must apply such records together: once the first is applied, the others compare as applied
    (`redelivery_test`) and the engine does not give them again. Snapshot records (which all share one) never do."""
    if first is None or second is None:
        return False
    binlog = offset_order(first)
    if binlog is not None:
        return offset_order(second) == binlog and binlog_base(first) == binlog_base(second)
    pg = pg_stream_offset(first)
    if pg is not None:
        return pg_stream_offset(second) == pg
    ordered = _ordered_place(first)
    return ordered is not None and _ordered_place(second) == ordered


def redelivery_test(applied: dict[str, Any] | None, resumed_from: dict[str, Any] | None = None, *,
                    connector: str | None = None) -> Callable[[dict[str, Any] | None], bool] | None:
    """A test telling, from a record's Debezium offset, whether it is at or before `applied` (the offset of the
    last record a committed batch applied): a re-delivery after a crash between the commit and the offset flush.
    None when `applied` has no such order (nothing then counts as re-delivered).

    Binlog offsets (MariaDB/MySQL) grow strictly while streaming. PostgreSQL's stream comes in commit order, each
    transaction whole: a record is re-delivered when it belongs to the applied record's transaction (`txId`) at
    or before its `lsn` (a transaction's changes have growing LSNs), or to a transaction before it, which its
    `lsn_commit` (the commit LSN of the transaction before the record's) tells: lower than the applied record's
    (`binlog_redelivery_test` and `pg_redelivery_test` of their source packages).
    SQL Server and Oracle order their own offsets (`stream_order` of their source packages, `_ordered_test`): SQL
    Server by commit LSN, then change LSN and `event_serial_no`; Oracle by the commits recorded before a record
    (`commit_scn`), then its `txSeq` in its transaction.
    Snapshot records never count: they are tracked per table (`SnapshotStep`).

    A binlog record is only compared when it belongs to the applied position's binlog: one of another base name,
    or one before the transaction the engine resumed from (`resumed_from`, its stored offset: re-deliveries start
    there), means the source's log was reset (`RESET MASTER`), renamed, or is another server's (a failover). Such a
    record would compare as already applied and be lost: `SourceLogChangedError` stops the run instead.
    """
    for source_test in (binlog_redelivery_test, pg_redelivery_test):
        test = source_test(applied, resumed_from, connector=connector)
        if test is not None:
            return test
    ordered = _ordered_place(applied)
    if ordered is not None:
        return _ordered_test(*ordered, resumed_from)
    return None


def _ordered_test(module: Source, applied: tuple[Any, Any, Any],
                  resumed_from: dict[str, Any] | None) -> Callable[[dict[str, Any] | None], bool]:
    """`redelivery_test` of a source whose package orders its offsets (SQL Server, Oracle): a record of a transaction
    before the applied one's is re-delivered, and one of the applied transaction at or before the applied place.

    Where records of a transaction do not always come in the order of their places (SQL Server: a multi-row update
    of a key, DBZ-2329), Debezium skips on restart only up to where the places first go down, then gives the rest:
    so here, in the applied transaction, a record at or before the place the engine resumed from (`resumed_from`)
    is one Debezium gave after such a drop (new), and once the places go down no record of it counts as
    re-delivered. Some records may then be applied twice (replayed in order, the transaction ends as the source
    has it), none lost."""
    resumed = module.stream_order(resumed_from) if resumed_from else None
    resumed_within = resumed[2] if resumed is not None and resumed[:2] == applied[:2] else None
    seen: dict[str, Any] = {"last": None, "dropped": False}

    def ordered_test(offset: dict[str, Any] | None) -> bool:
        place = module.stream_order(offset)
        if place is None:
            return False
        if module.ORDERED_WITHIN_TRANSACTION or place[:2] != applied[:2]:
            return _ordered_before(module, place, applied, or_same=True)
        last, seen["last"] = seen["last"], place[2]
        if last is not None and place[2] < last:
            seen["dropped"] = True
        if seen["dropped"] or (resumed_within is not None and place[2] <= resumed_within):
            return False
        return place[2] <= applied[2]
    return ordered_test


class StreamRedeliveries:
    """Which streamed events a run was given before: those at or before the applied position (`redelivery_test`: a
    crash between a commit and the offset's flush), and those the run took already.

    Debezium's log reader, reconnecting by itself within a run (a source restart; a binlog connection its keep-alive
    took for lost while the reader waited on a full queue), gives the source transaction it was in again from its
    start, each event with its first offset. Events come in order otherwise, so an event before the last one taken
    is a repeat. Several events share one offset (a key update's delete and create, the records of a multi-table
    `DROP TABLE` or PostgreSQL `TRUNCATE`): at the last offset taken, an event that follows repeats is a repeat while
    the run took that many there, and one that follows the events taken there is theirs. In a binlog, a data change
    of the same op and table as the first event taken at that offset is a repeat too: data changes that share a
    binlog offset never are (a key update's delete and create differ in op, and each row of a statement has its own
    offset), so such an event starts repeats at that very offset. Reads do not count (an incremental snapshot's
    chunk shares the stream's offset). PostgreSQL gives the rows of one multi-row WAL record (a COPY) one LSN, so
    there repeats that begin at the last offset taken are not told. SQL Server and Oracle events are placed by their
    source packages (`stream_order`); within a SQL Server transaction an event placed before the one taken before it
    is no repeat (its rows do not always come in the order of their change LSNs). Call it on every event, in order,
    with `change` (op, table) for data changes."""

    def __init__(self, applied: dict[str, Any] | None, resumed_from: dict[str, Any] | None = None, *,
                 connector: str | None = None) -> None:
        self._applied = redelivery_test(applied, resumed_from, connector=connector)
        self._last: tuple[Any, ...] | None = None  # where the last event taken is (`_stream_place`)
        self._taken_at_last = 0  # events taken at that offset
        self._repeated_at_last = 0  # events at that offset given again since the last repeat before it
        self._repeating = False  # the event before was a repeat
        self._first_change_at_last: tuple[Any, ...] | None = None  # (op, table) of the first event taken there

    def __call__(self, offset: dict[str, Any] | None, change: tuple[Any, ...] | None = None) -> bool:
        here = _stream_place(offset)
        if here is None:
            return self._applied is not None and self._applied(offset)
        last = self._last
        comparable = last is not None and last[0] == here[0] and (here[0] == "pg" or last[1] == here[1])
        if not comparable:
            # The first event taken (or another binlog): the applied position decides.
            if self._applied is not None and self._applied(offset):
                return True
            return self._take(here, change)
        assert last is not None
        if here == last:
            if (not self._repeating and here[0] == "binlog" and change is not None and change[0] in STREAMED_OPS
                    and change == self._first_change_at_last):
                # The first event taken at this offset given again: the repeats begin here.
                self._repeating, self._repeated_at_last = True, 0
            if self._repeating:
                self._repeated_at_last += 1
                if self._repeated_at_last <= self._taken_at_last:
                    return True
            self._repeating = False
            self._taken_at_last += 1
            return False
        if self._before(here, last):
            self._repeating = True
            self._repeated_at_last = 0
            return True
        return self._take(here, change)

    def _take(self, here: tuple[Any, ...], change: tuple[Any, ...] | None) -> bool:
        self._last, self._taken_at_last, self._repeated_at_last, self._repeating = here, 1, 0, False
        self._first_change_at_last = change
        return False

    @staticmethod
    def _before(here: tuple[Any, ...], last: tuple[Any, ...]) -> bool:
        if here[0] == "binlog":
            return here[2] < last[2]
        if here[0] == "ordered":
            return _ordered_before(here[1], here[2], last[2])
        return pg_before(here[1], last[1])


def _stream_place(offset: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """Where a streamed record is, for `StreamRedeliveries`: ("binlog", base name, `offset_order`), ("pg",
    `pg_stream_offset`) or ("ordered", source package, `stream_order`); None for a snapshot's or an unordered one."""
    order = offset_order(offset)
    if order is not None:
        assert offset is not None
        return "binlog", binlog_base(offset), order
    record = pg_stream_offset(offset)
    if record is not None:
        return "pg", record
    ordered = _ordered_place(offset)
    return None if ordered is None else ("ordered", *ordered)
