"""What every source type's catalog reader returns for a table."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceTable:
    """A source table as its catalog estimates it: `name` is `database.table` (MariaDB/MySQL) or `schema.table`
    (PostgreSQL); the estimates plan the bulk snapshot's chunks."""

    name: str
    estimated_rows: int
    average_row_bytes: int
