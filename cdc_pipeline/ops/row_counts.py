"""Row counts of every table a connector replicates, in its source and in the destination, side by side: the
check that nothing was lost or added on the way (run it when the connector has caught up)."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from cdc_pipeline.sink.apply import captures
from cdc_pipeline.config import ConnectorConfig, DestinationConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sources import mariadb, postgres
from cdc_pipeline.sources.mariadb import quote_mysql
from cdc_pipeline.mapping.objmap import ObjectMap, read_rules

CONNECT_TIMEOUT_SECONDS = 10
_POSTGRES_SYSTEM_SCHEMAS = ("pg_catalog", "information_schema", "pg_toast")


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
    if connector.type in ("mariadb", "mysql"):
        return _binlog_source_row_counts(connector)
    if connector.type == "postgres":
        return _postgres_source_row_counts(connector)
    raise CdcError(f"row counts of {connector.type} sources are not available: the project ships no "
                   f"{connector.type} client driver for Python", connector=connector.name)


def _binlog_source_row_counts(connector: ConnectorConfig) -> dict[str, int]:
    with mariadb.connect(connector) as conn, conn.cursor() as cur:
        tables = [table.name for table in mariadb.list_tables(cur, connector.database)]
        counts = {}
        for source_table in filter(lambda name: captures(connector, name), tables):
            database, table = connector.split_table(source_table)
            # pymysql has no identifier composition like psycopg.sql: the names are backquoted by quote_mysql.
            cur.execute("SELECT COUNT(*) FROM " + quote_mysql(database) + "." + quote_mysql(table))
            counts[source_table] = int(cur.fetchone()[0])
    return counts


def _postgres_source_row_counts(connector: ConnectorConfig) -> dict[str, int]:
    with postgres.connect(connector) as conn:
        rows = conn.execute("SELECT table_schema, table_name FROM information_schema.tables "
                            "WHERE table_type = 'BASE TABLE' AND NOT table_schema = ANY(%s)",
                            (list(_POSTGRES_SYSTEM_SCHEMAS),)).fetchall()
        return {f"{schema}.{table}": conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                    sql.Identifier(schema, table))).fetchone()[0]
                for schema, table in rows if captures(connector, f"{schema}.{table}")}
