"""Where a connector's snapshot ends in the records the runner hands over: by the source block's `snapshot` marker,
else by the offset; a batch that starts with a streamed record ends the schema snapshot."""

from __future__ import annotations

import pytest

from cdc_pipeline.capture.runner import FetchedBatch, in_snapshot


@pytest.mark.parametrize("entry, expected", [
    ({"source": {"snapshot": "true"}, "offset": {"snapshot": True}}, True),
    ({"source": {"snapshot": "first"}}, True),
    ({"source": {"snapshot": "last"}, "offset": {"snapshot": "last"}}, True),
    ({"source": {"snapshot": "last_in_data_collection"}}, True),
    ({"source": {"snapshot": "false"}, "offset": {"file": "b.000001", "pos": 4}}, False),
    ({"source": {"snapshot": "incremental"}}, False),  # an incremental snapshot's reads come with the stream
    # No source block (a heartbeat, a transaction marker): the offset says.
    ({"offset": {"file": "b.000001", "pos": 4, "snapshot": True}}, True),
    ({"offset": {"snapshot": "INITIAL", "snapshot_completed": True}}, False),
    ({"offset": {"lsn": 123}}, False),
    ({}, False),
])
def test_a_record_is_the_snapshots_by_its_marker_else_its_offset(entry, expected):
    assert in_snapshot(entry) is expected


def _batch(*entries: dict) -> FetchedBatch:
    return FetchedBatch(batch_id=1, size=len(entries), java_batch=None, schemas={}, last_offset=None,
                        last_partition=None, index=list(entries))


def test_a_batch_is_streamed_when_its_first_record_is_not_the_snapshots():
    assert _batch({"source": {"snapshot": "false"}}, {"source": {"snapshot": "false"}}).streamed
    assert not _batch({"source": {"snapshot": "true"}}).streamed
    assert not _batch().streamed
