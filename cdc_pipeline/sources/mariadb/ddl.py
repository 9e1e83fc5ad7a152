"""A MariaDB/MySQL source's DDL: the schema snapshot and the stream carry each table's DDL text, read by the shared
parser (`sources.ddl_text`, `parse_ddl`); the database a streamed DROP DATABASE drops (`dropped_database`); whether a
binlog statement names one of the connector's databases; a table's CREATE TABLE as the server writes it."""

from __future__ import annotations

import re
from typing import Any, Sequence

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.sources.ddl_text import Statement, parse_statements
from cdc_pipeline.sources.mariadb.connector import qualified

DDL_EVENTS = True  # the schema snapshot and the stream carry each table's DDL


def names_database(connector: ConnectorConfig, statement: str) -> bool:
    """Whether a statement of the binlog (`use `db`; ALTER TABLE ...`) may concern one of the connector's databases:
    it holds the name of its `database`, or a word or quoted name `databases` matches."""
    if connector.database is not None:
        return connector.database in statement
    return any(connector.captures_database(quoted.replace("``", "`") or word)
               for quoted, word in _STATEMENT_NAMES.findall(statement))


_STATEMENT_NAMES = re.compile(r"`((?:[^`]|``)+)`|([\w$]+)")


def create_statements(cur: Any, database: str, tables: Sequence[str]) -> list[str]:
    """Each table's CREATE TABLE as the server writes it (`SHOW CREATE TABLE`), for a parse as the stream's DDL."""
    statements = []
    for table in tables:
        cur.execute("SHOW CREATE TABLE " + qualified(database, table))
        statements.append(str(cur.fetchone()[1]))
    return statements


def parse_ddl(ddl_text: str) -> list[Statement]:
    """What each statement of a MariaDB/MySQL DDL text does (`ddl_text.parse_statements`)."""
    return parse_statements(ddl_text)


# A MariaDB/MySQL statement that drops a whole database, whose schema-change event names no table.
_DROP_DATABASE = re.compile(r"\s*DROP\s+(?:DATABASE|SCHEMA)\s+(?:IF\s+EXISTS\s+)?(?:`((?:[^`]|``)+)`|([\w$]+))\s*;?\s*",
                            re.IGNORECASE)


def dropped_database(payload: dict[str, Any]) -> str | None:
    """The database a streamed MariaDB/MySQL schema change drops (`DROP DATABASE`), or None. Debezium's event of it
    carries no table changes, and its snapshot's `DROP DATABASE IF EXISTS` (rebuilding its own history) is not one."""
    if str((payload.get("source") or {}).get("snapshot") or "false").lower() != "false":
        return None
    match = _DROP_DATABASE.fullmatch(str(payload.get("ddl") or ""))
    if match is None:
        return None
    return match.group(1).replace("``", "`") if match.group(1) is not None else match.group(2)
