"""PostgreSQL sources: what the pipeline knows of them, room by room. Callers reach it through `sources.module_for`,
which gives it as a `protocol.Source`; this module re-exports its rooms' names.

- `connector`: the Debezium connector's properties (pgoutput, the slot and publication), connecting (TLS, timeouts,
  the JDBC URL);
- `types`: the type map and how a column reads by it;
- `positions`: the offsets' shape, transaction snapshots against the stream, the WAL's end, lost slots;
- `checks`: the slot's state, the change check (the slot peeked), lag, row counts, the preflight check, verify's SQL;
- `snapshot`: the bulk load's reads;
- `ddl`: no DDL text; the heartbeat table."""

from __future__ import annotations

from cdc_pipeline.sources.postgres.connector import (CONNECTOR_CLASS, CONNECT_TIMEOUT_SECONDS, JDBC_DRIVER,
                                                     LIFT_IDLE_LIMITS, SYSTEM_SCHEMAS, connect, debezium_properties,
                                                     heartbeat_query, jdbc_url, qualified, quote, replicates,
                                                     session_options, tls_parameters)
from cdc_pipeline.sources.postgres.types import (GEOMETRY_TYPES, IMPLICIT_DEFAULTS, LEAVES_VALUES_OUT, POSTGRES_TYPE_ALIASES,
                                                 POSTGRES_TYPE_MAP, TYPE_MAPS, TYPE_MAP_NOTES, always_nullable,
                                                 array_element, column_type)
from cdc_pipeline.sources.postgres.positions import (LOAD_POSITION_KEY, OFFSET_SHAPE, before_snapshot, drop_lost_slot,
                                                     load_end_position, lost_position, lsn_text, mark_wal_end,
                                                     may_share_lsn_ahead, pg_before, pg_record_follows,
                                                     pg_redelivery_test, pg_stream_offset, received_past,
                                                     source_partition, stream_passed)
from cdc_pipeline.sources.postgres.checks import (RETAINED_WAL_WARNING_BYTES, SLOT_PEEK_MESSAGES, SlotPeek,
                                                  VERIFY_SESSION, check_changes, estimated_rows, peek_slot, preflight,
                                                  replication_lag, row_counts, row_hash_sql, slot_status,
                                                  verify_session, verify_text)
from cdc_pipeline.sources.postgres.snapshot import (CONSISTENT_SNAPSHOT, COPY_SNAPSHOT, INDEX_METHODS, SESSION_INIT,
                                                    SourceColumn, chunk_key, chunk_predicate, column_text,
                                                    copy_line_sql, copy_out_column, copy_out_query, copy_text_sql,
                                                    ctid_predicate, ctid_split, export_snapshot, import_snapshot,
                                                    list_columns, list_tables, literal, next_chunk_start,
                                                    require_snapshot_position, secondary_indexes, select_text,
                                                    snapshot_position_select, table_definitions, tables_of, zero_dates)
from cdc_pipeline.sources.postgres.ddl import (DDL_EVENTS, ensure_heartbeat_table, is_heartbeat_table, parse_ddl,
                                               prepare_capture)

# The protocol's optional members PostgreSQL lacks: a binlog's position to reach, to resume from and to check from;
current_position = position_reached = resume_offset = check_position = None
# DDL text, so no DROP DATABASE to read and no CREATE TABLE text of a table (its tables come from the events' schemas);
# the load's fields written by the driver (a chunk is piped COPY to COPY);
dropped_database = create_statements = copy_field_sql = None
# the column defaults to rewrite, the key-range counts and the offsets' own order of SQL Server and Oracle.
default_expression = key_range_counts = stream_order = ORDERED_WITHIN_TRANSACTION = None
