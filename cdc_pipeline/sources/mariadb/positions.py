"""A MariaDB/MySQL source's positions: its Debezium offsets' shape and source partition, binlog positions and their
order, the stream's order of its offsets and which records a run was given before (`offset_order`,
`binlog_redelivery_test`, which decode's re-delivery tests use), a consistent snapshot's binlog position against the
stream's offsets (`before_snapshot`, `stream_passed`), where a run's engine may start instead of its stored offset
(`resume_offset`), and what a purged or reset binlog lost of a stored offset (`lost_position`, by its GTIDs)."""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sources.lost_position import LostPosition
from cdc_pipeline.sources.mariadb.connector import connect
from cdc_pipeline.sources.offset_shape import FLAG, INT, OffsetShape, TEXT

# A bulk load's position is a binlog position (`load_end_position`, `snapshot_position_select`).
LOAD_POSITION_KEY = "file"
OFFSET_SHAPE = OffsetShape(
    required={"file": TEXT, "pos": INT},
    optional={"row": INT, "event": INT, "gtids": TEXT, "ts_sec": INT, "server_id": INT, "snapshot": FLAG,
              "snapshot_completed": FLAG, "transaction_id": TEXT},
    example='{"file": "mariadb-bin.000003", "pos": 4512, "row": 0, "event": 1}',
)


def source_partition(connector: str, database: str) -> dict[str, str]:
    """Debezium's source partition of the connector's offsets: the connector's name (its topic prefix)."""
    return {"server": connector}


def before_snapshot(offset: dict[str, Any] | None, position: dict[str, Any]) -> bool:
    """Whether a streamed event (its Debezium offset) belongs to a transaction committed before the snapshot whose
    binlog position is `position`: its transaction starts (`pos`, where Debezium restarts it) before that
    position, in the same or an earlier binlog file."""
    if not offset or "snapshot" in offset or "file" not in offset or "pos" not in offset:
        return False
    return file_order(str(offset["file"]), int(offset["pos"])) < file_order(str(position["file"]),
                                                                                 int(position["pos"]))


def stream_passed(offset: dict[str, Any] | None, position: dict[str, Any]) -> bool:
    """Whether a streamed event (its Debezium offset), or a position the source was read at, is at or past the
    binlog position `position`: every transaction written before that position came earlier in the stream."""
    return offset is not None and "snapshot" not in offset and position_reached(offset, position)


def position_reached(offset: dict[str, Any] | None, position: dict[str, Any]) -> bool:
    """Whether an event's Debezium offset, a snapshot's included, is at or past the binlog position `position`."""
    if not offset or "file" not in offset or "pos" not in offset:
        return False
    return file_order(str(offset["file"]), int(offset["pos"])) >= file_order(str(position["file"]),
                                                                                  int(position["pos"]))


def load_end_position(cur: Any) -> dict[str, Any]:
    """Where the source is now, as `stream_passed` compares it: its binlog position."""
    return binlog_position(cur)


def file_order(file_name: str, pos: int) -> tuple[int, str, int]:
    """A binlog position's sort key: the file's number (a name without one, such as the empty name a binlog reader
    started from a GTID position has before the server's first rotate event, sorts before every numbered file)."""
    suffix = file_name.rsplit(".", 1)[-1]
    return (int(suffix), "", pos) if suffix.isdigit() else (-1, file_name, pos)


def parse_position(text: str | None) -> dict[str, Any] | None:
    return None if text is None else json.loads(text)


def binlog_position(cur: Any) -> dict[str, Any]:
    """The source's current binlog file and position (where its next event will be written)."""
    try:
        cur.execute("SHOW MASTER STATUS")
    except Exception:  # MySQL 8.4 renamed it
        cur.execute("SHOW BINARY LOG STATUS")
    row = cur.fetchone()
    if row is None:
        raise CdcError("the source writes no binary log (log_bin is off)")
    return {"file": str(row[0]), "pos": int(row[1])}


