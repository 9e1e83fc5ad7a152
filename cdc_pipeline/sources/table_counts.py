"""Counting a source's captured tables through a checks' DB-API cursor (SQL Server's pymssql, Oracle's
python-oracledb): the rows of each table, and for `verify` the rows per range of each table's integer key, each with
the source's own SQL."""

from __future__ import annotations

from typing import Any, Callable

from cdc_pipeline.sources.change_check import RangeCounts, count_key_ranges


def captured_tables(cur: Any, listing: str, captured: Callable[[str], bool]) -> list[tuple[str, str]]:
    """The (schema, table) pairs that the statement `listing` lists first in its rows and `captured` accepts
    (`schema.table`)."""
    cur.execute(listing)
    return [(schema, table) for schema, table, *_ in cur.fetchall() if captured(f"{schema}.{table}")]


def count_rows(cur: Any, tables: list[tuple[str, str]], count_statement: Callable[[str, str], str]) -> dict[str, int]:
    """The rows of each of `tables` (`schema.table`: rows), counted by `count_statement(schema, table)`."""
    counts = {}
    for schema, table in tables:
        cur.execute(count_statement(schema, table))
        counts[f"{schema}.{table}"] = int(cur.fetchone()[0])
    return counts


def count_rows_by_key_range(cur: Any, tables: list[tuple[str, str]], primary_keys: str,
                            integer_column: Callable[..., bool], chunk_rows: int,
                            range_statements: Callable[[str, str, str | None], Callable[[int, int], tuple[str, str]]]
                            ) -> dict[str, RangeCounts]:
    """The rows of each of `tables` per range of about `chunk_rows` rows of its key (`schema.table`: counts): a
    primary key of one column that `integer_column(*the rest of its row)` accepts; other tables as one range. The
    statement `primary_keys` gives (schema, table, column, its type's facts...) in key order; `range_statements`
    gives a table's SQL for `count_key_ranges`."""
    cur.execute(primary_keys)
    keys: dict[tuple[str, str], list[tuple[str, bool]]] = {}
    for schema, table, column, *column_type in cur.fetchall():
        keys.setdefault((schema, table), []).append((column, integer_column(*column_type)))
    counts = {}
    for schema, table in tables:
        columns = keys.get((schema, table), [])
        key = columns[0][0] if len(columns) == 1 and columns[0][1] else None
        counts[f"{schema}.{table}"] = count_key_ranges(cur, key, chunk_rows, range_statements(schema, table, key))
    return counts
