"""How far behind its source a connector is, measured without a JVM (what the change sensor records on the
connector's asset at every check, a run launched or not):
- MariaDB/MySQL: the binlog bytes and events past the connector's position (the later of the position its last
  idle run or change check read up to, `connector_state.source_checked`, and its last applied event's offset);
  events are counted up to `mariadb.LAG_EVENTS_LIMIT`.
- PostgreSQL: `pg_wal_lsn_diff` of the current WAL position and the replication slot's confirmed position.
- SQL Server and Oracle: not measured.
"""

from __future__ import annotations

from cdc_pipeline import control, sources
from cdc_pipeline.config import ConnectorConfig, DestinationConfig
from cdc_pipeline.sources.change_check import SourceLag


def measure(connector: ConnectorConfig, destination: DestinationConfig) -> SourceLag | None:
    """The connector's lag behind its source now, or None when its source type has no measure or the connector
    has no position yet (it never ran, or its slot does not exist)."""
    source = sources.module_for(connector.type)
    if source.replication_lag is None:
        return None
    schema, name = destination.control_schema, connector.name
    with destination.connect(name) as conn:
        control.ensure_control_schema(conn, schema)
        state = control.read_state(conn, schema, name)
        applied = control.read_applied_offset(conn, schema, name) or {}
    return source.replication_lag(connector, (state or {}).get("source_checked"), applied)
