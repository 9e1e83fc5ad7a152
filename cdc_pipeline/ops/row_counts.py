"""Row counts of every table a connector replicates, in its source and in the destination, side by side: the
check that nothing was lost or added on the way (run it when the connector has caught up)."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from cdc_pipeline.config import ConnectorConfig, DestinationConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline import sources
from cdc_pipeline.mapping.objmap import ObjectMap
from cdc_pipeline.mapping.rule_store import read_rules

CONNECT_TIMEOUT_SECONDS = 10


@dataclass(frozen=True)
class TableCount:
    """One replicated table's rows in the source and in the destination (None: the destination table is missing)."""

    source_table: str
    destination_table: str
    source_rows: int
    destination_rows: int | None

    @property
    def matches(self) -> bool:
        return self.source_rows == self.destination_rows


def compare_row_counts(connector: ConnectorConfig, destination: DestinationConfig) -> list[TableCount]:
    """Counts the rows of each source table the connector captures and of its destination table."""
    source_counts = _source_row_counts(connector)
    counts = []
    with destination.connect(connector.name, connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
        # The applier's naming: the table rules first, else the default rule.
        object_map = ObjectMap(connector, read_rules(conn, destination.control_schema, connector.name)
                               if _exists(conn, destination.control_schema, "objmap") else [])
        for source_table, rows in sorted(source_counts.items()):
            schema, table = object_map.table_name(source_table)
            dest_rows = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                sql.Identifier(schema, table))).fetchone()[0] if _exists(conn, schema, table) else None
            counts.append(TableCount(source_table, f"{schema}.{table}", rows, dest_rows))
    return counts


def _exists(conn: psycopg.Connection, schema: str, table: str) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                        (sql.Identifier(schema, table).as_string(conn),)).fetchone()[0]


def _source_row_counts(connector: ConnectorConfig) -> dict[str, int]:
    source = sources.module_for(connector.type)
    if source.row_counts is None:
        raise CdcError(f"row counts of {connector.type} sources are not available: the project ships no "
                       f"{connector.type} client driver for Python", connector=connector.name)
    return source.row_counts(connector, lambda table: sources.captures(connector, table))
