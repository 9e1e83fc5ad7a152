"""How the fetch cycle joins runner batches into groups (`FetchCycle._add`), with plain objects for the session."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cdc_pipeline.capture.runner import FetchedBatch
from cdc_pipeline.decode.events import transaction_state_after
from cdc_pipeline import fetch_phases
from cdc_pipeline.fetch_phases import FetchCycle


def _cycle(batch_size: int, apply_batch_events: int, apply_batch_mb: int = 64) -> FetchCycle:
    connector = SimpleNamespace(name="c", type="mariadb", batch_size=batch_size, apply_batch_events=apply_batch_events,
                                apply_batch_mb=apply_batch_mb, max_seconds_per_run=300.0)
    return FetchCycle(SimpleNamespace(runner=object(), connector=connector, cycle_stats=SimpleNamespace(
        first_fetch_at=None)))  # type: ignore[arg-type]


def _batch(number: int, size: int, pos: int, mb: float = 0.0) -> FetchedBatch:
    """A streamed batch of `size` events of one statement each, at binlog positions from `pos`, its rows holding
    `mb` MB."""
    index = [{"seq": number * 1000 + n, "kind": "data_change", "op": "u",
              "offset": {"file": "bin.000001", "pos": pos + n, "row": 0}} for n in range(size)]
    return FetchedBatch(batch_id=number, size=size, java_batch=None, schemas={}, last_offset=index[-1]["offset"],
                        last_partition=None, index=index, bytes=int(mb * (1 << 20)))


def _groups(cycle: FetchCycle, batches: list[FetchedBatch]) -> list[list[int]]:
    groups = [closed for batch in batches if (closed := cycle._add(batch, 0.0)) is not None]
    groups.append(cycle._take_group())
    return [[batch.batch_id for batch in group] for group in groups]


def test_a_runs_first_group_is_one_runner_batch_and_the_next_are_full():
    cycle = _cycle(batch_size=4, apply_batch_events=12)
    batches = [_batch(number, 4, number * 10) for number in range(8)]
    assert _groups(cycle, batches) == [[0], [1, 2, 3], [4, 5, 6], [7]]


def test_the_first_group_keeps_the_rest_of_a_statement_it_starts():
    cycle = _cycle(batch_size=4, apply_batch_events=12)
    first = _batch(0, 4, 100)
    # The next batch starts with a record of the statement that ended the first (one offset): never split.
    rest = _batch(1, 4, 200)
    rest.index[0]["offset"] = dict(first.last_offset or {})
    assert _groups(cycle, [first, rest, _batch(2, 4, 300)]) == [[0, 1], [2]]


def test_a_group_limit_below_the_batch_size_still_holds():
    cycle = _cycle(batch_size=8, apply_batch_events=4)
    assert _groups(cycle, [_batch(number, 4, number * 10) for number in range(3)]) == [[0], [1], [2]]


def test_a_group_is_bounded_by_bytes_too_and_a_larger_batch_goes_alone():
    cycle = _cycle(batch_size=4, apply_batch_events=1000, apply_batch_mb=16)
    sizes = [1, 6, 6, 6, 40, 3, 3]  # MB of rows per batch
    batches = [_batch(number, 4, number * 10, mb) for number, mb in enumerate(sizes)]
    # The first group is one runner batch; then as many as fit in 16 MB; a batch of 40 MB is a group of its own.
    assert _groups(cycle, batches) == [[0], [1, 2], [3], [4], [5, 6]]


def test_a_statement_is_never_split_even_past_the_byte_bound():
    cycle = _cycle(batch_size=4, apply_batch_events=1000, apply_batch_mb=8)
    first = _batch(0, 4, 100, 1)
    second = _batch(1, 4, 200, 6)
    rest = _batch(2, 4, 300, 6)
    rest.index[0]["offset"] = dict(second.last_offset or {})
    assert _groups(cycle, [first, second, rest, _batch(3, 4, 400, 1)]) == [[0], [1, 2], [3]]


def _in_transaction(batch: FetchedBatch, begins: bool = False, ends: bool = False) -> FetchedBatch:
    """The batch with a source transaction's BEGIN record before its events and/or its END after them."""
    offset = batch.index[0]["offset"]
    if begins:
        batch.index.insert(0, {"seq": batch.index[0]["seq"] - 1, "kind": "transaction", "status": "BEGIN",
                               "id": "t", "offset": offset})
    if ends:
        batch.index.append({"seq": batch.index[-1]["seq"] + 1, "kind": "transaction", "status": "END", "id": "t",
                            "event_count": 0, "offset": batch.last_offset})
    return batch