# The event that begins each transaction, and each statement outside one (MariaDB writes a GTID event before every
# event group; MySQL 5.7 and later a GTID event, or an anonymous one when GTIDs are off).
TRANSACTION_STARTS = ("Gtid", "Anonymous_Gtid")


def check_position(offset: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """Where a streaming offset lies, so that the change check is given the engine's stored offset when it is later
    than the last applied event's (`pending.checked_offset`): Debezium's heartbeat moves it on through other
    databases' events, and a run's engine may have started past it (`resume_offset`)."""
    if not offset or "snapshot" in offset or "file" not in offset or "pos" not in offset:
        return None
    return (*file_order(str(offset["file"]), int(offset["pos"])), int(offset.get("event") or 0),
            int(offset.get("row") or 0))


# Events a transaction boundary may hold: a transaction's first (`TRANSACTION_STARTS`), or a binlog file's own.
_BOUNDARY_EVENTS = (*TRANSACTION_STARTS, "Format_desc", "Rotate", "Gtid_list", "Binlog_checkpoint", "Previous_gtids",
                    "Stop")


def resume_offset(connector: ConnectorConfig, checked: Any, offset: dict[str, Any] | None) -> dict[str, Any] | None:
    """The Debezium offset a run's engine starts from instead of its stored streaming `offset` (the last change it
    captured, or the last heartbeat committed), or None to keep that one: `checked`, the position a change check or
    an idle run recorded (every change before it is applied), when it is past `offset` in the same binlog, on the
    server still, and a transaction's boundary. On a busy server the engine then reads only what the checks have not
    read, instead of every other database's events since the connector's last change.

    The offset gets the GTID position there when the stored one has GTIDs: MariaDB's `BINLOG_GTID_POS(file, pos)`,
    which must not be behind the stored offset's in any domain (else the binlog was reset, or is another server's,
    and the engine meets that itself). MySQL has no such function: an offset with a GTID set (gtid_mode ON) is kept,
    and its heartbeats move it on; one without (gtid_mode OFF) is a file and position, which is all it needs."""
    start = json.loads(checked) if isinstance(checked, str) else checked
    if not start or not offset or "snapshot" in offset or "file" not in offset or "pos" not in offset:
        return None
    file, pos = str(start["file"]), int(start["pos"])
    stored = (str(offset["file"]), int(offset["pos"]))
    if file.rpartition(".")[0] != stored[0].rpartition(".")[0] or file_order(file, pos) <= file_order(*stored):
        return None
    gtids = offset.get("gtids")
    if gtids and connector.type == "mysql":
        return None
    import pymysql

    try:
        with connect(connector) as source, source.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            if file not in {str(row[0]) for row in cur.fetchall()}:
                return None
            end = binlog_position(cur)
            if file_order(file, pos) > file_order(end["file"], end["pos"]):
                return None
            cur.execute("SHOW BINLOG EVENTS IN %s FROM %s LIMIT 1", (file, pos))
            event = cur.fetchone()
            if event is not None and str(event[2]) not in _BOUNDARY_EVENTS:
                return None
            moved: dict[str, Any] = {"file": file, "pos": pos}
            if gtids:
                cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, pos))
                there = cur.fetchone()[0]
                if not there or not _gtids_reached(str(there), str(gtids)):
                    return None
                moved["gtids"] = str(there)
    except pymysql.MySQLError as exc:
        raise CdcError(f"cannot read the binlog at the checked position {file}:{pos} to start the engine there: {exc}",
                       connector=connector.name, position=offset) from None
    if offset.get("server_id") is not None:
        moved["server_id"] = offset["server_id"]
    return moved


def _gtids_reached(position: str, other: str) -> bool:
    """Whether the MariaDB GTID position `position` (domain-server-sequence, comma-separated) is at or past
    `other` in every domain of `other`."""
    def sequences(text: str) -> dict[str, int]:
        parts = (gtid.strip().split("-") for gtid in text.split(",") if gtid.strip())
        return {part[0]: int(part[-1]) for part in parts if len(part) == 3 and part[-1].isdigit()}

    here = sequences(position)
    return all(domain in here and here[domain] >= sequence for domain, sequence in sequences(other).items())


