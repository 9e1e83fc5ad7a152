"""SQL Server's schema changes: how its table definitions come. A new capture instance gives a schema change with
the table's whole definition (Debezium's `tableChanges`), and no DDL text."""

from __future__ import annotations

from cdc_pipeline.sources.ddl_text import Statement

DDL_EVENTS = True  # a new capture instance gives a schema change: no DDL text, the table's whole definition


def parse_ddl(ddl_text: str) -> list[Statement]:
    """Nothing: SQL Server's schema changes carry no DDL text (Debezium's `SqlServerSchemaChangeEventEmitter` writes
    "N/A"). Columns added, dropped and retyped come from comparing `tableChanges` with the destination; a renamed
    column cannot be told from one dropped and another added."""
    return []
