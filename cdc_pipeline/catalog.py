"""The destination catalog as every stage reads it: a table's columns, their types, keys, defaults and constraints
(the converter compares definitions with it, the mapping renames against it, the applier plans by it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import psycopg


@dataclass(frozen=True)
class ColumnType:
    """A destination column's type: its name, the base type behind any domains, and that base type's category.

    `category` is `pg_type.typcategory` of the base type ('N' numeric, 'S' string, 'E' enum, 'U' user,
    'D' datetime, 'B' boolean, 'A' array, 'T' timespan, ...). `builtin` says whether the base type is one of
    PostgreSQL's own (schema pg_catalog); `user_defined` whether the column's own type is not (a domain, an
    enum, a composite or an extension type such as citext): a type someone chose, never one the pipeline created.
    """

    name: str
    base: str
    category: str
    builtin: bool
    user_defined: bool


@dataclass
class DestinationTable:
    """What the destination catalog says of a table, for diffing a new definition against it."""

    columns: dict[str, str]
    not_null: set[str]
    defaults: dict[str, str | None]
    primary_key: tuple[str, tuple[str, ...]] | None
    unique: dict[str, tuple[str, ...]]
    types: dict[str, ColumnType] = field(default_factory=dict)

    @property
    def user_typed(self) -> set[str]:
        """The columns whose type is not one of PostgreSQL's own: domains, enums, composites, extension types."""
        return {name for name, column_type in self.types.items() if column_type.user_defined}


def destination_table(cur: psycopg.Cursor, schema: str, table: str) -> DestinationTable | None:
    """The table's columns and their types, NOT NULLs, defaults, primary key and unique constraints; None when
    it does not exist. Domains are resolved to their base type, through domains over domains."""
    return destination_tables(cur, [(schema, table)]).get((schema, table))


def destination_tables(cur: psycopg.Cursor, names: Iterable[tuple[str, str]]
                       ) -> dict[tuple[str, str], DestinationTable]:
    """`destination_table` of each (schema, table) that exists, read with two queries whatever their number."""
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return {}
    schemas, tables = [schema for schema, _ in wanted], [table for _, table in wanted]
    cur.execute(
        """SELECT n.nspname, c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                  pg_get_expr(d.adbin, d.adrelid), t.typnamespace <> 'pg_catalog'::regnamespace,
                  format_type(base.oid, base.typmod), bt.typcategory, bt.typnamespace = 'pg_catalog'::regnamespace
           FROM unnest(%s::text[], %s::text[]) AS w(schema_name, table_name)
           JOIN pg_namespace n ON n.nspname = w.schema_name
           JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.table_name
           JOIN pg_attribute a ON a.attrelid = c.oid
           JOIN pg_type t ON t.oid = a.atttypid
           LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
           CROSS JOIN LATERAL (
               WITH RECURSIVE chain(oid, typmod, depth) AS (
                   SELECT a.atttypid, a.atttypmod, 0
                   UNION ALL
                   SELECT dt.typbasetype, dt.typtypmod, chain.depth + 1
                   FROM chain JOIN pg_type dt ON dt.oid = chain.oid WHERE dt.typtype = 'd')
               SELECT oid, typmod FROM chain ORDER BY depth DESC LIMIT 1) AS base
           JOIN pg_type bt ON bt.oid = base.oid
           WHERE c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
           ORDER BY n.nspname, c.relname, a.attnum""", (schemas, tables))
    columns: dict[tuple[str, str], list[tuple]] = {}
    for row in cur.fetchall():
        columns.setdefault((row[0], row[1]), []).append(row[2:])
    if not columns:
        return {}
    cur.execute(
        """SELECT n.nspname, c.relname, con.conname, con.contype, array_agg(a.attname ORDER BY k.ord)
           FROM unnest(%s::text[], %s::text[]) AS w(schema_name, table_name)
           JOIN pg_namespace n ON n.nspname = w.schema_name
           JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.table_name
           JOIN pg_constraint con ON con.conrelid = c.oid
           JOIN LATERAL unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord) ON true
           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
           WHERE con.contype IN ('p', 'u')
           GROUP BY n.nspname, c.relname, con.conname, con.contype""",
        ([schema for schema, _ in columns], [table for _, table in columns]))
    constraints: dict[tuple[str, str], list[tuple]] = {}
    for row in cur.fetchall():
        constraints.setdefault((row[0], row[1]), []).append(row[2:])
    return {name: _table_of(rows, constraints.get(name, [])) for name, rows in columns.items()}


def _table_of(rows: list[tuple], constraints: list[tuple]) -> DestinationTable:
    primary = next(((name, tuple(cols)) for name, kind, cols in constraints if kind == "p"), None)
    return DestinationTable(
        columns={row[0]: row[1] for row in rows},
        not_null={row[0] for row in rows if row[2]},
        defaults={row[0]: row[3] for row in rows},
        primary_key=primary,
        unique={name: tuple(cols) for name, kind, cols in constraints if kind == "u"},
        types={name: ColumnType(name=type_name, base=base, category=category, builtin=builtin, user_defined=user)
               for name, type_name, _, _, user, base, category, builtin in rows},
    )


class CatalogCache:
    """The destination tables one run has read from the catalog, so that a group touching hundreds of tables reads
    each once per run, not once per group. A table is forgotten when a schema change or a transaction that may
    have changed it ends (`forget`); a missing table is never kept (a later step may create it)."""

    def __init__(self) -> None:
        self._tables: dict[tuple[str, str], DestinationTable] = {}

    def table(self, cur: psycopg.Cursor, schema: str, table: str) -> DestinationTable | None:
        """`destination_table`, read once until forgotten."""
        known = self._tables.get((schema, table))
        if known is None:
            known = destination_table(cur, schema, table)
            if known is not None:
                self._tables[(schema, table)] = known
        return known

    def prefetch(self, cur: psycopg.Cursor, names: Iterable[tuple[str, str]]) -> None:
        """Reads the tables not known yet, all with one catalog read."""
        missing = [name for name in names if name not in self._tables]
        if missing:
            self._tables.update(destination_tables(cur, missing))

    def forget(self, schema: str | None = None, table: str | None = None) -> None:
        """Forgets one table, or every table when none is named."""
        if schema is None or table is None:
            self._tables.clear()
        else:
            self._tables.pop((schema, table), None)
