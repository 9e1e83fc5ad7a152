"""`cdc-pipeline bench --value-mb` on 3 rows of 1 MB: the load and the stream of every row updated run, end exact
byte for byte, and report their figures beside the ceiling's (the rates themselves are never asserted). It runs on
the suite's servers (1 MB values need no larger redo log than theirs)."""

import pytest

from cdc_pipeline.testing import bench, bench_values

pytestmark = pytest.mark.integration


def test_bench_values_loads_and_streams_large_values_exactly(mariadb, destination_pg, tmp_path):
    mariadb.create_capture_user(bench.CAPTURE_USER, bench.CAPTURE_PASSWORD)
    results = bench_values.values_report([bench_values.measure_size(mariadb, destination_pg, tmp_path, 1, rows=3)])

    assert results["succeeded"] and results["exact"] and results["heap"] == "default"
    (size,) = results["sizes"]
    assert size["value_mb"] == 1 and size["rows"] == 3 and size["data_mb"] == pytest.approx(3.0, abs=0.01)
    assert size["ceiling"]["exact"] and size["ceiling"]["mb_per_second"] > 0
    assert size["load"]["snapshot_rows"] == 3 and size["stream"]["changes"] == 3
    for phase in ("load", "stream"):
        figures = size[phase]
        assert figures["exact"] and figures["mb_per_second"] > 0 and figures["to_ceiling"] > 0
        assert figures["peak_rss_mb_jvm"] > 0 and figures["peak_rss_mb_python"] > 0
    assert "1MB" in bench_values.describe(results)
