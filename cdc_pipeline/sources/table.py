"""What every source type's catalog reader returns for a table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SourceTable:
    """A source table as its catalog estimates it: `name` is `database.table` (MariaDB/MySQL) or `schema.table`
    (PostgreSQL); the estimates plan the bulk snapshot's chunks."""

    name: str
    estimated_rows: int
    average_row_bytes: int


@dataclass(frozen=True)
class ColumnText:
    """How `cdc-pipeline verify` compares one column: `source` renders it in the source's SQL as its COPY text field
    (`\\N` for NULL), `destination` renders the destination column in PostgreSQL as the same text before COPY's
    escapes (a psycopg SQL composable; NULL stays NULL); `how` names the rendering. A column no rendering is known
    for on both sides has neither, and `left_out` says why."""

    source: str | None = None
    destination: Any = None
    how: str = "as text"
    left_out: str | None = None
