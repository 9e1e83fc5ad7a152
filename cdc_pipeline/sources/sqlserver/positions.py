"""A SQL Server connector's positions: its Debezium offsets' shape and source partition, their order in the stream
(re-delivered events), up to where an offset says changes were processed, and whether the change tables still hold
the changes after it.

Offsets. Debezium's SQL Server connector (3.5, `SqlServerOffsetContext.getOffset`) writes `commit_lsn` (the
transaction's commit LSN), `change_lsn` (the row's `__$seqval`) as `Lsn.toString` text ('0000002c:00000a38:0003',
lower-case hex; 'NULL' or null when unknown) and `event_serial_no` (the records emitted at that same position so
far: an update counts 2). On restart it skips what its stored offset covers by the same order
(`SqlServerStreamingChangeEventSource`: `TxLogPosition.compareTo`, then `event_serial_no`), and stops skipping within
a transaction once its rows' `__$seqval` go down (DBZ-2329, a multi-row update of a key): within a transaction, the
offsets' order is not always the stream's.

Lost positions. A capture instance whose oldest LSN (`sys.fn_cdc_get_min_lsn`) is past the applied position, though
it existed then, was cleaned up past it: the changes between are gone (Debezium would read on from the change
table's start, silently).
"""

from __future__ import annotations

import datetime
from typing import Any, Callable

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.sources.change_check import inside_snapshot
from cdc_pipeline.sources.lost_position import LostPosition
from cdc_pipeline.sources.offset_shape import FLAG, INT, TEXT, OffsetShape
from cdc_pipeline.sources.sqlserver.connector import read_server

_INCREMENTAL_SNAPSHOT_KEYS = ("incremental_snapshot_primary_key", "incremental_snapshot_maximum_key",
                               "incremental_snapshot_collections", "incremental_snapshot_correlation_id")
OFFSET_SHAPE = OffsetShape(
    required={"commit_lsn": TEXT},
    # As SqlServerOffsetContext.getOffset writes them (Debezium 3.5): change_lsn is null at a position without a
    # change; the incremental snapshot's keys are there while one runs.
    optional={"change_lsn": TEXT + (type(None),), "event_serial_no": INT, "snapshot": FLAG, "snapshot_completed": FLAG,
              "transaction_id": TEXT, **{key: TEXT + (type(None),) for key in _INCREMENTAL_SNAPSHOT_KEYS}},
    example='{"commit_lsn": "0000002c:00000a38:0003", "change_lsn": "0000002c:00000a38:0002", "event_serial_no": 1}',
)
# Within a transaction, records do not always come in the order of their offsets (DBZ-2329).
ORDERED_WITHIN_TRANSACTION = False

CAPTURE_INSTANCES = (
    "SELECT s.name, t.name, ct.capture_instance, sys.fn_cdc_get_min_lsn(ct.capture_instance), ct.create_date "
    "FROM cdc.change_tables ct JOIN sys.tables t ON t.object_id = ct.source_object_id "
    "JOIN sys.schemas s ON s.schema_id = t.schema_id ORDER BY s.name, t.name, ct.capture_instance")
LSN_TIME = "SELECT sys.fn_cdc_map_lsn_to_time(%s)"


def source_partition(connector: str, database: str) -> dict[str, str]:
    """Debezium's source partition of the connector's offsets: one per database (`database.names` may list several),
    named by the connector's name (its topic prefix) and the database."""
    return {"server": connector, "database": database}


def lsn_bytes(text: Any) -> bytes | None:
    """An LSN as Debezium writes it ('0000002c:00000a38:0003') as its 10 bytes, or None when it is unknown ('NULL')."""
    if text is None or text == "NULL":
        return None
    try:
        return bytes.fromhex(str(text).replace(":", ""))
    except ValueError:
        return None


def lsn_text(lsn: bytes) -> str:
    """10 LSN bytes as Debezium's `Lsn.toString` writes them."""
    digits = lsn.hex()
    return f"{digits[:8]}:{digits[8:16]}:{digits[16:]}"


def stream_order(offset: dict[str, Any] | None) -> tuple[bytes, str, tuple[bytes, int]] | None:
    """Where a streamed record's offset lies: (its transaction's order, its transaction, its place in it), as
    Debezium compares positions on restart (`TxLogPosition`: commit LSN, then change LSN; then `event_serial_no`).
    None for a snapshot's offset, or one that is not SQL Server's."""
    if not offset or offset.get("snapshot") not in (None, False, "false") or "commit_lsn" not in offset:
        return None
    commit = lsn_bytes(offset["commit_lsn"])
    if commit is None:
        return None
    change = lsn_bytes(offset.get("change_lsn")) or b""  # Debezium's NULL LSN sorts first
    return commit, commit.hex(), (change, int(offset.get("event_serial_no") or 0))


def check_position(offset: dict[str, Any] | None) -> tuple[bytes, bytes] | None:
    """Up to where an offset says every change was processed, for the change check: (commit LSN, change LSN in
    that transaction); a position without a change (a finished snapshot's, a poll that found none) covers its whole
    commit LSN. None inside a snapshot, or for an offset that is not SQL Server's."""
    if not offset or inside_snapshot(offset):
        return None
    commit = lsn_bytes(offset.get("commit_lsn"))
    if commit is None:
        return None
    return commit, lsn_bytes(offset.get("change_lsn")) or b"\xff" * len(commit)


def lost_position(connector: ConnectorConfig, offset: dict[str, Any],
                  captured: Callable[[str], bool]) -> LostPosition | None:
    """What the change tables no longer hold of `offset`, or None: the cleanup job removed changes of a captured
    table after it. Debezium's connector would read on from the change table's oldest row and skip them without a
    word, so a run refuses to start instead."""
    position = check_position(offset)
    if position is None:
        return None
    commit = position[0]
    lost = read_server(connector, lambda cur: cleaned_up(cur, commit, capture_instances(cur, captured)))
    if not lost:
        return None
    return LostPosition(f"LSN {lsn_text(commit)}", f"it fell out of the change tables' retention: the cleanup job "
                                                   f"removed the changes of {', '.join(lost)} after it (their oldest "
                                                   "LSN is later)")


def capture_instances(cur: Any, captured: Callable[[str], bool]) -> list[tuple]:
    """The capture instances of the tables `captured` accepts: (schema, table, instance, its oldest LSN, created)."""
    cur.execute(CAPTURE_INSTANCES)
    return [row for row in cur.fetchall() if captured(f"{row[0]}.{row[1]}")]


def cleaned_up(cur: Any, commit: bytes, instances: list[tuple]) -> list[str]:
    """The capture instances whose oldest LSN is past `commit` though they existed at it (created before its
    commit time): the cleanup job removed changes after it. The commit's time is unknown once
    `cdc.lsn_time_mapping` was cleaned past it too: then every instance whose oldest LSN is later counts."""
    later = [row for row in instances if row[3] is not None and bytes(row[3]) > commit]
    if not later:
        return []
    cur.execute(LSN_TIME, (commit,))
    row = cur.fetchone()
    committed_at: datetime.datetime | None = row[0] if row else None
    return [instance for _, _, instance, _, created in later
            if committed_at is None or created is None or created <= committed_at]
