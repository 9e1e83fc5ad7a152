"""How a source's SQL quotes an identifier: MariaDB/MySQL in backquotes, PostgreSQL (and Oracle) in double quotes, as
the SQL standard does. For the SQL sent as text (the bulk snapshot's chunk predicates, PyMySQL's queries): psycopg's
own queries compose names with `psycopg.sql.Identifier`."""

from __future__ import annotations


def quote_mysql(identifier: str) -> str:
    """A MariaDB/MySQL identifier in backquotes, embedded backquotes doubled."""
    return "`" + identifier.replace("`", "``") + "`"


def qualified_mysql(database: str, table: str) -> str:
    return quote_mysql(database) + "." + quote_mysql(table)


def quote_double(identifier: str) -> str:
    """An identifier in double quotes, embedded double quotes doubled (PostgreSQL's, Oracle's)."""
    return '"' + identifier.replace('"', '""') + '"'


def qualified_double(schema: str, table: str) -> str:
    return quote_double(schema) + "." + quote_double(table)
