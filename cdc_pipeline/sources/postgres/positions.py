"""A PostgreSQL source's positions: its Debezium offsets' shape and source partition, the stream's order of its
records and which a run was given before (`pg_stream_offset`, `pg_redelivery_test`, which decode's re-delivery tests
use), a transaction snapshot against the stream's offsets (`before_snapshot`, `stream_passed`), the WAL's end marked
by a heartbeat and a record past it (`mark_wal_end`, `received_past`), changes that may share an LSN, and a slot the
server invalidated or dropped (`lost_position`, `drop_lost_slot`).

A table without a primary key is read as one chunk under one statement's snapshot, and that snapshot itself
(`pg_current_snapshot()`, PostgreSQL 13 or later) is its position: a streamed change belongs to a transaction the
chunk already saw exactly when that transaction is visible in the snapshot (`before_snapshot`), the same rule
PostgreSQL applies to the rows."""

from __future__ import annotations

import logging
from typing import Any, Callable

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.sources.lost_position import LostPosition
from cdc_pipeline.sources.offset_shape import FLAG, INT, OffsetShape, TEXT
from cdc_pipeline.sources.postgres.connector import connect, heartbeat_query

log = logging.getLogger(__name__)

# A bulk load's position is a transaction snapshot (`load_end_position`, `snapshot_position_select`).
LOAD_POSITION_KEY = "snapshot"
OFFSET_SHAPE = OffsetShape(
    required={"lsn": INT},
    optional={"lsn_proc": INT, "lsn_commit": INT, "txId": INT, "ts_usec": INT, "xmin": INT, "messageType": TEXT,
              "snapshot": FLAG, "last_snapshot_record": FLAG, "snapshot_completed": FLAG, "transaction_id": TEXT},
    example='{"lsn": 24023128, "txId": 555}',
)


def source_partition(connector: str, database: str) -> dict[str, str]:
    """Debezium's source partition of the connector's offsets: the connector's name (its topic prefix)."""
    return {"server": connector}


def before_snapshot(offset: dict[str, Any] | None, position: dict[str, Any]) -> bool:
    """Whether a streamed change (its Debezium offset) belongs to a transaction visible in the snapshot
    `position` holds (`xmin:xmax:xip,...`): committed before the chunk was read, so its rows hold it."""
    if not offset or "snapshot" in offset or offset.get("txId") is None or "snapshot" not in position:
        return False
    xmin_text, xmax_text, running = str(position["snapshot"]).split(":")
    xmin, xmax = int(xmin_text), int(xmax_text)
    xid = _xid_near(int(offset["txId"]), xmax)
    if xid < xmin:
        return True
    return xid < xmax and str(xid) not in running.split(",")


def _xid_near(xid: int, reference: int) -> int:
    """pgoutput names a transaction by its 32-bit id; a snapshot's ids carry their epoch. Ids compare modulo 2^32
    within half the circle of each other (PostgreSQL's own rule), so the id is the one nearest `reference`."""
    if xid < 1 << 32 <= reference:
        ahead = (xid - reference) % (1 << 32)
        return reference + ahead if ahead < 1 << 31 else reference - ((1 << 32) - ahead)
    return xid


def stream_passed(offset: dict[str, Any] | None, position: dict[str, Any]) -> bool:
    """Whether a streamed change (its Debezium offset) belongs to a transaction begun after the snapshot `position`
    holds was taken (its id at or past the snapshot's xmax): its commit follows, in the stream, the commit of every
    transaction that snapshot sees. (A transaction merely invisible to it may have written its commit record before
    one it sees.)"""
    if not offset or "snapshot" in offset or offset.get("txId") is None or "snapshot" not in position:
        return False
    xmax = int(str(position["snapshot"]).split(":")[1])
    return _xid_near(int(offset["txId"]), xmax) >= xmax


def load_end_position(cur: Any) -> dict[str, Any]:
    """Where the source is now, as `stream_passed` compares it: a snapshot of its transactions."""
    cur.execute("SELECT pg_current_snapshot()::text")
    return {"snapshot": cur.fetchone()[0]}


def lost_position(connector: ConnectorConfig, offset: dict[str, Any], captured: Callable[[str], bool]
                  ) -> LostPosition | None:
    """What the source no longer holds of the engine's stored `offset` (its `lsn`; empty before the engine stored
    one), or None: the connector's slot
    was invalidated (`wal_status` lost: the server removed WAL it held, past `max_slot_wal_keep_size`) or is gone
    (Debezium would make a new one at the WAL's end, skipping every change in between without a word)."""
    slot, lsn = connector.replication_slot, offset.get("lsn")
    with connect(connector) as source:
        row = source.execute("SELECT wal_status, current_setting('max_slot_wal_keep_size') FROM pg_replication_slots "
                             "WHERE slot_name = %s", (slot,)).fetchone()
    # Before the engine stored an offset (a bulk load begun), the slot holds the position.
    position = f"LSN {lsn_text(int(lsn))}" if lsn is not None else f"(its replication slot {slot}'s)"
    if row is None:
        return None if lsn is None else LostPosition(position, f"its replication slot {slot} does not exist (it was "
                                                               "dropped)")
    if row[0] == "lost":
        return LostPosition(position, f"its replication slot {slot} was invalidated (wal_status lost): the server "
                                      f"removed WAL the slot held, past max_slot_wal_keep_size ({row[1]})")
    return None


