"""What every source type's change check returns (`check_changes` of the source module, which `cdc-pipeline
pending` and the change sensor ask without a JVM)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChangeCheck:
    """Whether the source holds changes the connector has not applied, and why (or why not); `checked` is the source
    position read up to when only changes of other tables were found there (recorded, so the next check starts
    from it), else None."""

    changes: bool
    reason: str
    checked: dict[str, Any] | None = None
    known: bool = True  # False: no change was seen, though the source could not be checked (a slot in use)


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
