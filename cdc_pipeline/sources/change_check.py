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
