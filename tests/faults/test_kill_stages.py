"""A run killed with SIGKILL at each stage of a fetch cycle (a pause point holds it there until the kill): the next
runs leave the destination equal to the source, a keyless table's duplicates included, and count every event once.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from cdc_pipeline import faults
from tests.helpers.runs import kill_at, log_tail

pytestmark = pytest.mark.integration

READINGS = "CREATE TABLE readings (id INT PRIMARY KEY, sensor VARCHAR(20), value DECIMAL(12,3))"
AUDIT_LOG = "CREATE TABLE audit_log (actor VARCHAR(20), amount INT)"  # no key, duplicate rows
STATS = ("events", "snapshot_rows", "inserts", "updates", "deletes", "redelivered")
# Source transactions smaller than a group (900 events), so that the stages the kills hit are between groups of
# whole transactions (a kill inside one that spans groups: tests/integration/test_source_transactions.py).
READINGS_INSERTS = [f"INSERT INTO readings SELECT {part} + seq, CONCAT('s-', ({part} + seq) % 7), ({part} + seq) / 3 "
                    "FROM seq_1_to_300" for part in range(0, 3000, 300)]
# 30 distinct rows, each about 33 times: an update or delete must touch one copy only.
LOG_INSERTS = [f"INSERT INTO audit_log SELECT CONCAT('a-', ({part} + seq) % 30), ({part} + seq) % 3 FROM seq_1_to_250"
               for part in range(0, 1000, 250)]
STREAM = [
    *READINGS_INSERTS,
    "UPDATE readings SET value = -value WHERE id % 4 = 0",
    "DELETE FROM readings WHERE id % 9 = 0",
    *LOG_INSERTS,
    "UPDATE audit_log SET amount = 10 WHERE amount = 0 LIMIT 150",
    "DELETE FROM audit_log WHERE amount = 1 LIMIT 100",
]


def _kill_at(pipeline, pause_at: str, tmp_path: Path) -> dict[str, int]:
    """Kills a run of the connector at `pause_at`; returns the stats the kill left."""
    kill_at(pipeline.name, pause_at, tmp_path / "paused", env=pipeline.env)
    return pipeline.stats(STATS)


def _killed_log(tmp_path: Path) -> str:
    return "the killed run's log:\n" + log_tail(tmp_path / "paused.log")


def _assert_exact(pipeline, stats: dict[str, int], expected: dict[str, int]) -> None:
    pipeline.assert_same("readings")
    assert Counter(pipeline.dest_rows("audit_log")) == Counter(pipeline.source_rows("audit_log")), \
        "the keyless table holds the source's rows, each as many times"
    assert {key: stats[key] for key in expected} == expected, "every event is counted once"
    state = pipeline.dest_query("SELECT state, phase, last_error FROM cdc.connector_state WHERE connector = %s",
                                (pipeline.name,))
    assert state == [("syncing", None, None)], "the last cycle succeeded and none runs"


# `@2`: the kill comes after the cycle's first transaction committed (and its group was marked complete), so part
# of the stream was applied before it; `group_committed@2`: the second group is committed, not yet marked complete.
@pytest.mark.parametrize("pause_at", [f"{faults.FETCHED}@4", f"{faults.CONVERTED}@2", f"{faults.IN_TRANSACTION}@2",
                                      f"{faults.GROUP_COMMITTED}@2", faults.COMMITTED])
def test_stream_killed_at_each_stage(pipeline, tmp_path, pause_at):
    pipeline.source([READINGS, AUDIT_LOG])
    pipeline.sync()
    baseline = pipeline.stats(STATS)
    counts = pipeline.source_changes(STREAM)
    readings_end = len(READINGS_INSERTS)
    inserts, (updates, deletes) = sum(counts[:readings_end]), counts[readings_end:readings_end + 2]
    log_inserts = sum(counts[readings_end + 2:readings_end + 2 + len(LOG_INSERTS)])
    log_updates, log_deletes = counts[-2:]
    stream_events = inserts + updates + deletes + log_inserts + log_updates + log_deletes
    # Debezium batches of 300 events at most, applied in transactions of 900 at most. How many batches a group
    # holds depends on the machine (a group goes downstream once the engine has had nothing for 50 ms: the first
    # is often a batch of a few events); the idle timeout is long enough that a run on a loaded machine, its
    # engine stalled for a few seconds, still reaches its pause point rather than ending as if the source were idle.
    # The cycle's end is the last pause point: a run ends idle only once its reader has read the binlog up to where it
    # ended, so the fixture's idle timeout serves it (a longer one is waited out before the kill).
    idle_timeout_seconds = 2 if pause_at == faults.COMMITTED else 10
    pipeline.write_config(batch_size=300, apply_batch_events=900, idle_timeout_seconds=idle_timeout_seconds)

    killed = _kill_at(pipeline, pause_at, tmp_path)

    applied = killed["events"] - baseline["events"]
    if pause_at.startswith(faults.COMMITTED):
        assert applied == stream_events, "every batch was committed and marked complete before the kill"
    elif pause_at.startswith((faults.CONVERTED, faults.IN_TRANSACTION, faults.GROUP_COMMITTED)):
        assert 0 < applied < stream_events, \
            f"the first transaction was committed, the one the kill hit was not; {_killed_log(tmp_path)}"
    else:
        assert applied < stream_events
    pipeline.write_config()
    # Until the destination holds the source's rows (a run that saw the engine quiet for its idle timeout ends, and
    # the next goes on): whatever the runs, every event is counted once.
    pipeline.catch_up("readings", "audit_log")

    stats = pipeline.stats(STATS)
    redelivered = stats["redelivered"] - baseline["redelivered"]
    if pause_at.startswith(faults.GROUP_COMMITTED):
        # The group committed but not marked complete comes again, and only it: the first group was let go.
        assert 0 < redelivered <= 900 and redelivered < applied, "the group in flight, and no more, came again"
    else:
        assert redelivered == 0, "every committed group was marked complete: none came again"
    _assert_exact(pipeline, stats, {
        "events": baseline["events"] + stream_events, "inserts": inserts + log_inserts,
        "updates": updates + log_updates, "deletes": deletes + log_deletes})


def test_debezium_snapshot_killed_after_its_last_commit_streams_on(pipeline, tmp_path):
    """Debezium's snapshot lets each group go once it is committed (it may outlast any run budget): a run killed
    after its last commit leaves the snapshot's end as the engine's offset, and the next run streams from there."""
    pipeline.source([READINGS, AUDIT_LOG])
    pipeline.source_changes(READINGS_INSERTS + LOG_INSERTS)
    rows = len(pipeline.source_rows("readings")) + len(pipeline.source_rows("audit_log"))
    engine = {"snapshot_engine": "debezium"}
    pipeline.write_config(batch_size=300, apply_batch_events=900, **engine)
    killed = _kill_at(pipeline, faults.COMMITTED, tmp_path)
    assert killed["snapshot_rows"] == rows, "the whole snapshot was committed"
    offsets = pipeline.dest_query("SELECT offset_value FROM cdc.debezium_offsets WHERE connector = %s",
                                  (pipeline.name,))
    assert len(offsets) == 1 and '"snapshot"' not in offsets[0][0], "the offset is past the snapshot"

    pipeline.source_changes(["DELETE FROM readings WHERE id <= 10", "DELETE FROM audit_log WHERE amount = 2 LIMIT 5"])
    pipeline.write_config(**engine)
    pipeline.sync()

    stats = pipeline.stats(STATS)
    _assert_exact(pipeline, stats, {"snapshot_rows": rows, "redelivered": 0, "deletes": 15})
