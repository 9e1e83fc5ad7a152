"""What the pipeline knows of SQL Server sources: the Debezium connector's properties (their changes take the
stream's path only: no bulk snapshot, no change check)."""

from __future__ import annotations

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.sources.offset_shape import FLAG, INT, TEXT, OffsetShape

CONNECTOR_CLASS = "io.debezium.connector.sqlserver.SqlServerConnector"
OFFSET_SHAPE = OffsetShape(
    required={"commit_lsn": TEXT},
    optional={"change_lsn": TEXT, "event_serial_no": INT, "snapshot": FLAG, "snapshot_completed": FLAG,
              "transaction_id": TEXT},
    example='{"commit_lsn": "0000002c:00000a38:0003", "change_lsn": "0000002c:00000a38:0002"}',
)
DDL_EVENTS = True


def debezium_properties(connector: ConnectorConfig) -> dict[str, str]:
    """The connector properties of a SQL Server source (the engine's own are the runner's); TLS through
    `debezium:` properties."""
    return {"connector.class": CONNECTOR_CLASS, "database.names": connector.database, "database.encrypt": "false"}


def replicates(connector: ConnectorConfig, source_table: str) -> bool:
    """Every table a SQL Server connector reports may be replicated: Debezium reads only the change tables of the
    connector's database (`database.names`)."""
    return True


def source_partition(connector: str, database: str) -> dict[str, str]:
    """Debezium's source partition of the connector's offsets: one per database (`database.names` may list several),
    named by the connector's name (its topic prefix) and the database."""
    return {"server": connector, "database": database}
