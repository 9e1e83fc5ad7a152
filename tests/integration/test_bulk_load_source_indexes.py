"""The source's secondary (non-unique) indexes on the destination after a bulk load, MariaDB and PostgreSQL alike: a
composite one with its order and one on a column a mapping rule renames, named `<table>_<index>_idx`; a table just
past KEEP_INDEXES_BELOW_ROWS gets them once its rows are copied (in the load's index phase), a smaller one before
its rows. An index PostgreSQL cannot rebuild from plain columns (MariaDB's FULLTEXT, PostgreSQL's partial and
expression indexes) is left out with a line naming it and why."""

from __future__ import annotations

import logging

import pytest

from cdc_pipeline.bulk_load import engine
from cdc_pipeline.ops.cli import main

pytestmark = pytest.mark.integration

LARGE = engine.KEEP_INDEXES_BELOW_ROWS + 500
SMALL = 200


def _postgres(pipeline) -> bool:
    return not hasattr(pipeline, "mariadb")


def _create(pipeline, table: str, rows: int) -> list[str]:
    if _postgres(pipeline):
        return [f"CREATE TABLE {table} (id int PRIMARY KEY, a int NOT NULL, b varchar(20), nm varchar(20), body text)",
                f"INSERT INTO {table} SELECT g, g % 97, 'b' || (g % 13), 'n' || g, 'text ' || g "
                f"FROM generate_series(1, {rows}) AS g",
                f"CREATE INDEX ab_{table} ON {table} (a, b DESC)", f"CREATE INDEX nm_{table} ON {table} (nm)",
                f"CREATE INDEX recent_{table} ON {table} (a) WHERE a > 50",
                f"CREATE INDEX lower_b_{table} ON {table} (lower(b))",
                f"ANALYZE {table}"]
    return [f"CREATE TABLE {table} (id INT PRIMARY KEY, a INT NOT NULL, b VARCHAR(20), nm VARCHAR(20), body TEXT, "
            f"KEY ab_{table} (a, b DESC), KEY nm_{table} (nm(8)), FULLTEXT KEY words_{table} (body))",
            f"INSERT INTO {table} SELECT seq, seq % 97, CONCAT('b', seq % 13), CONCAT('n', seq), CONCAT('text ', seq) "
            f"FROM seq_1_to_{rows}", f"ANALYZE TABLE {table}"]


def _indexes(pipeline, table: str) -> dict[str, str]:
    """The destination table's indexes other than its primary key: name -> what follows `USING`."""
    rows = pipeline.dest_query(
        "SELECT i.relname, pg_get_indexdef(x.indexrelid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
        "WHERE x.indrelid = to_regclass(%s) AND NOT x.indisprimary", (f'"{pipeline.dest_schema}".{table}',))
    return {name: definition.partition(" USING ")[2] for name, definition in rows}


def test_the_sources_secondary_indexes_are_built_after_the_rows(any_source, caplog):
    pipeline = any_source
    schema = "public" if _postgres(pipeline) else pipeline.source_db
    pipeline.source(_create(pipeline, "big", LARGE) + _create(pipeline, "little", SMALL))
    pipeline.write_config(tables=[f"{schema}.big", f"{schema}.little"], snapshot_chunk_rows=4_000)
    for table in ("big", "little"):
        assert main(["objmap", "add", pipeline.name, "column", f"{schema}.{table}.nm", "full_name"]) == 0

    with caplog.at_level(logging.INFO, logger="cdc_pipeline"):
        pipeline.sync()

    for table in ("big", "little"):
        # Index names are per schema in PostgreSQL: the source's are named per table there.
        assert _indexes(pipeline, table) == {f"{table}_ab_{table}_idx": "btree (a, b DESC)",
                                             f"{table}_nm_{table}_idx": "btree (full_name)"}
        pipeline.assert_same(table)
    messages = [record.getMessage() for record in caplog.records]
    skipped = ({"recent": "a partial index (WHERE)", "lower_b": "an expression in its key"} if _postgres(pipeline)
               else {"words": "a FULLTEXT index"})
    for table in ("big", "little"):
        for index, why in skipped.items():
            index = f"{index}_{table}"
            line = (f"{pipeline.name}: the source's index {index} of {schema}.{table} is not built on the "
                    f"destination: {why}")
            assert messages.count(line) == 1, line
    # The large table's indexes were made after its rows, in the load's index phase; the small one's before them.
    assert any("gets the source's indexes big_ab_big_idx, big_nm_big_idx once its rows are copied" in message
               for message in messages)
    assert any("gets the source's indexes little_ab_little_idx, little_nm_little_idx before its rows" in message
               for message in messages)
    assert any("made source index" in message and "big_nm_big_idx" in message for message in messages)
    assert pipeline.dest_query("SELECT count(*) FROM cdc.deferred_constraints") == [(0,)]
