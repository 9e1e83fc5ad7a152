"""Reading the destination catalog: a table's columns, keys, defaults and constraints."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg


@dataclass
class DestinationTable:
    """What the destination catalog says of a table, for diffing a new definition against it."""

    columns: dict[str, str]
    not_null: set[str]
    defaults: dict[str, str | None]
    primary_key: tuple[str, tuple[str, ...]] | None
    unique: dict[str, tuple[str, ...]]


def destination_table(cur: psycopg.Cursor, schema: str, table: str) -> DestinationTable | None:
    """The table's columns, NOT NULLs, defaults, primary key and unique constraints; None when it does not exist."""
    cur.execute(
        """SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid)
           FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
           LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
           WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
           ORDER BY a.attnum""", (schema, table))
    rows = cur.fetchall()
    if not rows:
        return None
    cur.execute(
        """SELECT con.conname, con.contype, array_agg(a.attname ORDER BY k.ord)
           FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
           JOIN LATERAL unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord) ON true
           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
           WHERE n.nspname = %s AND c.relname = %s AND con.contype IN ('p', 'u')
           GROUP BY con.conname, con.contype""", (schema, table))
    constraints = cur.fetchall()
    primary = next(((name, tuple(cols)) for name, kind, cols in constraints if kind == "p"), None)
    return DestinationTable(
        columns={name: type_name for name, type_name, _, _ in rows},
        not_null={name for name, _, not_null, _ in rows if not_null},
        defaults={name: default for name, _, _, default in rows},
        primary_key=primary,
        unique={name: tuple(cols) for name, kind, cols in constraints if kind == "u"},
    )
