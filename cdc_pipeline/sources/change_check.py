"""What every source type's change check returns (`check_changes` of the source module, which `cdc-pipeline
pending` and the change sensor ask without a JVM)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
