"""PostgreSQL positions that need no server: which streamed transactions a statement snapshot already saw, and
which began after it."""

from __future__ import annotations

import logging
import socket

import pytest

from cdc_pipeline.config import ConnectorConfig

from cdc_pipeline.sources import before_snapshot, postgres, stream_passed


@pytest.mark.parametrize("tx_id, seen", [
    (99, True),      # before xmin: committed before the snapshot
    (100, False),    # running when it was taken (in xip)
    (101, True),     # between xmin and xmax, not running: committed
    (103, False),    # running
    (104, False),    # at xmax: began after it
    (150, False),
])
def test_a_change_is_skipped_exactly_when_its_transaction_is_visible_in_the_snapshot(tx_id: int, seen: bool) -> None:
    position = {"snapshot": "100:104:100,103"}
    assert before_snapshot({"lsn": 1, "txId": tx_id}, position) is seen
    assert postgres.before_snapshot({"lsn": 1, "txId": tx_id}, position) is seen


def test_a_32_bit_transaction_id_takes_the_epoch_of_the_snapshot() -> None:
    epoch = 3 << 32
    position = {"snapshot": f"{epoch + 10}:{epoch + 20}:{epoch + 15}"}
    assert before_snapshot({"txId": 12}, position)
    assert not before_snapshot({"txId": 15}, position)
    assert not before_snapshot({"txId": 25}, position)
    # Just below the epoch's start: the previous epoch, long committed.
    assert before_snapshot({"txId": (1 << 32) - 5}, {"snapshot": f"{epoch + 2}:{epoch + 3}:"})


@pytest.mark.parametrize("offset", [None, {"lsn": 5}, {"lsn": 5, "txId": 1, "snapshot": True}])
def test_offsets_without_a_streamed_transaction_are_never_skipped(offset) -> None:
    assert not before_snapshot(offset, {"snapshot": "100:104:"})


def test_a_binlog_position_still_goes_to_the_mariadb_rule() -> None:
    assert before_snapshot({"file": "bin.000001", "pos": 4}, {"file": "bin.000002", "pos": 4})


@pytest.mark.parametrize("tx_id, passed", [
    (99, False), (100, False), (103, False),  # seen, or running when it was taken: may commit before seen ones
    (104, True), (150, True),  # began after it: commits after every transaction it saw
])
def test_a_snapshot_is_passed_by_a_transaction_that_began_after_it(tx_id: int, passed: bool) -> None:
    assert stream_passed({"lsn": 1, "txId": tx_id}, {"snapshot": "100:104:100,103"}) is passed
    epoch = 3 << 32
    assert stream_passed({"txId": tx_id}, {"snapshot": f"{epoch + 100}:{epoch + 104}:{epoch + 100}"}) is passed
    assert not stream_passed({"lsn": 1, "txId": tx_id, "snapshot": True}, {"snapshot": "100:104:"})


def test_a_wal_end_that_cannot_be_marked_is_none_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    connector = ConnectorConfig(name="shop", type="postgres", hostname="127.0.0.1", port=closed_port, user="u",
                                password="p", database="shop")
    with caplog.at_level(logging.WARNING, logger="cdc_pipeline.sources"):
        assert postgres.mark_wal_end(connector) is None
    assert "shop: cannot mark the end of the source's WAL" in caplog.text
