"""The MariaDB source helpers of the bulk snapshot that need no server: literals and chunk predicates (SQL text
Spark sends as it is), and the binlog order that tells a change committed before a consistent snapshot."""

from __future__ import annotations

import pytest

from cdc_pipeline.sources.mariadb import before_snapshot, chunk_predicate, key_value, literal, quote_mysql


def test_literals_of_every_key_kind():
    assert literal(42) == "42"
    assert literal("it's a \\ path") == "'it''s a \\\\ path'"
    assert literal(key_value(b"\x00\xff")) == "X'00ff'"
    assert literal(key_value(__import__("decimal").Decimal("1.50"))) == "'1.50'"
    assert quote_mysql("we`ird") == "`we``ird`"


def test_chunk_predicates_cover_a_composite_key_half_open():
    assert chunk_predicate(["a"], None, None) == "1 = 1"
    assert chunk_predicate(["a"], [5], [10]) == "((`a` >= 5)) AND NOT ((`a` >= 10))"
    assert chunk_predicate(["a", "b"], [1, "x"], None) == "((`a` > 1) OR (`a` = 1 AND `b` >= 'x'))"


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