def drop_lost_slot(connector: ConnectorConfig) -> bool:
    """Drops the connector's replication slot when the server invalidated it (`wal_status` lost), so that a new
    snapshot's engine makes a new one; returns whether it did. Does nothing to a slot that holds its WAL."""
    with connect(connector) as source:
        dropped = source.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                                 "WHERE slot_name = %s AND wal_status = 'lost' AND NOT active",
                                 (connector.replication_slot,)).fetchall()
    return bool(dropped)


def mark_wal_end(connector: ConnectorConfig) -> int | None:
    """Where the source's WAL ends now (its insert position, as a number: past every commit made so far), then the
    connector's heartbeat row written (`heartbeat_query`): a change of its publication past that end, which the
    walsender sends after every transaction committed before it, so that the engine hands over a record at or past
    the end only once Debezium has decoded and handed over them all (`received_past`). None when the position cannot
    be read or the row written."""
    try:
        with connect(connector) as source:
            end = int(source.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0])
            source.execute(heartbeat_query(connector))
    except Exception as exc:  # noqa: BLE001 - the run then ends on time alone
        log.warning("%s: cannot mark the end of the source's WAL: %s", connector.name, exc)
        return None
    return end


def may_share_lsn_ahead(entry: dict[str, Any] | None, connector: ConnectorConfig) -> bool:
    """Whether changes not handed over yet may share the LSN of this streamed change (an index entry of a batch):
    PostgreSQL writes many rows of a COPY (or of any multi-row insert, `heap_multi_insert`) under one WAL record,
    whose LSN each of their changes carries, so an insert of a data table may be followed by more at its LSN. Once
    one of them is applied, the applied position and Debezium's offset say every change at that LSN is (Debezium
    resumes after it), so a group or run must not end between them."""
    if not entry or entry.get("op") != "c" or entry.get("table") == connector.heartbeat_table:
        return False
    offset = entry.get("offset") or {}
    return "lsn" in offset and "txId" in offset and not offset.get("snapshot")


def received_past(offset: dict[str, Any] | None, lsn: int) -> bool:
    """Whether the record Debezium handed over last (its offset) is at or past the WAL position `lsn`: a change
    written after `lsn`, or a heartbeat sent once Debezium had decoded the WAL past it, follows in the stream every
    transaction committed before `lsn`."""
    return bool(offset) and int(offset.get("lsn") or 0) >= lsn


def lsn_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def pg_stream_offset(offset: dict[str, Any] | None) -> tuple[Any, int, int] | None:
    """(txId, lsn, lsn_commit) of a PostgreSQL streaming record's offset, or None (snapshot or other source)."""
    if not offset or offset.get("snapshot") or offset.get("last_snapshot_record") is not None \
            or "lsn" not in offset or "txId" not in offset:
        return None
    return offset["txId"], int(offset["lsn"]), int(offset.get("lsn_commit") or 0)


def pg_before(record: tuple[Any, ...], other: tuple[Any, ...], *, or_same: bool = False) -> bool:
    """Whether a PostgreSQL streamed record (`pg_stream_offset`: txId, lsn, lsn_commit) comes before `other` (or
    is `other`, with `or_same`): in one transaction by LSN, otherwise by the commit LSN of the transaction before
    it, lower for a transaction committed before `other`'s."""
    if record[0] == other[0]:
        return record[1] <= other[1] if or_same else record[1] < other[1]
    return record[2] < other[2]


def pg_record_follows(record: dict[str, Any] | None, other: dict[str, Any] | None) -> bool:
    """Whether the PostgreSQL streamed record at offset `record` comes after the one at `other` in the stream (a
    later LSN of its transaction, or a later transaction); False when either is no such offset."""
    later, earlier = pg_stream_offset(record), pg_stream_offset(other)
    return later is not None and earlier is not None and pg_before(earlier, later)


def pg_redelivery_test(applied: dict[str, Any] | None, resumed_from: dict[str, Any] | None = None, *,
                       connector: str | None = None) -> Callable[[dict[str, Any] | None], bool] | None:
    """`redelivery_test` of PostgreSQL's stream (its decode module's docstring says the whole rule): a test telling
    whether a record belongs to the applied record's transaction at or before its LSN, or to a transaction committed
    before it; None when `applied` is no PostgreSQL streaming offset."""
    pg = pg_stream_offset(applied)
    if pg is None:
        return None

    def pg_test(offset: dict[str, Any] | None) -> bool:
        record = pg_stream_offset(offset)
        return record is not None and pg_before(record, pg, or_same=True)
    return pg_test