def lost_position(connector: ConnectorConfig, offset: dict[str, Any], captured: Callable[[str], bool]
                  ) -> LostPosition | None:
    """What the binlog no longer holds of the engine's stored `offset` (`file`, `pos`, `gtids`), or None when it
    holds the offset: its file is on the server and reaches `pos`, or (the file purged: Debezium resumes by GTID when
    the offset has GTIDs) the GTIDs of the oldest binlog's start are all at or before the offset's and none of the
    offset's is past the server's binlog (MySQL: `@@gtid_purged` is within the offset's GTIDs). Debezium's own
    `when_needed` compares MariaDB GTIDs with `@@gtid_binlog_state`, which a purge does not shrink."""
    if "file" not in offset or "pos" not in offset or offset.get("snapshot"):
        return None
    file, gtids = str(offset["file"]), str(offset.get("gtids") or "")
    position = f"{file}:{offset['pos']}" + (f" (GTID {gtids})" if gtids else "")
    with connect(connector) as source, source.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        sizes = {str(row[0]): int(row[1]) for row in cur.fetchall()}
        if not sizes or sizes.get(file, -1) >= int(offset["pos"]):
            return None
        oldest = next(iter(sizes))
        if connector.type == "mysql":
            return _mysql_lost_position(cur, position, gtids, oldest)
        return _mariadb_lost_position(cur, position, gtids, oldest)


_MARIADB_GTID = re.compile(r"(\d+)-\d+-(\d+)")


def mariadb_gtid_domains(text: str) -> dict[int, int]:
    """A MariaDB GTID list (`0-1-57,1-2-9`, or a Gtid_list event's `[0-1-57]`) as the highest sequence number of
    each replication domain."""
    domains: dict[int, int] = {}
    for domain, seq in _MARIADB_GTID.findall(text):
        domains[int(domain)] = max(domains.get(int(domain), 0), int(seq))
    return domains


def _mariadb_lost_position(cur: Any, position: str, gtids: str, oldest: str) -> LostPosition | None:
    cur.execute("SHOW BINLOG EVENTS IN %s LIMIT 4", (oldest,))
    begins_text = next((str(info) for _log, _pos, kind, _server, _next, info in cur.fetchall()
                        if kind == "Gtid_list"), "")
    begins = mariadb_gtid_domains(begins_text)
    held = f"its oldest binlog is {oldest}" + (f", which begins after GTID {begins_text.strip('[]')}" if begins
                                               else "")
    if not gtids:
        return LostPosition(position, held)
    at = mariadb_gtid_domains(gtids)
    if any(at.get(domain, 0) < seq for domain, seq in begins.items()):
        return LostPosition(position, held)
    cur.execute("SELECT @@global.gtid_binlog_state")
    state_text = str(cur.fetchone()[0] or "")
    state = mariadb_gtid_domains(state_text)
    if any(seq > state.get(domain, 0) for domain, seq in at.items()):
        return LostPosition(position, f"its binlog, from {oldest} on, holds GTIDs up to {state_text or 'none'} only: "
                                      "it was reset (RESET MASTER) or is another server's")
    return None


def _mysql_lost_position(cur: Any, position: str, gtids: str, oldest: str) -> LostPosition | None:
    held = f"its oldest binlog is {oldest}"
    if not gtids:
        return LostPosition(position, held)
    cur.execute("SELECT @@global.gtid_purged")
    missing = mysql_gtids_missing(str(cur.fetchone()[0] or ""), gtids)
    if not missing:
        return None
    return LostPosition(position, f"{held}, and it purged GTIDs {missing} the connector never read")


def _mysql_gtid_set(text: str) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """A MySQL GTID set (`uuid:1-5:7,uuid2[:tag]:1-3`) as its intervals per source (uuid and tag)."""
    intervals: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for part in "".join(text.split()).split(","):
        if not part:
            continue
        uuid, *items = part.split(":")
        tag = ""
        for item in items:
            first, _, last = item.partition("-")
            if not first.isdigit():
                tag = item
                continue
            intervals.setdefault((uuid.lower(), tag), []).append((int(first), int(last or first)))
    return intervals


