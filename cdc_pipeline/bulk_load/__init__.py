"""The bulk snapshot engine (`snapshot_engine: spark`): copies the rows a connector's tables hold when it starts,
in parallel chunks on Spark, resumable chunk by chunk across runs, and hands over to the stream exactly.

The flow of a load: Debezium takes the schema snapshot only (`no_data`: destination tables created, its binlog
position P recorded, streaming from P; a PostgreSQL source's engine creates its slot at P, and the load makes the
destination tables from the source's catalog). Before the stream's first change is applied, each table is split into
chunks of about `snapshot_chunk_rows` rows by its key (boundaries found by index range scans, so skewed keys make
no huge chunk); a Spark job reads a slice of chunks in parallel through JDBC (one partition per chunk, the source
rendering every column as text, see `sources/`), Spark turns the rows into COPY text, and each partition
is COPYed into the destination by the runner's `ChunkCopyWriter` in its own transaction, which also marks the
chunk done (`cdc.bulk_load_chunks`) and adds its rows to the stats. A run that ends (its time budget, a pause, a
failure, SIGKILL) leaves every chunk either committed with its checkpoint or not at all; the next run goes on
with the chunks not done. Once every table is loaded the stream is applied from P.

Why the destination ends exact. Every chunk is read after P, so the stream from P holds every change the chunk's
rows may have missed. For a table with a key, the stream replays changes as upserts and deletes of whole row
images (`binlog_row_image=FULL`): a key's last change sets its final state whatever the chunk had read, and a
key with no change since P was read as it is. For a table without a key (one chunk), replaying would add rows
twice: it is read under one consistent snapshot whose exact binlog position MariaDB gives
(`binlog_snapshot_file`/`_position`; PostgreSQL: the statement's own transaction snapshot), and the stream
skips that table's changes committed before it (`sources.before_snapshot`). Tables are emptied when the load
plans them, in the transaction that plans them.

The package's modules: `bookkeeping`, a load's record in the control schema, which the cycle and the operators read
and write (it imports no Spark engine); `engine`, `BulkLoader`, the conductor of a load; `chunk_plan`, the tables cut
into chunks; `copy_plan`, what a chunk selects from the source and how it is written into the destination; `slices`,
the Spark jobs that copy slices of chunks in parallel.
"""
