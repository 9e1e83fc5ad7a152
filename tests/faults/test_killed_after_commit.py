"""A run killed with SIGKILL after a group's destination transaction committed and before it was marked complete
(Debezium's offset not moved past it), on a MariaDB and on a PostgreSQL source: the next run receives that group's
changes again and skips them, so a keyless table gets no duplicates and every event is counted once."""

from __future__ import annotations

from collections import Counter

import pytest

from cdc_pipeline import faults
from tests.helpers.runs import kill_at

pytestmark = pytest.mark.integration

STATS = ("events", "inserts", "updates", "deletes", "redelivered")


def test_a_killed_run_is_completed_exactly_with_a_keyless_table(any_source, tmp_path):
    source = any_source
    tables = [source.table_id("items"), source.table_id("notes")]
    source.write_config(tables=tables)
    source.source(["CREATE TABLE items (id INT PRIMARY KEY, v VARCHAR(40))",
                   "CREATE TABLE notes (n INT, body VARCHAR(40))",  # no key, duplicate rows
                   *source.keyless("notes"),
                   "INSERT INTO items VALUES (0, 'zero')"])
    source.sync()
    baseline = source.stats(STATS)
    inserts, updates, deletes, note_inserts, note_updates, note_deletes = source.source_changes([
        f"INSERT INTO items SELECT seq, CONCAT('item ', seq) FROM {source.numbers(2000)}",
        "UPDATE items SET v = CONCAT(v, '!') WHERE id % 3 = 0",
        "DELETE FROM items WHERE id % 7 = 0",
        # 20 distinct rows, each 30 times: an update or delete must touch one copy only.
        f"INSERT INTO notes SELECT seq % 20, CONCAT('note ', seq % 20) FROM {source.numbers(600)}",
        f"UPDATE notes SET body = 'changed' {source.limited('notes', 'n = 1', 7)}",
        f"DELETE FROM notes {source.limited('notes', 'n = 2', 9)}",
    ])
    stream = inserts + updates + deletes + note_inserts + note_updates + note_deletes
    source.write_config(tables=tables, batch_size=300, apply_batch_events=900)

    # After the second transaction: the first group is committed and marked complete, the second only committed.
    kill_at(source.name, f"{faults.GROUP_COMMITTED}@2", tmp_path / "paused")
    applied = source.stats(STATS)["events"] - baseline["events"]
    # The second commit is usually mid-stream; on a loaded machine it may be the stream's last (the source
    # transaction of 2,000 rows spans groups committed as one): either way that group is not marked complete.
    assert 0 < applied <= stream

    source.write_config(tables=tables)
    source.sync()

    source.assert_same("items")
    assert Counter(source.dest_rows("notes")) == Counter(source.source_rows("notes"))
    stats = source.stats(STATS)
    delta = {key: stats[key] - baseline[key] for key in STATS}
    redelivered = delta.pop("redelivered")
    assert delta == {"events": stream, "inserts": inserts + note_inserts, "updates": updates + note_updates,
                     "deletes": deletes + note_deletes}, "every event is counted once"
    assert 0 < redelivered <= 900 and redelivered < applied, "the group not marked complete came again, no more"