def test_a_runs_first_group_goes_on_to_its_transactions_commit():
    cycle = _cycle(batch_size=4, apply_batch_events=12)
    batches = [_in_transaction(_batch(0, 4, 0), begins=True), _in_transaction(_batch(1, 2, 10), ends=True),
               _batch(2, 4, 20)]
    assert _groups(cycle, batches) == [[0, 1], [2]]


def test_a_group_closes_at_its_last_source_commit_and_the_open_transaction_goes_on_in_the_next():
    cycle = _cycle(batch_size=4, apply_batch_events=12)
    batches = [_batch(0, 4, 0),  # the first group: one runner batch
               _in_transaction(_batch(1, 4, 10), begins=True, ends=True),
               _in_transaction(_batch(2, 4, 20), begins=True),  # a transaction that goes on ...
               _batch(3, 4, 30),  # ... past the group's bound (12 events) ...
               _in_transaction(_batch(4, 4, 40), ends=True)]  # ... and ends here
    # Not [1, 2, 3] then [4]: that would commit half of the transaction 2-4.
    assert _groups(cycle, batches) == [[0], [1], [2, 3, 4]]


def test_a_group_all_inside_one_transaction_goes_whole_and_says_the_transaction_is_open():
    cycle = _cycle(batch_size=4, apply_batch_events=8)
    batches = [_in_transaction(_batch(0, 4, 0), begins=True), _batch(1, 4, 10), _batch(2, 4, 20),
               _batch(3, 4, 30), _in_transaction(_batch(4, 4, 40), ends=True), _batch(5, 4, 50)]
    groups = [closed for batch in batches if (closed := cycle._add(batch, 0.0)) is not None]
    groups.append(cycle._take_group())
    # The run's first group, short by design (one runner batch), goes on to a group's bound (8) waiting for a commit.
    assert [[batch.batch_id for batch in group] for group in groups] == [[0, 1], [2, 3], [4, 5]]
    # The first two groups are parts of a transaction that spans groups; the third ends it.
    assert [group[-1].transaction_open for group in groups] == [True, True, False]
    assert [batch.transaction_open for batch in groups[2]] == [False, False]


def test_a_rest_that_cannot_take_the_next_batch_goes_whole_with_the_group():
    cycle = _cycle(batch_size=4, apply_batch_events=12)
    batches = [_batch(0, 4, 0), _in_transaction(_batch(1, 4, 10), begins=True, ends=True),
               _in_transaction(_batch(2, 4, 20), begins=True), _batch(3, 4, 30), _batch(4, 8, 40),
               _batch(5, 4, 50), _in_transaction(_batch(6, 4, 60), ends=True)]
    # Cut at batch 1's commit, the rest (2, 3) and 4 would be 16 events: [1, 2, 3] goes whole, and the transaction
    # spans the groups after it up to its END.
    groups = [closed for batch in batches if (closed := cycle._add(batch, 0.0)) is not None]
    groups.append(cycle._take_group())
    assert [[batch.batch_id for batch in group] for group in groups] == [[0], [1, 2, 3], [4, 5], [6]]
    assert [group[-1].transaction_open for group in groups] == [False, True, True, False]


def test_an_open_group_goes_on_after_the_stream_itself_waited_for_its_transaction():
    drained = [True]
    cycle = _cycle(batch_size=4, apply_batch_events=12)
    cycle.runner = SimpleNamespace(raise_if_failed=lambda: None, drained=lambda: drained[0], state="POLLING")
    cycle.connector.source_lost_timeout_seconds = 600.0
    wait = fetch_phases.OPEN_TRANSACTION_GROUP_WAIT_SECONDS
    cycle._add(_in_transaction(_batch(0, 4, 0), begins=True), 0.0)
    cycle._await_transaction_end(100.0)  # the first fetch that found nothing more of it
    assert not cycle._open_group_waited(100.0 + wait / 2)
    drained[0] = False  # the engine hands a batch over: the wait starts again
    cycle._await_transaction_end(100.0 + wait / 2)
    drained[0] = True
    assert not cycle._open_group_waited(100.0 + wait)
    assert cycle._open_group_waited(100.0 + wait * 1.5)
    # A group handed on suspends the stream while it is applied: that time is no wait for the transaction.
    cycle._take_group()
    cycle._await_transaction_end(1000.0)
    assert not cycle._open_group_waited(1000.0 + wait / 2)


