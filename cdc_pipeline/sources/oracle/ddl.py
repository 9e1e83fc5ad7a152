"""Oracle's schema changes: the DDL text LogMiner logged, read through the shared DDL text parser in Oracle's
dialect (`ddl_text`, `dialect=ORACLE`) for what Debezium's `tableChanges` does not say: renames and unique keys."""

from __future__ import annotations

from cdc_pipeline.sources.ddl_text import ORACLE, Statement, parse_statements

DDL_EVENTS = True  # LogMiner gives the DDL text Oracle logged and Debezium's parse of it


def parse_ddl(ddl_text: str) -> list[Statement]:
    """What Oracle's DDL text (as LogMiner logged it) does: column renames (`ALTER TABLE t RENAME COLUMN a TO b`), table
    renames (`ALTER TABLE t RENAME TO u`, `RENAME t TO u`) and unique keys, in Oracle's names (quoted "as written",
    unquoted upper case). Debezium's `tableChanges` has the new definition but not which column a rename came from."""
    return parse_statements(ddl_text, dialect=ORACLE)
