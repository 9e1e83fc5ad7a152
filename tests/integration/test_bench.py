"""`cdc-pipeline bench` on a few rows: every measurement runs and counts what it should (the rates themselves
are for the command's output, never asserted)."""

import pytest

from cdc_pipeline.testing import bench

pytestmark = pytest.mark.integration


def test_bench_measures_every_phase_after_its_warm_up():
    results = bench.run(rows=600, batch_size=128, warmup_rows=100)

    for phase, events in (("snapshot", 600), ("stream", 600)):
        measured = results[phase]
        assert measured["cycle"]["snapshot_rows" if phase == "snapshot" else "events"] == events
        assert measured["cycle"]["inserts"] + measured["cycle"]["updates"] + measured["cycle"]["deletes"] == (
            0 if phase == "snapshot" else events)
        for rate in ("raw_capture_events_per_second", "parse_only_events_per_second",
                     "pipeline_events_per_second", "apply_rows_per_second"):
            assert measured[rate] > 0, (phase, rate)
        assert measured["pipeline_to_capture_ratio"] > 0 and measured["parse_only_to_capture_ratio"] > 0
        assert results["warmup"][phase]["events"] >= 100


def test_bench_measures_the_initial_load_against_the_copy_ceiling(tmp_path):
    results = bench.run_initial_load(rows=3_000, debezium_rows=500)

    assert results["bulk"]["rows"] == 3_000 and results["debezium"]["rows"] == 500
    for rate in (results["ceiling_rows_per_second"], results["bulk"]["rows_per_second"],
                 results["debezium"]["rows_per_second"]):
        assert rate > 0
    assert results["bulk_to_ceiling_ratio"] > 0 and results["bulk"]["peak_rss_mb_jvm"] > 0


def test_bench_measures_a_postgresql_initial_load_and_a_backlog():
    load = bench.run_initial_load(rows=3_000, debezium_rows=0, source_type="postgres")
    assert load["bulk"]["rows"] == 3_000 and load["ceiling_rows_per_second"] > 0
    assert load["bulk_to_ceiling_ratio"] > 0 and load["load_to_ceiling_ratio"] > 0

    backlog = bench.run_backlog(2_000)
    assert backlog["changes"] == backlog["events"] == 2_000 and backlog["events_per_second"] > 0
    assert backlog["peak_rss_mb_jvm"] > 0 and backlog["peak_rss_mb_python"] > 0
