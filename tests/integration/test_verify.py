"""`cdc-pipeline verify`: rows changed, deleted or added in the destination behind the pipeline's back are found by
key and repaired; every MariaDB type's edge values, copied by the bulk snapshot and by the stream, compare equal;
a source taking writes while the pipeline syncs raises no false alarm."""

from __future__ import annotations

import threading
import time

import pytest

from cdc_pipeline.config import load_config
from cdc_pipeline.ops import verify
from cdc_pipeline.ops.cli import main
from tests.helpers.mariadb_source import Pipeline
from tests.integration import test_types_mariadb as types

pytestmark = pytest.mark.integration

ITEMS = ("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40), price DECIMAL(10,2), seen DATETIME(3), "
         "at TIMESTAMP(6) NULL, data BLOB, weight DOUBLE)")
ROWS = 3_000


def _verify(pipeline: Pipeline, spark=None, repair: bool = False, **options) -> verify.VerifyReport:
    config = load_config()
    options = {"chunk_rows": 1_000, "rechecks": 1, "recheck_seconds": 0.2, **options}
    return verify.verify_connector(config.connector(pipeline.name), config.destination, spark, repair=repair,
                                   **options)


def test_rows_changed_deleted_and_added_in_the_destination_are_named_and_repaired(pipeline: Pipeline, spark,
                                                                                   monkeypatch, capsys):
    monkeypatch.setattr(verify, "LIST_ROWS", 100)  # a differing chunk of 1,000 rows is split before its rows are read
    pipeline.source([ITEMS, "INSERT INTO items SELECT seq, CONCAT('item\\t', seq), seq / 7, "
                            "'2024-01-01 10:00:00.5' + INTERVAL seq SECOND, "
                            "'2024-01-01 10:00:00.123456' + INTERVAL seq MINUTE, UNHEX(HEX(seq)), seq / 3 "
                            f"FROM seq_1_to_{ROWS}"])
    pipeline.sync()
    assert _verify(pipeline).exit_code == verify.EQUAL
    table = f'"{pipeline.dest_schema}".items'
    pipeline.dest_query(f"UPDATE {table} SET seen = seen + interval '1 millisecond' WHERE id = 1234 RETURNING id")
    pipeline.dest_query(f"DELETE FROM {table} WHERE id = 2500 RETURNING id")
    pipeline.dest_query(f"INSERT INTO {table} (id, name) VALUES (5000, 'not in the source') RETURNING id")

    report = _verify(pipeline)

    assert report.exit_code == verify.DIFFERS and report.unconfirmed is None
    (items,) = report.tables
    assert (items.keys("changed"), items.keys("missing"), items.keys("extra")) == \
           ([[1234]], [[2500]], [[5000]])
    assert items.chunks == 3 and items.source_rows == ROWS and items.destination_rows == ROWS
    assert all(leaf.upper is None or int(leaf.upper[0]) - int(leaf.lower[0]) <= 300 for leaf in items.leaves[:2])
    assert {column.source: column.left_out for column in items.columns if column.left_out} == {
        "weight": "floating point: MariaDB and PostgreSQL write its digits differently"}
    assert main(["verify", pipeline.name, pipeline.table_id("items"), "--rechecks", "0"]) == verify.DIFFERS
    out = capsys.readouterr().out
    assert "1 keys changed: 1234" in out and "1 keys missing in the destination: 2500" in out \
        and "1 keys extra in the destination: 5000" in out and "column weight left out" in out

    repaired = _verify(pipeline, spark, repair=True)

    assert repaired.exit_code == verify.EQUAL
    assert repaired.tables[0].repaired_rows >= 2 and repaired.tables[0].deleted_rows >= 2
    assert pipeline.dest_query(f"SELECT id, seen::text FROM {table} WHERE id IN (1234, 2500, 5000) ORDER BY id") == [
        (1234, "2024-01-01 10:20:34.5"), (2500, "2024-01-01 10:41:40.5")]
    # The stream goes on over the repaired rows.
    pipeline.source("UPDATE items SET name = 'after the repair' WHERE id = 1234")
    pipeline.sync()
    assert pipeline.dest_query(f"SELECT name FROM {table} WHERE id = 1234") == [("after the repair",)]
    assert _verify(pipeline).exit_code == verify.EQUAL


