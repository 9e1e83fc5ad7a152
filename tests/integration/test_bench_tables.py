"""`cdc-pipeline bench --tables N` on a few tables: both sides load every row, catch up every change and end exact
(the rates themselves are for the command's output, never asserted). Both sides run on the suite's servers, each in
a source database of its own."""

import pytest

from cdc_pipeline.testing import bench, bench_tables

pytestmark = pytest.mark.integration


def test_bench_tables_loads_and_catches_up_many_tables_beside_one(mariadb, destination_pg, tmp_path):
    mariadb.create_capture_user(bench.CAPTURE_USER, bench.CAPTURE_PASSWORD)
    sides = {}
    for side, names, rows in (("many", bench_tables.table_names(3), 20), ("one", ["items"], 60)):
        (tmp_path / side).mkdir()
        sides[side] = [bench_tables.measure_side(mariadb, destination_pg, tmp_path / side, names, rows, changes=30,
                                                 per_transaction=4, database=f"bench_tables_{side}")]
    results = bench_tables.summarize_sides(sides, tables=3, table_rows=20, changes=30, per_transaction=4)

    assert results["exact"] and results["rows"] == 60
    for side, tables in (("many", 3), ("one", 1)):
        (measured,) = results["rounds"][side]
        assert measured["tables"] == tables and measured["load"]["snapshot_rows"] == 60
        assert measured["catch_up"]["changes"] == sum(measured["change_kinds"].values()) == 30
        assert measured["change_kinds"] == {"inserts": 16, "updates": 7, "deletes": 7}
        assert results[side]["rows_per_second"] > 0 and results[side]["changes_per_second"] > 0
    assert results["rows_per_second_ratio"] > 0 and results["changes_per_second_ratio"] > 0
    assert "3 tables" in bench_tables.describe(results)
