"""A source table's secondary (non-unique) index as the source's catalog describes it, for the bulk load to build
on the destination table after its rows (`sink.deferred_keys.plan_source_indexes`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IndexColumn:
    """A column of an index in its order: `descending` as the source sorts it; `nulls_first` None when NULLs sort
    where PostgreSQL puts them by default for that direction (last ascending, first descending)."""

    name: str
    descending: bool = False
    nulls_first: bool | None = None


@dataclass(frozen=True)
class SourceIndex:
    """A secondary index of the source table `table` (its name in its database or schema): its access method on
    PostgreSQL (`btree`, `hash`, `gin`, `gist`, `brin`) and its columns; `skipped` says why PostgreSQL cannot have
    it as an index of plain columns (None: it can)."""

    table: str
    name: str
    method: str
    columns: tuple[IndexColumn, ...]
    skipped: str | None = None