# The long texts shorter (MariaDB's REPLACE of COPY's escapes takes seconds over the 600,000 characters of LONGTEXT's).
LONG_TEXTS = {"tx": f"REPEAT('{types.LONG_4_BYTE}', 50)", "mt": f"REPEAT('{types.LONG_4_BYTE}', 50)",
              "lt": types.MAXIMUM["lt"].replace("30000)", "50)")}


def _shorter(rows: dict[int, dict[str, str]]) -> dict[int, dict[str, str]]:
    return {key: {**row, **LONG_TEXTS} if row is types.MAXIMUM else row for key, row in rows.items()}


def test_every_mariadb_types_edge_values_compare_equal(pipeline: Pipeline):
    pipeline.source([*types.SESSION, types._create_table(), types._insert(_shorter(types.SNAPSHOT_ROWS))])
    pipeline.sync()
    pipeline.source([*types.SESSION, types._insert(_shorter(types.STREAMED_ROWS)), *types.STREAMED_CHANGES])
    pipeline.sync()

    report = _verify(pipeline)

    (all_types,) = report.tables
    assert not all_types.leaves, verify.format_report(report)
    left_out = {column.source for column in all_types.columns if column.left_out}
    assert left_out == {"f", "db", "g", "pt", "ls", "pg", "mpt", "gc"}
    compared = {column.source: column.compared for column in all_types.columns if column.compared}
    assert compared["ts6"] == "as UTC microseconds" and compared["dtm3"] == "as text"


