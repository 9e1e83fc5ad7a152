"""The Oracle source (LogMiner): the address callers use (`sources.module_for("oracle")`), with each room's public
names.

- `connector`: the Debezium connector's properties, the tables it replicates, the checks' python-oracledb connection
  into the pluggable database, quoting
- `types`: the type map (NUMBER's and TIMESTAMP's rules), its notes, column defaults
- `positions`: the offsets' shape and source partition, their stream order (`commit_scn`), the change check's
  position
- `checks`: the change check (LogMiner over the redo since the applied position), the preflight, row counts and
  verify's key-range counts
- `snapshot`: none of the bulk load's reads (Debezium's snapshot loads Oracle tables)
- `ddl`: the DDL text LogMiner logged, through the shared `ddl_text` in Oracle's dialect
"""

import cdc_pipeline.sources.stream_only as stream_only
from cdc_pipeline.sources.oracle.checks import (CHECK_REDO_BYTES, CHECK_ROWS, CHECK_SECONDS, check_changes,
                                                key_range_counts, preflight, row_counts)
from cdc_pipeline.sources.oracle.connector import (CONNECTOR_CLASS, connect, debezium_properties, is_heartbeat_table,
                                                   qualified, quote, replicates)
from cdc_pipeline.sources.oracle.ddl import DDL_EVENTS, parse_ddl
from cdc_pipeline.sources.oracle.positions import (OFFSET_SHAPE, ORDERED_WITHIN_TRANSACTION, check_position,
                                                   commit_state, committed_scn, source_partition, stream_order)
from cdc_pipeline.sources.oracle.types import (IMPLICIT_DEFAULTS, LEAVES_VALUES_OUT, ORACLE_TYPE_ALIASES, ORACLE_TYPE_MAP, TYPE_MAP_NOTES,
                                               TYPE_MAPS, always_nullable, column_type, default_expression)
# The protocol's Optional members a source read by Debezium alone lacks (the bulk load's reads, binlog and slot
# positions, row hashes), each None.
from cdc_pipeline.sources.stream_only import *  # noqa: F401,F403

# No check before a run of what the source no longer holds: the change check tells an applied position older
# than every redo log the database keeps.
lost_position = None

__all__ = [
    "CHECK_REDO_BYTES", "CHECK_ROWS", "CHECK_SECONDS", "CONNECTOR_CLASS", "DDL_EVENTS", "IMPLICIT_DEFAULTS", "LEAVES_VALUES_OUT",
    "OFFSET_SHAPE", "ORACLE_TYPE_ALIASES", "ORACLE_TYPE_MAP", "ORDERED_WITHIN_TRANSACTION", "TYPE_MAPS",
    "TYPE_MAP_NOTES", "always_nullable", "check_changes", "check_position", "column_type", "commit_state",
    "committed_scn", "connect", "debezium_properties", "default_expression", "is_heartbeat_table",
    "key_range_counts", "lost_position", "parse_ddl", "preflight", "qualified", "quote", "replicates", "row_counts",
    "source_partition", "stream_order",
    *stream_only.__all__,
]
