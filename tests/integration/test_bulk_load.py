"""The bulk snapshot engine (snapshot_engine: spark) against real servers: tables copied in chunks by Spark, over
several runs when one run's budget does not hold them, killed between and inside chunks, with the source written
during the load; keys of every shape; the hand-over to the stream exact for tables with and without a key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from tests.helpers.mariadb_source import Pipeline
from tests.helpers.runs import kill_at, start_sync

pytestmark = pytest.mark.integration

KEYED = "CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(64), price DECIMAL(12,2), qty INT, " \
        "changed DATETIME(3), note TEXT)"
KEYLESS = "CREATE TABLE events (kind VARCHAR(20), amount INT)"


def _fill(pipeline: Pipeline, rows: int, start: int = 1) -> None:
    """Inserts `rows` rows into `items` (ids from `start`) in one statement (MariaDB's sequence tables)."""
    pipeline.source(
        "INSERT INTO items SELECT seq, CONCAT('item ', seq), seq * 1.25, seq % 97, "
        "TIMESTAMP('2024-01-01') + INTERVAL seq SECOND, IF(seq % 10 = 0, NULL, REPEAT('x', seq % 50)) "
        f"FROM seq_{start}_to_{start + rows - 1}")


def _keyless_rows(pipeline: Pipeline, rows: int) -> None:
    pipeline.source("INSERT INTO events SELECT IF(seq % 3 = 0, 'dup', CONCAT('k', seq % 7)), seq % 5 "
                    f"FROM seq_1_to_{rows}")


def _chunks(pipeline: Pipeline) -> list[tuple]:
    return pipeline.dest_query("SELECT source_table, count(*), count(done_at), coalesce(sum(rows), 0)::bigint "
                               "FROM cdc.bulk_load_chunks WHERE connector = %s GROUP BY 1 ORDER BY 1",
                               (pipeline.name,))


def test_tables_copy_in_chunks_then_stream(pipeline: Pipeline):
    pipeline.source([KEYED, KEYLESS])
    _fill(pipeline, 5_000)
    _keyless_rows(pipeline, 3_000)
    pipeline.write_config(snapshot_chunk_rows=700)
    summary = pipeline.sync()
    assert summary["snapshot_rows"] == 8_000
    pipeline.assert_same("items")
    assert Counter(pipeline.dest_rows("events")) == Counter(pipeline.source_rows("events"))
    # 5,000 keyed rows in chunks of 700 (the last holds the rest); the keyless table is one chunk.
    assert _chunks(pipeline) == [(f"{pipeline.source_db}.events", 1, 1, 3_000),
                                 (f"{pipeline.source_db}.items", 8, 8, 5_000)]
    assert pipeline.stats(["snapshot_rows"]) == {"snapshot_rows": 8_000}
    pipeline.source(["INSERT INTO items (id, name) VALUES (100000, 'new')", "UPDATE items SET qty = -1 WHERE id < 10",
                     "DELETE FROM items WHERE id BETWEEN 10 AND 20", "INSERT INTO events VALUES ('dup', 0)",
                     "DELETE FROM events WHERE kind = 'k1' LIMIT 5"])
    pipeline.sync()
    pipeline.assert_same("items")
    assert Counter(pipeline.dest_rows("events")) == Counter(pipeline.source_rows("events"))


def _load(pipeline: Pipeline) -> tuple:
    """(load id, finished) of the connector's bulk snapshot."""
    return pipeline.dest_query("SELECT load_id, finished_at IS NOT NULL FROM cdc.bulk_loads WHERE connector = %s",
                               (pipeline.name,))[0]


def _stage(pipeline: Pipeline) -> str:
    return pipeline.dest_query("SELECT stage FROM cdc.connector_state WHERE connector = %s", (pipeline.name,))[0][0]


def test_a_table_larger_than_one_run_loads_over_several_runs(pipeline: Pipeline):
    pipeline.source([KEYED])
    _fill(pipeline, 10_000)
    # A run copies at least one slice of chunks (four times the parallelism: 8 chunks here), then stops at its
    # budget, with the next slice planned (while the slice was copied).
    pipeline.write_config(snapshot_chunk_rows=500, max_seconds_per_run=0.01)
    done = []
    for _ in range(3):
        summary = pipeline.sync()
        done.append((summary["snapshot_rows"], _chunks(pipeline), _load(pipeline), _stage(pipeline)))
    table = f"{pipeline.source_db}.items"
    assert done == [(4_000, [(table, 16, 8, 4_000)], (1, False), "initial snapshot"),
                    (4_000, [(table, 20, 16, 8_000)], (1, False), "initial snapshot"),
                    (2_000, [(table, 20, 20, 10_000)], (1, True), "change data capture")]
    pipeline.assert_same("items")
    assert pipeline.stats(["snapshot_rows"]) == {"snapshot_rows": 10_000}
    pipeline.source(["UPDATE items SET qty = 0 WHERE id % 100 = 0", "DELETE FROM items WHERE id > 5990"])
    pipeline.write_config(snapshot_chunk_rows=500)
    pipeline.sync()
    pipeline.assert_same("items")


def test_runs_killed_between_chunks_and_inside_one_lose_and_repeat_nothing(pipeline: Pipeline, tmp_path: Path):
    pipeline.source([KEYED, KEYLESS])
    _fill(pipeline, 6_000)
    _keyless_rows(pipeline, 3_000)
    pipeline.write_config(snapshot_chunk_rows=500)
    # The keyless table (one chunk) comes first: the first kill follows its commit (the keyed table's first slice
    # planned meanwhile, not begun), the second is inside the transaction of a chunk of the keyed table.
    kill_at(pipeline.name, "bulk_slice", tmp_path / "slice", env=pipeline.env)
    assert _chunks(pipeline) == [(f"{pipeline.source_db}.events", 1, 1, 3_000), (f"{pipeline.source_db}.items", 8, 0, 0)]
    kill_at(pipeline.name, "bulk_copy", tmp_path / "copy", env=pipeline.env)
    assert pipeline.dest_query("SELECT count(*) FROM cdc.bulk_load_chunks WHERE done_at IS NOT NULL "
                               "AND source_table LIKE '%%.items'") == [(0,)]
    pipeline.source(["INSERT INTO events VALUES ('dup', 0), ('dup', 0)", "UPDATE items SET qty = -qty WHERE id < 50"])
    pipeline.catch_up("items", "events")
    assert _load(pipeline) == (1, True)
    assert _chunks(pipeline) == [(f"{pipeline.source_db}.events", 1, 1, 3_000),
                                 (f"{pipeline.source_db}.items", 12, 12, 6_000)]
    assert pipeline.stats(["snapshot_rows", "inserts", "updates"]) == {"snapshot_rows": 9_000, "inserts": 2,
                                                                        "updates": 49}


def _during_load(pipeline: Pipeline, write: callable) -> int:
    """Runs `write(i)` on the source, again and again, from the first chunk committed until the load is done;
    returns how many times it ran."""
    deadline = time.monotonic() + 240
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        def chunks_done() -> int:
            if not conn.execute("SELECT to_regclass('cdc.bulk_load_chunks') IS NOT NULL").fetchone()[0]:
                return 0
            return conn.execute("SELECT count(*) FROM cdc.bulk_load_chunks WHERE done_at IS NOT NULL").fetchone()[0]

        def finished() -> bool:
            row = conn.execute("SELECT finished_at IS NOT NULL FROM cdc.bulk_loads").fetchone()
            return bool(row and row[0])

        while chunks_done() == 0:
            assert time.monotonic() < deadline, "the load did not start"
            time.sleep(0.02)
        writes = 0
        while not finished():
            assert time.monotonic() < deadline, "the load did not end"
            write(writes)
            writes += 1
    return writes


def test_writes_on_the_source_during_the_load_end_exact(pipeline: Pipeline):
    pipeline.source([KEYED, KEYLESS, "CREATE TABLE big_key (id BIGINT PRIMARY KEY, v INT)"])
    _fill(pipeline, 30_000)
    _keyless_rows(pipeline, 2_000)
    pipeline.write_config(snapshot_chunk_rows=500)

    def write(i: int) -> None:
        low, high = 1 + (i * 7919) % 30_000, 1 + (i * 104_729) % 30_000
        pipeline.source([
            f"INSERT INTO items (id, name, qty) VALUES ({100_000 + i}, 'during', {i})",
            f"UPDATE items SET qty = qty + 1000, note = 'updated {i}' WHERE id = {low}",
            f"DELETE FROM items WHERE id = {high}",
            f"UPDATE items SET id = {200_000 + i} WHERE id = {1 + (i * 31) % 30_000}",
            "INSERT INTO events VALUES ('dup', 1), ('dup', 1)",
            "DELETE FROM events WHERE kind = 'dup' LIMIT 1",
            f"UPDATE events SET amount = amount + 10 WHERE kind = 'k{i % 7}' LIMIT 1",
        ])

    run = pipeline.sync_cli()
    try:
        writes = _during_load(pipeline, write)
    finally:
        out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err
    assert writes > 5
    pipeline.catch_up("items", "events")
    assert len(pipeline.source_rows("items")) > 29_000


def test_a_column_added_on_the_source_during_the_load(pipeline: Pipeline):
    pipeline.source([KEYED])
    _fill(pipeline, 20_000)
    pipeline.write_config(snapshot_chunk_rows=500)

    def write(i: int) -> None:
        if i == 0:
            pipeline.source("ALTER TABLE items ADD COLUMN extra INT NOT NULL DEFAULT 7")
        pipeline.source(f"UPDATE items SET extra = {i}, qty = -1 WHERE id = {1 + (i * 7919) % 20_000}")

    run = pipeline.sync_cli()
    try:
        writes = _during_load(pipeline, write)
    finally:
        out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err
    assert writes > 0, "the column was added during the load"
    pipeline.sync()
    pipeline.assert_same("items")


def test_keys_of_every_shape_and_an_empty_table(pipeline: Pipeline):
    pipeline.source([
        "CREATE TABLE by_name (code VARCHAR(40) PRIMARY KEY, n INT) COLLATE utf8mb4_general_ci",
        "INSERT INTO by_name SELECT CONCAT(IF(seq % 2, 'Key-', 'key-'), LPAD(seq, 5, '0'), IF(seq % 3, 'ü', '''')), seq "
        "FROM seq_1_to_1000",
        "CREATE TABLE by_uuid (id CHAR(36) PRIMARY KEY, n INT)",
        "INSERT INTO by_uuid SELECT UUID(), seq FROM seq_1_to_700",
        "CREATE TABLE by_pair (a INT, b VARCHAR(10), n INT, PRIMARY KEY (a, b))",
        "INSERT INTO by_pair SELECT seq % 3, CONCAT('b', seq), seq FROM seq_1_to_900",
        "CREATE TABLE by_bytes (id BINARY(4) PRIMARY KEY, n INT)",
        "INSERT INTO by_bytes SELECT UNHEX(LPAD(HEX(seq * 2654435761 % 4294967296), 8, '0')), seq FROM seq_1_to_800",
        "CREATE TABLE by_unique (id INT NOT NULL, n INT, UNIQUE KEY (id))",
        "INSERT INTO by_unique SELECT seq, seq FROM seq_1_to_500",
        "CREATE TABLE nothing (id INT PRIMARY KEY, v TEXT)",
    ])
    pipeline.write_config(snapshot_chunk_rows=100)
    pipeline.sync()
    for table in ("by_name", "by_uuid", "by_pair", "by_bytes", "by_unique", "nothing"):
        assert Counter(pipeline.dest_rows(table)) == Counter(pipeline.source_rows(table)), table
    chunks = {table.partition(".")[2]: (planned, done, rows) for table, planned, done, rows in _chunks(pipeline)}
    assert chunks == {"by_name": (10, 10, 1_000), "by_uuid": (7, 7, 700), "by_pair": (9, 9, 900),
                      "by_bytes": (8, 8, 800), "by_unique": (5, 5, 500), "nothing": (1, 1, 0)}


def _cli(pipeline: Pipeline, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cdc_pipeline.ops.cli", *args], env={**os.environ, **pipeline.env},
                          capture_output=True, text=True, timeout=300)


def test_a_snapshot_request_copies_chosen_tables_again_while_the_others_stream(pipeline: Pipeline):
    pipeline.source([KEYED, KEYLESS, "CREATE TABLE other (id INT PRIMARY KEY, v INT)",
                     "INSERT INTO other SELECT seq, seq FROM seq_1_to_100"])
    _fill(pipeline, 2_000)
    _keyless_rows(pipeline, 500)
    pipeline.write_config(snapshot_chunk_rows=300)
    pipeline.sync()
    schema = pipeline.source_db
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:  # the destination drifts, by hand
        conn.execute(f'DELETE FROM "{schema}".items WHERE id < 100')
        conn.execute(f'UPDATE "{schema}".events SET amount = 99')
        conn.execute(f'DELETE FROM "{schema}".other WHERE id = 1')
    pipeline.source(["UPDATE other SET v = -v WHERE id = 2", "INSERT INTO items (id, name) VALUES (50000, 'later')",
                     "INSERT INTO events VALUES ('dup', 1)"])

    outcomes = {}
    for tables in (["elsewhere.items"], [f"{schema}.items", f"{schema}.events"]):
        asked = _cli(pipeline, "snapshot", pipeline.name, *tables)
        assert asked.returncode == 0, asked.stderr
        served = _cli(pipeline, "requests", pipeline.name, "--serve", "--json")
        assert served.returncode == 0, served.stderr
        outcomes.update({row["argument"]: (row["status"], row["reason"]) for row in json.loads(served.stdout)})
    assert outcomes["elsewhere.items"][0] == "rejected" and "not tables of the connector" in outcomes[
        "elsewhere.items"][1]
    assert outcomes[f"{schema}.items,{schema}.events"][0] == "done"

    pipeline.sync()
    pipeline.assert_same("items")
    assert Counter(pipeline.dest_rows("events")) == Counter(pipeline.source_rows("events"))
    # The table not asked for kept its rows (the one deleted by hand stays away) and streamed on.
    assert pipeline.dest_rows("other")[:2] == [(2, -2), (3, 3)]
    assert _load(pipeline) == (2, True)
    assert pipeline.dest_query("SELECT DISTINCT split_part(source_table, '.', 2), load_id FROM cdc.bulk_load_chunks "
                               "ORDER BY 1") == [("events", 2), ("items", 2), ("other", 1)]
    state = json.loads(_cli(pipeline, "state", pipeline.name, "--json").stdout)[0]
    assert {table["source_table"]: table["rows_done"] for table in state["bulk_snapshot"]} == {
        f"{schema}.events": 501, f"{schema}.items": 2_001, f"{schema}.other": 100}

    # A restart with snapshot mode always copies every table again, the one not asked for above too.
    assert _cli(pipeline, "restart", pipeline.name, "always").returncode == 0
    assert _cli(pipeline, "requests", pipeline.name, "--serve").returncode == 0
    pipeline.sync()
    pipeline.assert_same("items", "other")
    assert _load(pipeline) == (3, True)
    assert pipeline.dest_query("SELECT DISTINCT split_part(source_table, '.', 2), load_id FROM cdc.bulk_load_chunks "
                               "ORDER BY 1") == [("events", 3), ("items", 3), ("other", 3)]


def _spark_class(*args: str, log: Path) -> subprocess.Popen:
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    return subprocess.Popen([str(spark_home / "bin" / "spark-class"), *args], stdout=log.open("w"),
                            stderr=subprocess.STDOUT, env={**os.environ, "SPARK_HOME": str(spark_home),
                                                           "SPARK_LOCAL_IP": "127.0.0.1"}, start_new_session=True)


def _wait_for(path: Path, text: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while text not in (path.read_text() if path.exists() else ""):
        assert time.monotonic() < deadline, f"{text!r} not in {path}: {path.read_text()[-3000:]}"
        time.sleep(0.2)


def test_the_load_runs_on_a_spark_standalone_master_and_worker(pipeline: Pipeline, tmp_path: Path):
    from cdc_pipeline.testing.servers import free_port

    pipeline.source([KEYED, KEYLESS])
    _fill(pipeline, 3_000)
    _keyless_rows(pipeline, 700)
    port = free_port()
    # The connectors file names the cluster: the CLI's run (as Dagster's) starts its session there.
    pipeline.write_config(snapshot_chunk_rows=500, spark={"master": f"spark://127.0.0.1:{port}",
                                                          "conf": {"spark.executor.memory": "1g"}})
    master_log, worker_log, work = tmp_path / "master.log", tmp_path / "worker.log", tmp_path / "work"
    master = _spark_class("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                          "--webui-port", str(free_port()), log=master_log)
    worker = None
    try:
        _wait_for(master_log, "I have been elected leader")
        worker = _spark_class("org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}", "--host",
                              "127.0.0.1", "--cores", "2", "--memory", "2g", "--webui-port", str(free_port()),
                              "--work-dir", str(work), log=worker_log)
        _wait_for(master_log, "Registering worker")
        run = start_sync(pipeline.name, "--json", env={**pipeline.env, "SPARK_LOCAL_IP": "127.0.0.1"})
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, err[-4000:]
        assert json.loads(out.strip().splitlines()[-1])["snapshot_rows"] == 3_700
        # The stream's groups too: the runner's rows go to the executors in their tasks.
        pipeline.source(["UPDATE items SET name = 'moved' WHERE id <= 300", "DELETE FROM items WHERE id > 2900",
                         "INSERT INTO items (id, name) VALUES (5000, 'new')", "INSERT INTO events VALUES ('late', 1)"])
        run = start_sync(pipeline.name, "--json", env={**pipeline.env, "SPARK_LOCAL_IP": "127.0.0.1"})
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, err[-4000:]
        summary = json.loads(out.strip().splitlines()[-1])
        assert (summary["updates"], summary["deletes"], summary["inserts"]) == (300, 100, 2)
    finally:
        for process in (worker, master):
            if process is not None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    pipeline.assert_same("items")
    assert Counter(pipeline.dest_rows("events")) == Counter(pipeline.source_rows("events"))
    # The chunks were read and written by executors of the worker, not in the driver.
    executor_logs = list(work.glob("app-*/*/stderr"))
    assert executor_logs and any("Running task" in log.read_text() for log in executor_logs)
    assert "-Xmx1024M" in worker_log.read_text()  # the file's spark.executor.memory reached the executors


def test_the_debezium_engine_finishes_a_snapshot_larger_than_the_run_budget(pipeline: Pipeline):
    pipeline.source([KEYED, KEYLESS])
    _fill(pipeline, 5_000)
    _keyless_rows(pipeline, 1_000)
    # Its snapshot cannot be resumed: the run goes on past max_events_per_run until the snapshot is done, letting
    # each group go once applied (the runner's queue holds 4 batches of 250 here).
    pipeline.write_config(snapshot_engine="debezium", batch_size=250, apply_batch_events=500,
                          max_events_per_run=1_000)
    summary = pipeline.sync()
    assert summary["snapshot_rows"] == 6_000
    pipeline.assert_same("items")
    assert Counter(pipeline.dest_rows("events")) == Counter(pipeline.source_rows("events"))
    pipeline.source(["DELETE FROM items WHERE id <= 100", "INSERT INTO events VALUES ('dup', 0)"])
    summary = pipeline.sync()
    assert (summary["deletes"], summary["inserts"], summary.get("redelivered", 0)) == (100, 1, 0)
    pipeline.assert_same("items")


def test_a_new_load_names_the_tables_whose_create_table_it_awaits(pipeline: Pipeline):
    """The schema snapshot's end waits for this (fetch_phases: a CREATE TABLE event still on its way from the engine
    of a loaded machine once the snapshot settled): a table the load copies, not created in the destination yet."""
    from cdc_pipeline import control
    from cdc_pipeline.bulk_load import bookkeeping
    from cdc_pipeline.config import load_config
    from cdc_pipeline.mapping.objmap import ObjectMap

    pipeline.source([KEYED, KEYLESS])
    connector = load_config(pipeline.config_path).connector(pipeline.name)
    mapping = ObjectMap(connector)
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        control.ensure_control_schema(conn, "cdc")
        assert bookkeeping.tables_awaiting_creation(conn, "cdc", connector, mapping) == []  # no load running
        bookkeeping.begin_load(conn, "cdc", pipeline.name)
        awaited = [f"{pipeline.source_db}.events", f"{pipeline.source_db}.items"]
        assert sorted(bookkeeping.tables_awaiting_creation(conn, "cdc", connector, mapping)) == awaited
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{pipeline.dest_schema}"')
        conn.execute(f'CREATE TABLE "{pipeline.dest_schema}".items (id int PRIMARY KEY)')
        assert bookkeeping.tables_awaiting_creation(conn, "cdc", connector, mapping) == awaited[:1]
