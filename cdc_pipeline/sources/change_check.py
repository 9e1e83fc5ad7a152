"""What every source type's change check returns (`check_changes` of the source module, which `cdc-pipeline
pending` and the change sensor ask without a JVM), the counts of rows per key range `verify` compares for the
sources whose rows it does not hash, and what the SQL Server and Oracle checks share to read their server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.errors import CdcError


@dataclass(frozen=True)
class ChangeCheck:
    """Whether the source holds changes the connector has not applied, and why (or why not); `checked` is the source
    position read up to when only changes of other tables were found there (recorded, so the next check starts
    from it), else None. `reached_end` says the check read the source's log up to where it ended when the check
    began: only such a check can tell that there is nothing to do (one that stopped short, at its time budget,
    says there are changes: a run reads the rest)."""

    changes: bool
    reason: str
    checked: dict[str, Any] | None = None
    known: bool = True  # False: no change was seen, though the source could not be checked (a slot in use)
    reached_end: bool = False


@dataclass(frozen=True)
class SourceLag:
    """How far the source's log goes past the connector's position, told without a JVM: `bytes` of binlog or WAL,
    and for MariaDB/MySQL the binlog `events` (counted up to a bound; `events_capped` when more follow). `position`
    is where the measure starts (text), `source_position` the source's current end of log."""

    bytes: int
    position: str
    source_position: str
    events: int | None = None
    events_capped: bool = False


@dataclass(frozen=True)
class RangeCounts:
    """One table's rows counted per range of its integer key, for `verify` of sources whose rows it does not hash
    (SQL Server, Oracle): range `b` holds the keys from `base + b * width` up to the next range's start. Without
    such a key (`key` None) the table is one range, 0."""

    key: str | None
    base: int
    width: int
    rows: dict[int, int]


def count_key_ranges(cur: Any, key: str | None, chunk_rows: int,
                     statements: Callable[[int, int], tuple[str, str]]) -> RangeCounts:
    """Counts a source table's rows per range of about `chunk_rows` keys' rows: `statements(base, width)` gives the
    source's SQL of (the key's minimum, maximum and the row count; each range's number and rows)."""
    bounds, _ = statements(0, 1)
    cur.execute(bounds)
    low, high, total = cur.fetchone()
    if key is None or not total:
        return RangeCounts(None, 0, 1, {0: int(total)} if total else {})
    base = int(low)
    width = max(1, -(-(int(high) - base + 1) * chunk_rows // int(total)))
    _, ranges = statements(base, width)
    cur.execute(ranges)
    return RangeCounts(key, base, width, {int(number): int(rows) for number, rows in cur.fetchall()})


def inside_snapshot(offset: dict[str, Any]) -> bool:
    """Whether a Debezium offset was taken inside a snapshot that had not completed (its `snapshot` is true or the
    snapshot's kind, INITIAL, ...)."""
    return str(offset.get("snapshot", "false")).lower() != "false" \
        and str(offset.get("snapshot_completed")).lower() != "true"


def driver_words(exc: BaseException, connector: ConnectorConfig) -> str:
    """A driver's error as one line of the server's words (pymssql gives (code, bytes) pairs, its lines often twice),
    the password (should a driver ever echo it) masked."""
    parts: list[str] = []

    def gather(value: Any) -> None:
        if isinstance(value, tuple):
            for item in value:
                gather(item)
        elif isinstance(value, bytes):
            parts.append(value.decode(errors="replace"))
        elif not isinstance(value, int):
            parts.append(str(value))

    gather(exc.args)
    lines = dict.fromkeys(line.strip() for part in parts for line in part.splitlines() if line.strip())
    text = " ".join(lines) or type(exc).__name__
    password = connector.password.reveal()
    return text.replace(password, "***") if password else text


def read_source(connector: ConnectorConfig, connect: Callable[[ConnectorConfig], Any], driver_error: type,
                reads: Callable[[Any], Any]) -> Any:
    """`reads(cursor)` on a connection `connect` opens to the connector's source, closed after; a `driver_error`
    raises CdcError naming the connector and host."""
    conn = connect(connector)
    try:
        with conn.cursor() as cur:
            return reads(cur)
    except driver_error as exc:
        raise CdcError(f"the source {connector.hostname}:{connector.port} refused a check's query: "
                       f"{driver_words(exc, connector)}", connector=connector.name) from None
    finally:
        conn.close()
