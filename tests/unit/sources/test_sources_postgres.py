"""PostgreSQL source helpers of the bulk snapshot that need no server: chunk predicates, type modifiers, and which
streamed transactions a statement snapshot already saw."""

from __future__ import annotations

import pytest

from cdc_pipeline.sources import before_snapshot, stream_passed, postgres


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


def test_chunk_predicates_are_row_comparisons_with_quoted_literals() -> None:
    assert postgres.chunk_predicate(["id"], ["5"], ["10"]) == """"id" >= E'5' AND "id" < E'10'"""
    assert postgres.chunk_predicate(["re\"gion", "n"], None, ["it's", "3"]) == \
        """ROW("re""gion", "n") < ROW(E'it''s', E'3')"""
    assert postgres.chunk_predicate(["id"], None, None) == "true"


def test_parts_of_a_table_without_a_key_are_block_ranges_of_its_heap() -> None:
    assert postgres.ctid_predicate(None, [40]) == "ctid < '(40,0)'::tid"
    assert postgres.ctid_predicate([40], [80]) == "ctid >= '(40,0)'::tid AND ctid < '(80,0)'::tid"
    assert postgres.ctid_predicate([80], None) == "ctid >= '(80,0)'::tid"
    assert postgres.import_snapshot("00000003-0000001B-1") == (
        "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY; SET TRANSACTION SNAPSHOT E'00000003-0000001B-1'")


def test_chunk_literals_read_the_same_whatever_standard_conforming_strings() -> None:
    assert postgres.literal("k\\1100") == "E'k\\\\1100'"


@pytest.mark.parametrize("type_name, typmod, modifiers", [
    ("varchar", 24, (20, None)), ("numeric", (12 << 16) + 2 + 4, (12, 2)), ("timestamp", 3, (None, 3)),
    ("bit", 5, (5, None)), ("int4", -1, (None, None)), ("timestamptz", -1, (None, None)),
])
def test_array_element_modifiers_are_read_from_the_type_modifier(type_name, typmod, modifiers) -> None:
    assert postgres._modifiers(type_name, typmod) == modifiers


@pytest.mark.parametrize("tx_id, passed", [
    (99, False), (100, False), (103, False),  # seen, or running when it was taken: may commit before seen ones
    (104, True), (150, True),  # began after it: commits after every transaction it saw
])
def test_a_snapshot_is_passed_by_a_transaction_that_began_after_it(tx_id: int, passed: bool) -> None:
    assert stream_passed({"lsn": 1, "txId": tx_id}, {"snapshot": "100:104:100,103"}) is passed
    epoch = 3 << 32
    assert stream_passed({"txId": tx_id}, {"snapshot": f"{epoch + 100}:{epoch + 104}:{epoch + 100}"}) is passed
    assert not stream_passed({"lsn": 1, "txId": tx_id, "snapshot": True}, {"snapshot": "100:104:"})
