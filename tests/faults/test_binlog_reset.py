"""A source whose binlog starts over (`RESET MASTER`) under a connector: its new events sit at positions the
connector has already applied, and must never be counted as re-delivered and skipped, nor as committed before a
keyless table's bulk snapshot."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from cdc_pipeline.ops import cli
from cdc_pipeline.ops.cli import run_sync
from cdc_pipeline.testing.servers import start_mariadb
from tests.helpers.mariadb_source import CAPTURE_PASSWORD, CAPTURE_USER, new_pipeline

pytestmark = pytest.mark.integration


def test_a_binlog_reset_under_a_connector_stops_its_run_with_what_to_do(destination_pg, spark, tmp_path,
                                                                         monkeypatch):
    with start_mariadb(tmp_path) as source:
        source.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
        pipeline = new_pipeline(source, destination_pg, tmp_path, monkeypatch)
        pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v TEXT)",
                         "INSERT INTO items SELECT seq, REPEAT('x', 100) FROM seq_1_to_50"])
        pipeline.sync()
        pipeline.source("UPDATE items SET v = REPEAT('y', 100)")  # the applied position moves well into the file
        pipeline.sync()
        source.execute("RESET MASTER")
        pipeline.source("INSERT INTO items VALUES (51, 'after the reset')")

        with pytest.raises(Exception) as failed:
            pipeline.sync()

        # The stored position's GTIDs are past the new binlog's: the run refuses to start, naming the position and
        # what to do. (A record that reaches the planner from another binlog stops the run too: test_events.py.)
        message = str(cli._root_cause(failed.value))
        assert message.splitlines()[0].startswith(
            f"connector '{pipeline.name}': the source no longer holds the connector's position mariadb-bin.000001:"), \
            message
        assert "holds GTIDs up to 0-1-1 only: it was reset (RESET MASTER)" in message, message
        assert message.splitlines()[0].endswith(f"recover with `cdc-pipeline restart {pipeline.name} always`"), message
        assert pipeline.dest_query(f'SELECT count(*) FROM "{pipeline.source_db}".items WHERE id = 51') == [(0,)]


def test_a_keyless_tables_snapshot_position_retires_once_the_stream_passes_it(destination_pg, spark, tmp_path,
                                                                              monkeypatch):
    with start_mariadb(tmp_path) as source:
        source.create_capture_user(CAPTURE_USER, CAPTURE_PASSWORD)
        pipeline = new_pipeline(source, destination_pg, tmp_path, monkeypatch)
        pipeline.source(["CREATE TABLE notes (n INT, v TEXT)", "CREATE TABLE items (id INT PRIMARY KEY, v TEXT)",
                         # The keyless table's snapshot is taken far into the binlog file.
                         "INSERT INTO items SELECT seq, REPEAT('x', 200) FROM seq_1_to_100",
                         "INSERT INTO notes VALUES (1, 'loaded'), (1, 'loaded')"])
        pipeline.sync()
        kept = "SELECT snapshot_position FROM cdc.bulk_load_chunks WHERE source_table = %s"
        [(position,)] = pipeline.dest_query(kept, (pipeline.table_id("notes"),))
        assert int(position["pos"]) > 20_000
        pipeline.source("INSERT INTO items VALUES (101, 'streamed past the snapshot')")
        pipeline.sync()
        # The binlog starts over, and the operator points the connector at its start (every change before is
        # applied): the new binlog's positions are lower than the snapshot's.
        source.execute("RESET MASTER")
        pipeline.source("UPDATE items SET v = 'the first transaction of the new binlog' WHERE id = 1")
        [(file, pos, *_)] = source.query("SHOW MASTER STATUS")
        [(gtids,)] = source.query("SELECT @@gtid_binlog_pos")
        # Debezium's schema history holds positions of the old binlog: the table is created again in the new one.
        pipeline.source(["DROP TABLE notes", "CREATE TABLE notes (n INT, v TEXT)",
                         "INSERT INTO notes VALUES (2, 'after the reset'), (2, 'after the reset')"])

        run_sync(pipeline.name, start_offset=json.dumps({"file": file, "pos": pos, "gtids": gtids}))

        assert Counter(pipeline.dest_rows("notes")) == Counter(pipeline.source_rows("notes")) == Counter(
            {(2, "after the reset"): 2})
        assert pipeline.dest_query(kept, (pipeline.table_id("notes"),)) == [(None,)], "the position is retired"
