"""What waits where in a run: the stages' counters, the rates over the last seconds, the peaks, the words."""

from __future__ import annotations

from collections import deque

from cdc_pipeline import run_progress
from cdc_pipeline.config import DestinationConfig
from cdc_pipeline.run_progress import ProgressReporter, StageCounters, progress_lines, stage_rates

JVM = {"engine_queue": {"events": 700, "capacity": 8192, "bytes": 3 << 20, "max_bytes": 64 << 20,
                        "mbean": "debezium.mariadb:type=connector-metrics,context=streaming,server=c"},
       "queued_batches": 2, "queued_events": 4096, "in_flight_batches": 3, "in_flight_events": 5000,
       "held_bytes": 1 << 20, "captured_events": 20_000, "handing_over": False}


def test_the_group_being_applied_is_not_one_of_the_groups_ahead():
    counters = StageCounters()
    for _ in range(3):
        counters.parsed(500)
    counters.applying(500)

    snapshot = counters.snapshot(now=counters.applying_since + 1.3)

    assert snapshot["groups_ahead"] == 2
    assert snapshot["applying"]["group"] == 1 and snapshot["applying"]["events"] == 500
    assert snapshot["applying"]["seconds"] == 1.3
    counters.applied(500)
    after = counters.snapshot(now=0)
    assert after["applying"] is None and after["groups_ahead"] == 2 and after["applied_events"] == 500


def test_rates_are_taken_over_the_last_window_only():
    samples = deque([(0.0, {"captured_events": 0, "parsed_events": 0, "applied_events": 0}),
                     (10.0, {"captured_events": 10_000, "parsed_events": 1000, "applied_events": 0}),
                     (20.0, {"captured_events": 12_000, "parsed_events": 6000, "applied_events": 5000})])

    assert stage_rates(samples) == {"captured": 200.0, "parsed": 500.0, "applied": 500.0}
    assert stage_rates(deque(list(samples)[:1])) == {}
    later = (20.5, {"captured_events": 13_000, "parsed_events": 6000, "applied_events": 5000})
    assert stage_rates(deque([*samples, later]), least=1.0) == {"captured": 285.7, "parsed": 476.2, "applied": 476.2}
    assert stage_rates(deque([samples[-1], later]), least=1.0) == {}  # half a second apart: no rate


def test_the_summary_gives_the_peaks_of_the_samples():
    jvm = iter([JVM, {**JVM, "engine_queue": None, "queued_events": 9000}])
    reporter = ProgressReporter(DestinationConfig(dsn="postgresql://unused/db"), "c", StageCounters(),
                                lambda: next(jvm, None), lambda: True, session_pid=1)

    reporter.sample()
    peaks = reporter.summary()

    assert peaks["queue_peak_debezium_events"] == 700
    assert peaks["queue_peak_runner_events"] == 9000
    assert peaks["queue_peak_in_flight_events"] == 5000
    assert peaks["rate_peak_applied_events_per_second"] == 0  # two samples, nothing applied between them
    assert {item for item, _ in run_progress.PEAKS} == set(peaks)


def test_a_progress_reads_as_what_waits_where():
    progress = {**JVM, "groups_ahead": 1, "applied_groups": 16,
                "applying": {"group": 17, "events": 1, "since": 0, "seconds": 0.84},
                "rates": {"captured": 5000.0, "parsed": 4800.5, "applied": 4700.0}}

    assert progress_lines(progress) == [
        "Debezium's queue: 700 of 8,192 events, 3.0 of 64 MB",
        "runner's queue: 4,096 events in 2 batches waiting, 5,000 events fetched and not yet applied",
        "groups parsed ahead: 1",
        "applying group 17: 1 event for 0.8 s",
        "events/s over the last 10 s: captured 5,000.0, parsed 4,800.5, applied 4,700.0",
    ]


def test_a_progress_without_the_engine_queue_says_it_is_not_known():
    lines = progress_lines({**JVM, "engine_queue": None, "queued_batches": 1, "groups_ahead": 0, "applying": None,
                            "applied_groups": 1, "rates": {}})

    assert lines[0].startswith("Debezium's queue: not known")
    assert lines[1].startswith("runner's queue: 4,096 events in 1 batch waiting")
    assert lines[3] == "applying: none (1 group applied)"
    assert len(lines) == 4
