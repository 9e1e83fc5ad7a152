"""MariaDB and MySQL sources (`mysql` shares this package): what the pipeline knows of them, room by room. Callers
reach it through `sources.module_for`, which gives it as a `protocol.Source`; this module re-exports its rooms' names.

- `connector`: the Debezium connector's properties, the databases and tables it covers, connecting (TLS, timeouts,
  the JDBC URL);
- `types`: the type maps and how a column reads by them;
- `positions`: the offsets' shape, binlog positions and their order, snapshot positions, lost positions;
- `checks`: the change check (the binlog scan), lag, row counts, the preflight check, verify's SQL;
- `snapshot`: the bulk load's reads;
- `ddl`: what the pipeline reads from the DDL text (through the shared `sources.ddl_text`)."""

from __future__ import annotations

from cdc_pipeline.sources.mariadb.connector import (CONNECTOR_CLASSES, CONNECT_TIMEOUT_SECONDS, JDBC_DRIVER,
                                                    KEEP_ALIVE_INTERVAL_MS, SYSTEM_SCHEMAS, TRUSTSTORE_PASSWORD,
                                                    connect, databases_of, debezium_properties, is_heartbeat_table,
                                                    jdbc_url, qualified, quote, quote_mysql, replicates, truststore)
from cdc_pipeline.sources.mariadb.types import (GEOMETRY_TYPES, IMPLICIT_DEFAULTS, LEAVES_VALUES_OUT, MARIADB_TYPE_MAP, MYSQL_TYPE_ALIASES,
                                                MYSQL_TYPE_MAP, TYPE_MAPS, TYPE_MAP_NOTES, always_nullable, column_type)
from cdc_pipeline.sources.mariadb.positions import (LOAD_POSITION_KEY, OFFSET_SHAPE, SourceLogChangedError,
                                                    TRANSACTION_STARTS, before_snapshot, binlog_base, binlog_place,
                                                    binlog_position, binlog_redelivery_test, check_position,
                                                    current_position, file_order, load_end_position, lost_position,
                                                    mariadb_gtid_domains, mysql_gtids_missing, offset_order,
                                                    parse_position, position_reached, resume_offset, source_partition,
                                                    stream_passed)
from cdc_pipeline.sources.mariadb.checks import (BINLOG_PAGE_EVENTS, BinlogScan, CAPTURE_PRIVILEGES, CHECK_SECONDS,
                                                 LAG_EVENTS_LIMIT, REQUIRED_BINLOG_SETTINGS, check_changes,
                                                 estimated_rows, preflight, replication_lag, row_counts, row_hash_sql,
                                                 scan_binlog, verify_session, verify_text)
from cdc_pipeline.sources.mariadb.snapshot import (CONSISTENT_SNAPSHOT, SESSION_INIT, SourceColumn, chunk_key,
                                                   chunk_predicate, column_text, copy_field_sql, copy_line_sql,
                                                   copy_text_sql, key_value, list_columns, list_tables, literal,
                                                   next_chunk_start, require_snapshot_position, secondary_indexes,
                                                   select_text, snapshot_position_select, table_definitions, tables_of,
                                                   utf8_literal, zero_dates)
from cdc_pipeline.sources.mariadb.ddl import DDL_EVENTS, create_statements, dropped_database, names_database, parse_ddl

# The protocol's optional members MariaDB/MySQL lacks: PostgreSQL's heartbeat table, replication slot and WAL mark;
prepare_capture = drop_lost_slot = slot_status = mark_wal_end = received_past = may_share_lsn_ahead = None
# the load's reads of a keyless table in heap parts under one exported snapshot, and of a chunk piped COPY to COPY;
COPY_SNAPSHOT = ctid_split = ctid_predicate = export_snapshot = import_snapshot = copy_out_column = copy_out_query = None
# the column defaults to rewrite, the key-range counts and the offsets' own order of SQL Server and Oracle.
default_expression = key_range_counts = stream_order = ORDERED_WITHIN_TRANSACTION = None
