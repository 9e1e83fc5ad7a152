"""A PostgreSQL-source run killed with SIGKILL after a group's destination transaction committed and before it was
marked complete (Debezium's offset not moved past it): the next run receives that group's changes again and skips
them, so a keyless table gets no duplicates and every event is counted once."""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest
from pg_source_helpers import SOURCE_SCHEMA, pg_pipeline, source_pg  # noqa: F401 (fixtures)

from cdc_pipeline import faults
from conftest import connector_stats, kill_at

pytestmark = pytest.mark.integration

STATS = ("events", "inserts", "updates", "deletes", "redelivered")


def _stats(pipeline) -> dict[str, int]:
    return connector_stats(pipeline.dest_dsn, pipeline.name, STATS)


def _changes(pipeline, statements: list[str]) -> list[int]:
    with psycopg.connect(pipeline.source_dsn, autocommit=True) as conn:
        return [conn.execute(statement).rowcount for statement in statements]


def test_a_killed_run_is_completed_exactly_with_a_keyless_table(pg_pipeline, tmp_path):
    pg_pipeline.write_config(tables=[f"{SOURCE_SCHEMA}.items", f"{SOURCE_SCHEMA}.notes"])
    pg_pipeline.source(["CREATE TABLE items (id integer PRIMARY KEY, v text)",
                        "CREATE TABLE notes (n integer, body text)",  # no key, duplicate rows
                        "ALTER TABLE notes REPLICA IDENTITY FULL",
                        "INSERT INTO items VALUES (0, 'zero')"])
    pg_pipeline.sync()
    baseline = _stats(pg_pipeline)
    inserts, updates, deletes, note_inserts, note_updates, note_deletes = _changes(pg_pipeline, [
        "INSERT INTO items SELECT i, 'item ' || i FROM generate_series(1, 2000) AS i",
        "UPDATE items SET v = v || '!' WHERE id % 3 = 0",
        "DELETE FROM items WHERE id % 7 = 0",
        # 20 distinct rows, each 30 times: an update or delete must touch one copy only.
        "INSERT INTO notes SELECT i % 20, 'note ' || (i % 20) FROM generate_series(1, 600) AS i",
        "UPDATE notes SET body = 'changed' WHERE ctid IN (SELECT ctid FROM notes WHERE n = 1 LIMIT 7)",
        "DELETE FROM notes WHERE ctid IN (SELECT ctid FROM notes WHERE n = 2 LIMIT 9)",
    ])
    stream = inserts + updates + deletes + note_inserts + note_updates + note_deletes
    pg_pipeline.write_config(tables=[f"{SOURCE_SCHEMA}.items", f"{SOURCE_SCHEMA}.notes"], batch_size=300,
                             apply_batch_events=900)

    # After the second transaction: the first group is committed and marked complete, the second only committed.
    kill_at(pg_pipeline.name, f"{faults.GROUP_COMMITTED}@2", tmp_path / "paused")
    applied = _stats(pg_pipeline)["events"] - baseline["events"]
    assert 0 < applied < stream

    pg_pipeline.write_config(tables=[f"{SOURCE_SCHEMA}.items", f"{SOURCE_SCHEMA}.notes"])
    pg_pipeline.sync()

    pg_pipeline.assert_same("items")
    assert Counter(pg_pipeline.dest_rows("notes")) == Counter(pg_pipeline.source_rows("notes"))
    stats = _stats(pg_pipeline)
    delta = {key: stats[key] - baseline[key] for key in STATS}
    redelivered = delta.pop("redelivered")
    assert delta == {"events": stream, "inserts": inserts + note_inserts, "updates": updates + note_updates,
                     "deletes": deletes + note_deletes}, "every event is counted once"
    assert 0 < redelivered <= 900 and redelivered < applied, "the group not marked complete came again, no more"
