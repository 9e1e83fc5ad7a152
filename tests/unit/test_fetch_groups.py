"""How the fetch cycle joins runner batches into groups (`FetchCycle._add`), with plain objects for the session."""

from __future__ import annotations

from types import SimpleNamespace

from cdc_pipeline.capture.runner import FetchedBatch
from cdc_pipeline.fetch_phases import FetchCycle


def _cycle(batch_size: int, apply_batch_events: int, apply_batch_mb: int = 64) -> FetchCycle:
    connector = SimpleNamespace(name="c", batch_size=batch_size, apply_batch_events=apply_batch_events,
                                apply_batch_mb=apply_batch_mb, max_seconds_per_run=300.0)
    return FetchCycle(SimpleNamespace(runner=object(), connector=connector, cycle_stats=SimpleNamespace(
        first_fetch_at=None)))  # type: ignore[arg-type]


def _batch(number: int, size: int, pos: int, mb: float = 0.0) -> FetchedBatch:
    """A streamed batch of `size` events of one statement each, at binlog positions from `pos`, its rows holding
    `mb` MB."""
    index = [{"seq": number * 1000 + n, "offset": {"file": "bin.000001", "pos": pos + n, "row": 0}}
             for n in range(size)]
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
