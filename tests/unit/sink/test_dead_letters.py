"""Unit tests for cdc_pipeline.sink.dead_letters: the event a Spark failure names, the source transaction of a set-aside
event, and a step's events without those set aside."""

from __future__ import annotations

from collections import Counter

from cdc_pipeline.decode.events import BEGIN, DATA_CHANGE, END, TRANSACTION, EventRef
from cdc_pipeline.sink.dead_letters import DeadLetters, spark_failure
from cdc_pipeline.sink.plan import DmlStep

TABLE = "inventory.items"


def _data(seq: int, table: str = TABLE) -> EventRef:
    return EventRef(seq, DATA_CHANGE, table, "schema-1", "u", {})


def _transaction(seq: int, status: str, transaction: str) -> EventRef:
    return EventRef(seq, TRANSACTION, None, None, None, {}, transaction=(status, transaction))


def _dead_letters(refs: list[EventRef]) -> DeadLetters:
    dead_letters = DeadLetters(None, None, "cdc", None)  # type: ignore[arg-type]
    dead_letters.begin(refs)
    return dead_letters


def test_a_spark_failure_says_the_message_its_expression_raised_and_the_event_it_names() -> None:
    error = RuntimeError("[USER_RAISED_EXCEPTION] malformed event line (seq 42 of runner batch 3) SQLSTATE: P0001\n"
                         "JVM stacktrace: ...")
    assert spark_failure(error) == ("malformed event line (seq 42 of runner batch 3)", 42)
    assert spark_failure(RuntimeError("executor lost\nmore")) == ("executor lost", None)


def test_a_set_aside_event_is_in_the_transaction_its_begin_opened_in_the_batch() -> None:
    refs = [_data(1), _transaction(2, BEGIN, "tx-7"), _data(3), _transaction(4, END, "tx-7"), _data(5)]
    dead_letters = _dead_letters(refs)
    assert [dead_letters.transaction_of(ref) for ref in refs if ref.kind == DATA_CHANGE] == [None, "tx-7", None]


def test_a_steps_events_leave_out_those_set_aside_and_other_tables() -> None:
    dead_letters = _dead_letters([_data(1), _data(2, "inventory.other"), _data(3), _data(4), _data(9)])
    dead_letters.set_aside_seqs.add(3)
    step = DmlStep(TABLE, "schema-1", 1, 4, ops=Counter(u=3))
    assert [ref.seq for ref in dead_letters.step_refs(step)] == [1, 4]
    assert dead_letters.event(2) is not None and dead_letters.event(7) is None
