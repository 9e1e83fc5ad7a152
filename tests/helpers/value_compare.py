"""Value-by-value comparison of a source table with its destination copy, for the all-types round trips."""

from __future__ import annotations

from typing import Any, Callable

Normaliser = Callable[[Any, Any], tuple[Any, Any]]


def assert_rows_equal(source: list[dict[str, Any]], dest: list[dict[str, Any]], key: str,
                      normaliser_of: Callable[[str], Normaliser]) -> int:
    """Compares every value of every row (rows in `key` order on both sides), each column through its normaliser
    (which returns the expected and the actual value); returns how many values were compared."""
    assert source, "the source table is empty"
    assert [row[key] for row in dest] == [row[key] for row in source]
    differences = []
    for source_row, dest_row in zip(source, dest):
        assert set(dest_row) == set(source_row)
        for name, source_value in source_row.items():
            expected, actual = normaliser_of(name)(source_value, dest_row[name])
            if expected != actual:
                differences.append(f"{key} {source_row[key]} {name}: source {_short(source_value)} -> "
                                   f"expected {_short(expected)}, destination {_short(actual)}")
    assert not differences, "\n".join(differences)
    return sum(len(row) for row in source)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else f"{text[:100]}... ({len(text)} characters)"
