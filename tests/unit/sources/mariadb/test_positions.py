"""MariaDB/MySQL positions that need no server: the binlog order that tells a change committed before a consistent
snapshot, and a stored offset's GTIDs against what the binlog still holds."""

from __future__ import annotations

import pytest

from cdc_pipeline.sources import mariadb
from cdc_pipeline.sources.mariadb import before_snapshot, stream_passed


@pytest.mark.parametrize("offset, expected", [
    ({"file": "mariadb-bin.000002", "pos": 99}, True),  # an earlier file
    ({"file": "mariadb-bin.000003", "pos": 4511}, True),  # its transaction starts before the snapshot
    ({"file": "mariadb-bin.000003", "pos": 4512}, False),  # the first transaction after it
    ({"file": "mariadb-bin.000004", "pos": 4}, False),
    ({"file": "mariadb-bin.000003", "pos": 10, "snapshot": "true"}, False),  # snapshot records have no order
    (None, False),
])
def test_changes_committed_before_a_consistent_snapshot(offset, expected):
    assert before_snapshot(offset, {"file": "mariadb-bin.000003", "pos": "4512"}) is expected


@pytest.mark.parametrize("offset, expected", [
    ({"file": "mariadb-bin.000003", "pos": 4511}, False),
    ({"file": "mariadb-bin.000003", "pos": 4512}, True),  # the first transaction after the snapshot
    ({"file": "mariadb-bin.000004", "pos": 4}, True),
    ({"file": "mariadb-bin.000004", "pos": 4, "snapshot": "true"}, False),
    (None, False),
])
def test_a_snapshot_position_is_passed_at_the_first_transaction_after_it(offset, expected):
    assert stream_passed(offset, {"file": "mariadb-bin.000003", "pos": "4512"}) is expected


def test_mariadb_gtid_lists_are_read_per_domain() -> None:
    """A stored offset's GTIDs against the oldest binlog's Gtid_list (`mariadb.lost_position`): the highest sequence
    number of each replication domain."""
    assert mariadb.mariadb_gtid_domains("[0-1-57,1-2-9]") == {0: 57, 1: 9}
    assert mariadb.mariadb_gtid_domains("0-1-57,0-2-60") == {0: 60}
    assert mariadb.mariadb_gtid_domains("[]") == {}


@pytest.mark.parametrize(("purged", "read", "missing"), [
    ("", "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5", ""),
    ("3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5", "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-9", ""),
    ("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:8", "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-3,\naa:1",
     "3e11fa47-71ca-11e1-9e33-c80aa9429562:4-5,3e11fa47-71ca-11e1-9e33-c80aa9429562:8-8"),
    ("aa:1-4,bb:1-2", "aa:1-2:3-4", "bb:1-2"),
    ("aa:tag1:1-3", "aa:1-3", "aa:tag1:1-3"),
])
def test_mysql_gtids_purged_beyond_what_the_connector_read_are_named(purged: str, read: str, missing: str) -> None:
    assert mariadb.mysql_gtids_missing(purged, read) == missing


def test_a_reader_without_its_binlog_file_yet_has_not_reached_a_position():
    # A reader started from a GTID position names no file until the server's first rotate event.
    assert not mariadb.position_reached({"file": "", "pos": 900}, {"file": "mariadb-bin.000001", "pos": 4})
    assert mariadb.position_reached({"file": "mariadb-bin.000002", "pos": 4}, {"file": "mariadb-bin.000001", "pos": 9})
