"""`cdc-pipeline bench --value-mb`'s report of a failed sync: failed, with its error's last line and what it used,
never a crash of the bench."""

from cdc_pipeline.testing import bench_values
from cdc_pipeline.testing.bench import SyncFailed


def test_a_failed_sync_is_reported_with_its_errors_last_line_not_a_stack_frame():
    stderr = ("cdc-pipeline sync (spark) failed: Traceback\n  ...\njava.lang.OutOfMemoryError: Java heap space\n"
              "\tat java.base/java.lang.Thread.run(Thread.java:840)\n\t... 3 more\n")
    failed = bench_values.failure(SyncFailed(stderr, seconds=40.5, peak_rss_mb_jvm=2100, peak_rss_mb_python=120,
                                             stderr=stderr))
    assert failed["failed"] and failed["error"] == "java.lang.OutOfMemoryError: Java heap space"
    assert failed["out_of_memory"]
    assert failed["seconds"] == 40.5 and failed["peak_rss_mb_jvm"] == 2100
    report = bench_values.describe({"heap": "default", "sizes": [
        {"value_mb": 64, "rows": 8, "data_mb": 512.0, "exact": False, "succeeded": False,
         "ceiling": {"seconds": 2.0, "mb_per_second": 256.0, "exact": True}, "load": failed}]})
    assert "FAILED" in report and (
        "64 MB, load: failed after 40.5 s (an OutOfMemoryError in its log): java.lang.OutOfMemoryError") in report
