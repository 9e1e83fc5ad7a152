"""What the tests read on the destination side of a connector, whatever its source type: its tables' rows,
columns and keys, and its counts in the control schema."""

from __future__ import annotations

from typing import Any, Sequence

import psycopg
from psycopg import sql

from tests.helpers.runs import connector_stats


class DestinationChecks:
    """Reads of one test connector's destination database; `dest_dsn` and `dest_schema` say which."""

    name: str
    dest_dsn: str
    dest_schema: str

    def dest_query(self, query: str, params: Any = None) -> list[tuple]:
        with psycopg.connect(self.dest_dsn) as conn:
            return conn.execute(query, params).fetchall()

    def dest_columns(self, table: str) -> dict[str, str]:
        """Each column's type as PostgreSQL writes it (`character varying(10)`), in column order."""
        return dict(self.dest_query(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (self._regclass(table),)))

    def dest_primary_key(self, table: str) -> list[str]:
        return [name for (name,) in self.dest_query(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary",
            (self._regclass(table),))]

    def dest_table_exists(self, table: str) -> bool:
        return self.dest_query("SELECT to_regclass(%s) IS NOT NULL", (self._regclass(table),))[0][0]

    def stats(self, columns: Sequence[str]) -> dict[str, int]:
        return connector_stats(self.dest_dsn, self.name, columns)

    def _regclass(self, table: str) -> str:
        return sql.Identifier(self.dest_schema, table).as_string()
