"""The stream run ahead: the next group fetched, parsed and converted while the last one is applied."""

from __future__ import annotations

import pytest

from tests.helpers.mariadb_source import Pipeline

pytestmark = pytest.mark.integration

BACKLOG = [
    "INSERT INTO items SELECT seq, CONCAT('i', seq), seq FROM seq_1_to_3000",
    # A schema change between groups: the group after it is planned only once it is applied.
    "ALTER TABLE items ADD COLUMN note VARCHAR(20)",
    "UPDATE items SET note = 'n', qty = qty + 1 WHERE id % 3 = 0",
    "DELETE FROM items WHERE id % 7 = 0",
    "INSERT INTO items SELECT 3000 + seq, 'j', seq, 'late' FROM seq_1_to_1000",
    "ALTER TABLE items MODIFY name VARCHAR(200)",
    "UPDATE items SET name = REPEAT('w', 150) WHERE id % 11 = 0",
]


@pytest.mark.parametrize("run_ahead", [True, False])
def test_a_backlog_with_schema_changes_is_applied_exactly_whether_groups_run_ahead_or_not(pipeline: Pipeline,
                                                                                         run_ahead: bool):
    pipeline.source("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20), qty INT)")
    # Small groups: the backlog's 7,000-odd changes make many.
    pipeline.write_config(apply_batch_events=500, batch_size=250, run_ahead=run_ahead)
    pipeline.sync()
    pipeline.source(BACKLOG)

    summary = pipeline.sync()

    assert (summary.get("groups_run_ahead", 0) > 5) is run_ahead
    assert summary["inserts"] == 4_000 and summary["ddls"] == 2
    pipeline.assert_same("items")
    pipeline.source("UPDATE items SET qty = -qty WHERE id < 100")
    pipeline.sync()
    pipeline.assert_same("items")
