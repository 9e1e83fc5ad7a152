"""Oracle and the initial load: the bulk load does not read this source, so this room holds none of the load's reads
(the package takes them as None from `sources.stream_only`). Oracle tables are loaded by Debezium's own snapshot
(`snapshot_engine: debezium`): a consistent parallel read would be a flashback query `AS OF SCN` for every chunk, and
without a server neither the reads nor the SCN's hand-over to the stream can be tested (docs/oracle.md, "Initial
load")."""
