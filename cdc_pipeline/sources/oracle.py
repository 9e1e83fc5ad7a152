"""What the pipeline knows of Oracle sources: the Debezium connector's properties (their changes take the stream's
path only: no bulk snapshot, no change check)."""

from __future__ import annotations

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.sources.offset_shape import FLAG, INT, TEXT, OffsetShape

CONNECTOR_CLASS = "io.debezium.connector.oracle.OracleConnector"
OFFSET_SHAPE = OffsetShape(
    required={"scn": TEXT + INT},
    optional={"commit_scn": TEXT, "lcr_position": TEXT, "snapshot_scn": TEXT, "snapshot": FLAG,
              "snapshot_completed": FLAG, "transaction_id": TEXT},
    example='{"scn": "2891044"}',
)
DDL_EVENTS = True


def debezium_properties(connector: ConnectorConfig) -> dict[str, str]:
    """The connector properties of an Oracle source (the engine's own are the runner's)."""
    return {"connector.class": CONNECTOR_CLASS, "database.dbname": connector.database}


def replicates(connector: ConnectorConfig, source_table: str) -> bool:
    """Every table an Oracle connector reports may be replicated: the connector's `tables` list is the only filter."""
    return True


def source_partition(connector: str, database: str) -> dict[str, str]:
    """Debezium's source partition of the connector's offsets: the connector's name (its topic prefix)."""
    return {"server": connector}
