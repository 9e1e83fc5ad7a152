"""What a source that Debezium alone reads lacks of the source protocol (`protocol.Source`): SQL Server and Oracle,
whose tables the bulk load does not read (Debezium's snapshot loads them), whose log is neither a binlog nor a
replication slot, and whose rows `verify` counts per key range rather than hashing them. Each such Optional member
is None here, and the two packages take them all (`from cdc_pipeline.sources.stream_only import *`)."""

# Before the engine starts, and the schema changes' DDL: nothing to prepare, no DROP DATABASE to read, no table's
# CREATE TABLE to read from the source.
prepare_capture = None
dropped_database = None
create_statements = None

# Positions of a bulk load, of a binlog and of a replication slot.
LOAD_POSITION_KEY = None
before_snapshot = None
stream_passed = None
position_reached = None
load_end_position = None
current_position = None
resume_offset = None
drop_lost_slot = None
mark_wal_end = None
received_past = None
may_share_lsn_ahead = None

# Checks of a replication slot, the lag in bytes of a binlog or WAL, the catalog's row estimates, and verify's row
# hashes (verify counts these sources' rows per key range: `key_range_counts`).
slot_status = None
replication_lag = None
estimated_rows = None
verify_text = None
row_hash_sql = None
verify_session = None

# The bulk load's reads.
JDBC_DRIVER = None
SESSION_INIT = None
CONSISTENT_SNAPSHOT = None
COPY_SNAPSHOT = None
GEOMETRY_TYPES = None
jdbc_url = None
tables_of = None
list_tables = None
list_columns = None
chunk_key = None
table_definitions = None
secondary_indexes = None
next_chunk_start = None
chunk_predicate = None
ctid_split = None
ctid_predicate = None
export_snapshot = None
import_snapshot = None
copy_out_column = None
copy_out_query = None
copy_field_sql = None
select_text = None
column_text = None
copy_text_sql = None
copy_line_sql = None
zero_dates = None
snapshot_position_select = None
require_snapshot_position = None

__all__ = [name for name in dir() if not name.startswith("_")]
