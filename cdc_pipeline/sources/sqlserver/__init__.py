"""The SQL Server source: the address callers use (`sources.module_for("sqlserver")`), with each room's public names.

- `connector`: the Debezium connector's properties, the tables it replicates, the checks' pymssql connection, quoting
- `types`: the type map (mssql-jdbc's type names), its notes, column defaults
- `positions`: the offsets' shape and source partition, their stream order, the change check's position, lost
  positions (the change tables' cleanup)
- `checks`: the change check, the preflight, row counts and verify's key-range counts
- `snapshot`: none of the bulk load's reads (Debezium's snapshot loads SQL Server tables)
- `ddl`: schema changes come without DDL text
"""

import cdc_pipeline.sources.stream_only as stream_only
from cdc_pipeline.sources.sqlserver.checks import check_changes, key_range_counts, preflight, row_counts
from cdc_pipeline.sources.sqlserver.connector import (CONNECTOR_CLASS, connect, debezium_properties, is_heartbeat_table,
                                                      qualified, quote, replicates)
from cdc_pipeline.sources.sqlserver.ddl import DDL_EVENTS, parse_ddl
from cdc_pipeline.sources.sqlserver.positions import (OFFSET_SHAPE, ORDERED_WITHIN_TRANSACTION, check_position,
                                                      lost_position, lsn_bytes, lsn_text, source_partition,
                                                      stream_order)
from cdc_pipeline.sources.sqlserver.types import (IMPLICIT_DEFAULTS, LEAVES_VALUES_OUT, SQLSERVER_TYPE_MAP, TYPE_MAP_NOTES, TYPE_MAPS,
                                                  always_nullable, column_type, default_expression)
# The protocol's Optional members a source read by Debezium alone lacks (the bulk load's reads, binlog and slot
# positions, row hashes), each None.
from cdc_pipeline.sources.stream_only import *  # noqa: F401,F403

__all__ = [
    "CONNECTOR_CLASS", "DDL_EVENTS", "IMPLICIT_DEFAULTS", "LEAVES_VALUES_OUT", "OFFSET_SHAPE", "ORDERED_WITHIN_TRANSACTION",
    "SQLSERVER_TYPE_MAP", "TYPE_MAPS", "TYPE_MAP_NOTES", "always_nullable", "check_changes", "check_position",
    "column_type", "connect", "debezium_properties", "default_expression", "is_heartbeat_table", "key_range_counts",
    "lost_position", "lsn_bytes", "lsn_text", "parse_ddl", "preflight", "qualified", "quote", "replicates",
    "row_counts", "source_partition", "stream_order",
    *stream_only.__all__,
]
