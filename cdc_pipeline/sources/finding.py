"""What a preflight check found missing on a source or the destination before a connector's first run (`preflight` of
the source module; `cdc-pipeline check NAME` shows them, and a first sync refuses to start on an error)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

ERROR = "error"  # the connector cannot run (or cannot replicate exactly) until it is fixed
WARNING = "warning"  # it runs, with a risk the fix removes


@dataclass(frozen=True)
class Finding:
    """One thing a source or the destination lacks: where (`source` or `destination`), the setting or privilege,
    what is wrong with its current value, and the statement(s) that fix it."""

    level: str
    where: str
    setting: str
    problem: str
    fix: str

    @property
    def is_error(self) -> bool:
        return self.level == ERROR

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def source_error(setting: str, problem: str, fix: str) -> Finding:
    return Finding(ERROR, "source", setting, problem, fix)


def source_warning(setting: str, problem: str, fix: str) -> Finding:
    return Finding(WARNING, "source", setting, problem, fix)
