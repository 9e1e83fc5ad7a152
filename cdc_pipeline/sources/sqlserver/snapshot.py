"""SQL Server and the initial load: the bulk load does not read this source, so this room holds none of the load's
reads (the package takes them as None from `sources.stream_only`). SQL Server tables are loaded by Debezium's own
snapshot (`snapshot_engine: debezium`): a chunked read would need SQL Server's snapshot isolation, and the max LSN
taken the way Debezium takes it, to line up with the stream; without a server that cannot be tested, and an untested
loader could lose rows silently (docs/sqlserver.md, "Initial load")."""
