"""A loaded table's keys built after its data (MariaDB): the primary key once the table's last chunk is copied and
before any change of the stream, the unique key once the stream has reconciled the load; a run killed between the
last chunk and the primary key's build leaves the next run making it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_pipeline.bulk_load import engine
from tests.helpers.mariadb_source import Pipeline
from tests.helpers.runs import kill_at

pytestmark = pytest.mark.integration

# Just past the size below which a table keeps its indexes and its primary key through its load.
ROWS = engine.KEEP_INDEXES_BELOW_ROWS + 500


def _keys(pipeline: Pipeline) -> list[tuple[str, str]]:
    return pipeline.dest_query("SELECT conname, contype::text FROM pg_constraint WHERE conrelid = to_regclass(%s) "
                               "ORDER BY 1", (f'"{pipeline.dest_schema}".accounts',))


def _withheld(pipeline: Pipeline) -> list[tuple[str, str]]:
    return pipeline.dest_query("SELECT name, kind FROM cdc.deferred_constraints WHERE connector = %s ORDER BY 1",
                               (pipeline.name,))


def _load(pipeline: Pipeline) -> tuple:
    """(the table finished, the load finished)."""
    return pipeline.dest_query(
        "SELECT t.finished_at IS NOT NULL, l.finished_at IS NOT NULL FROM cdc.bulk_load_tables t JOIN cdc.bulk_loads l "
        "USING (connector) WHERE connector = %s", (pipeline.name,))[0]


def test_the_primary_key_is_made_after_the_last_chunk_and_the_unique_key_after_the_stream(pipeline: Pipeline,
                                                                                           tmp_path: Path):
    pipeline.source(["CREATE TABLE accounts (id INT PRIMARY KEY, email VARCHAR(64) NOT NULL UNIQUE, n INT)",
                     f"INSERT INTO accounts SELECT seq, CONCAT('a', seq, '@x'), seq FROM seq_1_to_{ROWS}",
                     "ANALYZE TABLE accounts"])
    # Six chunks: one slice. The run is killed once it is committed, the table finished, its primary key not made.
    pipeline.write_config(snapshot_chunk_rows=2_000)
    kill_at(pipeline.name, "bulk_slice", tmp_path / "slice", env=pipeline.env)
    assert pipeline.dest_query(f'SELECT count(*) FROM "{pipeline.dest_schema}".accounts') == [(ROWS,)]
    assert _load(pipeline) == (True, False)
    assert _keys(pipeline) == []
    assert _withheld(pipeline) == [("accounts_email_key", "constraint"), ("accounts_pkey", "primary key")]

    # The next run makes the primary key before the stream's first transaction, which it is paused inside.
    pipeline.source(["UPDATE accounts SET n = -1 WHERE id = 7", "UPDATE accounts SET email = 'moved@x' WHERE id = 8",
                     "UPDATE accounts SET email = 'a8@x' WHERE id = 9"])
    kill_at(pipeline.name, "in_transaction", tmp_path / "stream", env=pipeline.env)
    assert _load(pipeline) == (True, True)
    assert _keys(pipeline) == [("accounts_pkey", "p")]
    assert _withheld(pipeline) == [("accounts_email_key", "constraint")]

    # The stream passes the load's end: the unique key is made, timed apart.
    summary = pipeline.sync()
    assert summary["index_seconds"] > 0
    assert _keys(pipeline) == [("accounts_email_key", "u"), ("accounts_pkey", "p")]
    assert _withheld(pipeline) == []
    pipeline.assert_same("accounts")
