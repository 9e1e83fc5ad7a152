"""cycle.run_ahead's ordering and hand-over rules, with plain objects standing in for the session and plans."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from cdc_pipeline.cycle import run_ahead
from cdc_pipeline.sink.plan import DmlStep


@dataclass
class _Stats:
    groups_run_ahead: int = 0


@dataclass
class _Session:
    fail_to_connect: bool = False
    cycle_stats: _Stats = field(default_factory=_Stats)
    stop_fetching: bool = False
    connections: int = 0
    connector: Any = field(default_factory=lambda: SimpleNamespace(name="c"))

    def may_run_ahead(self) -> bool:
        return True

    def open_thread_connection(self) -> None:
        if self.fail_to_connect:
            raise ConnectionError("the destination refused the thread's connection")
        self.connections += 1

    def close_thread_connection(self) -> None:
        self.connections -= 1


@dataclass
class _Plan:
    number: int
    steps: list[Any]


def _dml() -> DmlStep:
    return object.__new__(DmlStep)


def _plans(kinds: str, log: list[tuple[str, int]], lock: threading.Lock, fail_at: int | None = None) -> Iterator[_Plan]:
    """Plans whose kind is `d` (data changes only) or `s` (a schema change), logging when each is made."""
    for number, kind in enumerate(kinds):
        if number == fail_at:
            raise RuntimeError(f"plan {number} failed")
        with lock:
            log.append(("made", number))
        yield _Plan(number, [_dml()] if kind == "d" else [object()])


def _consume(session: _Session, plans: Iterator[_Plan], log: list[tuple[str, int]], lock: threading.Lock) -> list[int]:
    applied = []
    for plan in run_ahead(session, plans):  # type: ignore[arg-type]
        with lock:
            log.append(("applying", plan.number))
        applied.append(plan.number)
    return applied


def test_groups_are_applied_in_order_with_at_most_one_made_ahead_and_none_past_a_schema_change():
    session, log, lock = _Session(), [], threading.Lock()
    applied = _consume(session, _plans("ddsdd", log, lock), log, lock)

    assert applied == [0, 1, 2, 3, 4]
    for position, (event, number) in enumerate(log):
        if event == "made":
            before = [n for e, n in log[:position] if e == "applying"]
            # Made while the group before it is applied at the earliest, never two ahead.
            assert number - (max(before) if before else -1) <= 2
    # The group after the schema change (2) is made only once 2 was handed to be applied and applied.
    assert log.index(("made", 3)) > log.index(("applying", 2))
    assert session.cycle_stats.groups_run_ahead == 5 and session.connections == 0


def test_a_failure_making_a_group_is_raised_after_the_groups_before_it():
    session, log, lock = _Session(), [], threading.Lock()
    applied: list[int] = []
    with pytest.raises(RuntimeError, match="plan 2 failed"):
        for plan in run_ahead(session, _plans("dddd", log, lock, fail_at=2)):  # type: ignore[arg-type]
            applied.append(plan.number)
    assert applied == [0, 1]


def test_a_thread_that_cannot_connect_fails_the_run_instead_of_hanging_it():
    session, log, lock = _Session(fail_to_connect=True), [], threading.Lock()
    with pytest.raises(ConnectionError):
        _consume(session, _plans("dd", log, lock), log, lock)


def test_the_consumer_stopping_stops_the_thread():
    session, log, lock = _Session(), [], threading.Lock()
    ahead = run_ahead(session, _plans("dddddd", log, lock))  # type: ignore[arg-type]
    assert next(ahead).number == 0
    ahead.close()
    assert session.stop_fetching and session.connections == 0
    assert len([entry for entry in log if entry[0] == "made"]) <= 2