def _begin_alone(number: int, pos: int) -> FetchedBatch:
    """A batch of a source transaction's BEGIN alone (Debezium handed it over before the first change of it)."""
    offset = {"file": "bin.000001", "pos": pos, "row": 0}
    index = [{"seq": number * 1000, "kind": "transaction", "status": "BEGIN", "id": "t", "offset": offset}]
    return FetchedBatch(batch_id=number, size=1, java_batch=None, schemas={}, last_offset=offset,
                        last_partition=None, index=index)


def test_a_begin_that_came_last_waits_for_its_changes_when_the_group_goes_downstream():
    cycle = _cycle(batch_size=12, apply_batch_events=12)
    cycle._add(_begin_alone(0, 0), 0.0)
    # A run's first fetch was the BEGIN alone: no group of it (a group that commits nothing).
    assert cycle._begun_tail() == 0
    cycle._add(_batch(1, 4, 10), 0.0)
    assert cycle.open_transaction and cycle._begun_tail() == 2
    cycle._add(_in_transaction(_batch(2, 2, 20), ends=True), 0.0)
    cycle._add(_begin_alone(3, 30), 0.0)
    # The group goes downstream up to the commit before the BEGIN, which stays for the next group.
    assert cycle._begun_tail() == 3
    assert [batch.batch_id for batch in cycle._take_group(cycle._begun_tail())] == [0, 1, 2]
    assert [batch.batch_id for batch in cycle.group] == [3] and cycle.group_events == 1
    # Heartbeats after the BEGIN change nothing; a BEGIN behind a change of the batch it is in cannot be cut off.
    heartbeat = _batch(4, 1, 40)
    heartbeat.index[0]["kind"] = "other"
    cycle._add(heartbeat, 0.0)
    assert cycle._begun_tail() == 0
    cycle._take_group()
    cycle._add(_in_transaction(_batch(5, 2, 50), begins=True, ends=True), 0.0)
    behind = _batch(6, 1, 60)
    behind.index.append(_begin_alone(7, 61).index[0])
    cycle._add(behind, 0.0)
    assert cycle.transaction_state == "begun" and cycle._begun_tail() == 2


def test_a_begin_alone_takes_the_changes_it_begins_past_the_groups_bounds():
    cycle = _cycle(batch_size=4, apply_batch_events=12)
    # Not [[0], [1, 2]]: a first group of the BEGIN alone would commit nothing.
    batches = [_begin_alone(0, 0), _batch(1, 4, 10), _in_transaction(_batch(2, 2, 20), ends=True), _batch(3, 4, 30)]
    assert _groups(cycle, batches) == [[0, 1, 2], [3]]
    # A group that ends with a BEGIN closes before it when the next batch passes its bounds.
    cycle = _cycle(batch_size=4, apply_batch_events=8)
    batches = [_batch(0, 4, 0), _in_transaction(_batch(1, 4, 10), begins=True, ends=True), _begin_alone(2, 20),
               _in_transaction(_batch(3, 4, 30), ends=True)]
    assert _groups(cycle, batches) == [[0], [1], [2, 3]]
    # So does the END of a transaction that came alone (Debezium gives a MySQL DDL's END with the next BEGIN).
    cycle = _cycle(batch_size=4, apply_batch_events=12)
    end = _begin_alone(0, 0)
    end.index[0]["status"] = "END"
    batches = [end, _in_transaction(_batch(1, 4, 10), begins=True, ends=True), _batch(2, 4, 20)]
    assert _groups(cycle, batches) == [[0, 1], [2]]


@pytest.mark.parametrize("kinds, before, after", [
    ([("transaction", "BEGIN"), ("data_change", "u")], "", "open"),
    ([("transaction", "BEGIN"), ("data_change", "u"), ("transaction", "END")], "", ""),
    # Debezium's MySQL connector gives a BEGIN before a DDL, and its END only with the next transaction's BEGIN.
    ([("transaction", "BEGIN"), ("schema_change", None)], "", ""),
    ([("transaction", "BEGIN")], "", "begun"),
    ([("data_change", "u")], "begun", "open"),
    ([("data_change", "r")], "begun", "begun"),  # a snapshot's read is in no transaction
    ([("data_change", "c")], "", ""),  # a change seen without its BEGIN
    ([("other", None)], "open", "open"),  # a heartbeat
])
def test_where_the_stream_stands_after_a_transactions_records(kinds, before, after):
    entries = [{"kind": kind, "status": status} if kind == "transaction" else {"kind": kind, "op": status}
               for kind, status in kinds]
    assert transaction_state_after(entries, before) == after