def test_a_busy_source_while_the_pipeline_syncs_raises_no_false_alarm(pipeline: Pipeline):
    rows = 2_000
    pipeline.source(["CREATE TABLE accounts (id INT PRIMARY KEY, balance INT NOT NULL)",
                     f"INSERT INTO accounts SELECT seq, seq FROM seq_1_to_{rows}"])
    pipeline.sync()
    pipeline.write_config(max_seconds_per_run=300, idle_timeout_seconds=60)  # the test ends the run itself
    stop, written = threading.Event(), [0]

    def write() -> None:
        with pipeline.mariadb.connect(pipeline.source_db) as connection, connection.cursor() as cursor:
            while not stop.is_set():
                cursor.execute("UPDATE accounts SET balance = balance + 1 WHERE id = %s", (written[0] * 37 % rows + 1,))
                written[0] += 1
                time.sleep(0.01)

    run = pipeline.sync_cli()
    output: list[tuple[str, str]] = []
    drain = threading.Thread(target=lambda: output.append(run.communicate()), daemon=True)  # the run's log
    drain.start()
    writer = threading.Thread(target=write, daemon=True)
    table = f'"{pipeline.dest_schema}".accounts'
    try:
        writer.start()
        deadline = time.monotonic() + 120
        while pipeline.dest_query(f"SELECT sum(balance) FROM {table}") == [(rows * (rows + 1) // 2,)]:
            assert time.monotonic() < deadline and run.poll() is None, "the run streams the writer's changes"
            time.sleep(1)
        before = written[0]
        report = _verify(pipeline, chunk_rows=500, rechecks=4, recheck_seconds=2)
        assert before > 0 and written[0] > before, "the source took writes while verify ran"
        assert report.tables[0].chunks == 4
        assert report.exit_code == verify.EQUAL, verify.format_report(report)
    finally:
        stop.set()
        writer.join(10)
        run.terminate()
        drain.join(120)


def test_a_postgresql_source_compares_by_ranges_whole_tables_and_repairs(pg_pipeline, spark):
    pg_pipeline.write_config(tables=["public.items", "public.labels", "public.notes"])
    pg_pipeline.source([
        "CREATE TABLE items (id bigint PRIMARY KEY, name text, price numeric(12,3), at timestamptz, span interval, "
        "data bytea, ratio float8, doc jsonb, flag boolean, tags text[])",
        "INSERT INTO items SELECT seq, 'item' || chr(9) || seq, seq / 7.0, '2024-01-01 10:00:00.5+02'::timestamptz "
        "+ seq * interval '1 second', seq * interval '1 minute', int4send(seq), seq / 3.0, "
        "jsonb_build_object('n', seq), seq % 2 = 0, ARRAY['a', seq::text] FROM generate_series(1, 1500) AS seq",
        "CREATE TABLE labels (code text PRIMARY KEY, label text)",
        "INSERT INTO labels VALUES ('a', 'first'), ('B', 'second'), ('c d', 'third')",
        "CREATE TABLE notes (note text)", "ALTER TABLE notes REPLICA IDENTITY FULL",
        "INSERT INTO notes VALUES ('one'), ('two')"])
    pg_pipeline.sync()
    assert _verify(pg_pipeline).exit_code == verify.EQUAL
    pg_pipeline.dest_query("UPDATE public.items SET ratio = ratio + 1e-9 WHERE id = 700 RETURNING id")
    pg_pipeline.dest_query("UPDATE public.labels SET label = 'changed' WHERE code = 'B' RETURNING code")
    pg_pipeline.dest_query("INSERT INTO public.notes VALUES ('three') RETURNING note")

    report = _verify(pg_pipeline)

    items, labels, notes = report.tables
    assert (items.compared_by, items.chunks, items.keys("changed"), items.changed_columns) == (
        "key ranges", 2, [[700]], {"700": ["ratio"]})
    assert (labels.compared_by, labels.keys("changed")) == ("the whole table (its key is not of an integer type)",
                                                           [["B"]])
    assert (notes.compared_by, notes.differs, notes.unlisted) == ("the whole table (it has no key)", True,
                                                                  "the table has no key")

    repaired = _verify(pg_pipeline, spark, repair=True)

    assert [table.differs for table in repaired.tables] == [False, False, True]
    assert repaired.tables[2].repair.startswith("a table without a key is copied again whole")


def test_mapping_rules_renamed_retyped_and_transformed_columns(pipeline: Pipeline, spark):
    db = pipeline.source_db
    pipeline.source(["CREATE TABLE employee (id INT PRIMARY KEY, nm VARCHAR(20), age SMALLINT, salary DECIMAL(10,2))",
                     "INSERT INTO employee SELECT seq, CONCAT('e', seq), seq % 60, seq FROM seq_1_to_50"])
    for rule in (("table", f"{db}.employee", "hr.staff"), ("column", f"{db}.employee.nm", "full_name"),
                 ("datatype", f"{db}.employee.age", "bigint|0"),
                 ("transform", f"{db}.employee.salary", "round(%d * 1.1, 2)")):
        assert main(["objmap", "add", pipeline.name, *rule]) == 0
    pipeline.sync()
    pipeline.dest_query("UPDATE hr.staff SET full_name = 'changed', salary = 0 WHERE id = 7 RETURNING id")
    pipeline.dest_query("UPDATE hr.staff SET salary = 0 WHERE id = 8 RETURNING id")

    report = _verify(pipeline)

    (staff,) = report.tables
    assert (staff.destination_table, staff.keys("changed"), staff.changed_columns) == (
        "hr.staff", [[7]], {"7": ["nm"]})
    assert {column.source: (column.destination, column.compared, column.left_out) for column in staff.columns} == {
        "id": ("id", "as text", None), "nm": ("full_name", "as text", None),
        "age": ("age", "as text (datatype rule: bigint)", None),
        "salary": ("salary", None, "written through the transform 'round(%d * 1.1, 2)'")}

    assert _verify(pipeline, spark, repair=True).exit_code == verify.EQUAL
    # The differing range (here the table's one chunk) is copied again whole, through the transform.
    assert pipeline.dest_query("SELECT full_name, salary::text FROM hr.staff WHERE id IN (7, 8) ORDER BY id") == [
        ("e7", "7.70"), ("e8", "8.80")]
