"""A PostgreSQL source's DDL: it emits none. Destination tables are made from the value schemas (and, for the bulk
snapshot, from the source catalog as a value schema would describe it: `schema_infer.field_specs_of`); the heartbeat
table Debezium's heartbeat writes is the source's own table, created here."""

from __future__ import annotations

from psycopg import sql

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sources.ddl_text import Statement
from cdc_pipeline.sources.postgres.connector import connect, qualified

# PostgreSQL emits no DDL events: destination tables are made from the value schemas (and, for the bulk snapshot,
# from the source catalog as a value schema would describe it: `schema_infer.field_specs_of`).
DDL_EVENTS = False


def ensure_heartbeat_table(connector: ConnectorConfig) -> None:
    """Creates the heartbeat table (one row per connector's slot) on the source; does nothing if it exists. A
    capture user without CREATE on its schema needs it created by the DBA, as docs/triggers.md shows."""
    import psycopg

    schema, table = connector.split_table(connector.heartbeat_table)
    with connect(connector) as source:
        if source.execute("SELECT to_regclass(%s)", (qualified(schema, table),)).fetchone()[0] is not None:
            return
        try:
            source.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (slot_name text PRIMARY KEY, "
                                   "beat_at timestamptz NOT NULL)").format(sql.Identifier(schema, table)))
        except psycopg.Error as exc:
            raise CdcError(f"cannot create the heartbeat table {connector.heartbeat_table} on the source: "
                           f"{str(exc).strip().splitlines()[0]}; create it (docs/triggers.md) or name another in "
                           "heartbeat_table", connector=connector.name) from None


# Before the connector's engine starts: the heartbeat table Debezium's heartbeat writes.
prepare_capture = ensure_heartbeat_table


def is_heartbeat_table(connector: ConnectorConfig, source_table: str) -> bool:
    """Whether a source table is the connector's heartbeat table, whose writes are no data."""
    return source_table == connector.heartbeat_table


def parse_ddl(ddl_text: str) -> list[Statement]:
    """Nothing: PostgreSQL emits no DDL text (`DDL_EVENTS`)."""
    return []