def mysql_gtids_missing(purged: str, read: str) -> str:
    """The GTIDs of `purged` outside `read` (MySQL GTID sets), as text; empty when `read` holds all of them."""
    held = _mysql_gtid_set(read)
    missing = []
    for (uuid, tag), ranges in _mysql_gtid_set(purged).items():
        covered = sorted(held.get((uuid, tag), []))
        for first, last in ranges:
            start = first
            for low, high in covered:
                if low <= start <= high:
                    start = high + 1
            if start <= last:
                missing.append(f"{uuid}{':' + tag if tag else ''}:{start}-{last}")
    return ",".join(missing)


def current_position(connector: ConnectorConfig) -> dict[str, Any]:
    """The source's binlog position now: where its log ends, which the engine's reader must reach."""
    with connect(connector) as source, source.cursor() as cur:
        return binlog_position(cur)


class SourceLogChangedError(CdcError):
    """A streamed record that cannot be placed after what was applied: the source's binlog is not the one the
    applied position belongs to."""


def offset_order(offset: dict[str, Any] | None) -> tuple[int | str, int, int, int] | None:
    """A sortable key of a binlog streaming offset (file, transaction position, event, row), or None.

    Debezium's MySQL/MariaDB offsets grow strictly from record to record while streaming, which is what lets
    re-delivered records be recognised. Snapshot offsets (all records share one position) and offsets of
    other sources have no such order here: None.
    """
    if not offset or "snapshot" in offset or "file" not in offset or "pos" not in offset:
        return None
    file_name = str(offset["file"])
    suffix = file_name.rsplit(".", 1)[-1]
    return (int(suffix) if suffix.isdigit() else file_name, int(offset["pos"]), int(offset.get("event") or 0),
            int(offset.get("row") or 0))


def binlog_base(offset: dict[str, Any]) -> str:
    """The binlog's base name (`mariadb-bin` of `mariadb-bin.000012`)."""
    name = str(offset.get("file", ""))
    stem, _, suffix = name.rpartition(".")
    return stem if suffix.isdigit() else name


def binlog_place(offset: dict[str, Any]) -> str:
    return f"{offset.get('file')}:{offset.get('pos')}"


def binlog_redelivery_test(applied: dict[str, Any] | None, resumed_from: dict[str, Any] | None = None, *,
                           connector: str | None = None) -> Callable[[dict[str, Any] | None], bool] | None:
    """`redelivery_test` of a binlog (its decode module's docstring says the whole rule): a test telling whether a
    record's offset is at or before the binlog offset `applied`, raising SourceLogChangedError for a record of
    another binlog or one before the transaction the engine resumed from (`resumed_from`); None when `applied` is no
    binlog streaming offset."""
    binlog = offset_order(applied)
    if binlog is None:
        return None
    assert applied is not None
    base = binlog_base(applied)
    start = offset_order(resumed_from) if resumed_from and binlog_base(resumed_from) == base else None

    def binlog_test(offset: dict[str, Any] | None) -> bool:
        order = offset_order(offset)
        if order is None:
            return False
        assert offset is not None
        if binlog_base(offset) != base or (start is not None and order[:2] < start[:2]):
            raise SourceLogChangedError(
                f"the source's binlog changed: a streamed event at {binlog_place(offset)} cannot be placed "
                f"after the applied position {binlog_place(applied)}"
                + (f" (the engine resumed from {binlog_place(resumed_from)})" if start is not None else "")
                + ": the binlog was reset (RESET MASTER), renamed (log_bin), or belongs to another server (a "
                "failover). Nothing of it was applied. Take a new snapshot (`cdc-pipeline restart NAME always`), "
                "or, if every change before it is applied, move the offset to it (`cdc-pipeline set-offset`)",
                connector=connector, position=offset)
        return order <= binlog
    return binlog_test
