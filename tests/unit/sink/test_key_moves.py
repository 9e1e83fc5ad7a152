"""Unit tests for cdc_pipeline.sink.key_moves: a key update is a delete and a create of the same offset."""

from __future__ import annotations

from cdc_pipeline.decode.events import DATA_CHANGE, EventRef
from cdc_pipeline.sink.key_moves import key_update_pairs


def _ref(seq: int, op: str, offset: dict | None) -> EventRef:
    return EventRef(seq, DATA_CHANGE, "inventory.items", "schema-1", op, {}, offset=offset)


def test_a_key_update_is_a_delete_then_a_create_with_its_offset() -> None:
    refs = [_ref(1, "u", {"pos": 1}), _ref(2, "d", {"pos": 2}), _ref(3, "c", {"pos": 2}), _ref(4, "c", {"pos": 3}),
            _ref(5, "d", {"pos": 4}), _ref(6, "c", {"pos": 5}), _ref(7, "c", {"pos": 6}), _ref(8, "d", {"pos": 6})]
    assert key_update_pairs(refs) == {3: 2}


def test_changes_without_an_offset_are_never_a_key_update() -> None:
    assert key_update_pairs([_ref(1, "d", None), _ref(2, "c", None)]) == {}
