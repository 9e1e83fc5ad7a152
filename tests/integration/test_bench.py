"""`cdc-pipeline bench` on a few rows: every measurement runs and counts what it should (the rates themselves
are for the command's output, never asserted). The measurements run on the suite's servers and Spark session, each
in databases of its own."""

import pytest

from cdc_pipeline.testing import bench

pytestmark = pytest.mark.integration


@pytest.fixture
def bench_source(mariadb):
    """The suite's MariaDB with the bench's capture user."""
    mariadb.create_capture_user(bench.CAPTURE_USER, bench.CAPTURE_PASSWORD)
    return mariadb


def test_bench_measures_every_phase_after_its_warm_up(bench_source, destination_pg, spark):
    results = bench.measure_throughput(bench_source, destination_pg, spark, rows=300, batch_size=128,
                                       warmup_rows=100, database="bench_throughput")

    for phase, events in (("snapshot", 300), ("stream", 300)):
        measured = results[phase]
        assert measured["cycle"]["snapshot_rows" if phase == "snapshot" else "events"] == events
        assert measured["cycle"]["inserts"] + measured["cycle"]["updates"] + measured["cycle"]["deletes"] == (
            0 if phase == "snapshot" else events)
        for rate in ("raw_capture_events_per_second", "parse_only_events_per_second",
                     "pipeline_events_per_second", "apply_rows_per_second"):
            assert measured[rate] > 0, (phase, rate)
        assert measured["pipeline_to_capture_ratio"] > 0 and measured["parse_only_to_capture_ratio"] > 0
        assert results["warmup"][phase]["events"] >= 100


def test_bench_measures_the_initial_load_against_the_copy_ceiling(bench_source, destination_pg, tmp_path):
    results = bench.measure_initial_load(bench_source, destination_pg, tmp_path, rows=1_000, debezium_rows=300,
                                         database="bench_initial_load")

    assert results["bulk"]["rows"] == 1_000 and results["debezium"]["rows"] == 300 and results["exact"]
    for rate in (results["ceiling_rows_per_second"], results["bulk"]["rows_per_second"],
                 results["debezium"]["rows_per_second"]):
        assert rate > 0
    assert results["bulk_to_ceiling_ratio"] > 0 and results["bulk"]["peak_rss_mb_jvm"] > 0


def test_bench_measures_a_postgresql_initial_load_and_a_backlog(bench_source, source_pg, destination_pg, tmp_path):
    load = bench.measure_postgres_initial_load(source_pg, destination_pg, tmp_path, rows=1_000,
                                               database="bench_pg_load")
    assert load["bulk"]["rows"] == 1_000 and load["ceiling_rows_per_second"] > 0
    assert load["bulk_to_ceiling_ratio"] > 0 and load["load_to_ceiling_ratio"] > 0

    backlog = bench.measure_backlog(bench_source, destination_pg, tmp_path, 1_000,
                                    database="bench_backlog_test")
    assert backlog["changes"] == backlog["events"] == 1_000 and backlog["events_per_second"] > 0
    assert backlog["peak_rss_mb_jvm"] > 0 and backlog["peak_rss_mb_python"] > 0
