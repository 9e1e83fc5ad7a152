"""Each source's catalog read for its tables' secondary (non-unique) indexes, on the suite's servers: the order of
their columns and their direction, the access method PostgreSQL gets, and why one it cannot rebuild from plain
columns is skipped."""

from __future__ import annotations

import uuid

import psycopg

from cdc_pipeline.sources import mariadb as mariadb_source
from cdc_pipeline.sources import postgres
from cdc_pipeline.sources.source_index import IndexColumn, SourceIndex


def _by_name(indexes: list[SourceIndex]) -> dict[str, SourceIndex]:
    return {index.name: index for index in indexes}


def test_mariadb_reads_non_unique_indexes_and_skips_fulltext_and_spatial(mariadb):
    database = f"idx_{uuid.uuid4().hex[:8]}"
    mariadb.execute([f"CREATE DATABASE {database}"])
    mariadb.execute([
        "CREATE TABLE t (id INT PRIMARY KEY, a INT, b VARCHAR(40), body TEXT, g POINT NOT NULL, u INT UNIQUE, "
        "KEY ab (a, b(10) DESC), FULLTEXT KEY words (body), SPATIAL KEY place (g))",
        "CREATE TABLE m (id INT PRIMARY KEY, a INT, KEY a_hash (a) USING HASH) ENGINE=MEMORY"], database=database)
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        indexes = _by_name(mariadb_source.secondary_indexes(cur, database, ["t", "m"]))
    assert set(indexes) == {"ab", "words", "place", "a_hash"}
    assert indexes["ab"] == SourceIndex("t", "ab", "btree", (IndexColumn("a"), IndexColumn("b", descending=True)))
    assert indexes["a_hash"] == SourceIndex("m", "a_hash", "btree", (IndexColumn("a"),))
    assert indexes["words"].skipped == "a FULLTEXT index"
    assert indexes["place"].skipped == "a SPATIAL index"


def test_postgres_reads_non_unique_indexes_with_their_method_and_order(destination_pg):
    database = f"idx_{uuid.uuid4().hex[:8]}"
    destination_pg.create_database(database)
    destination_pg.execute([
        "CREATE TABLE t (id int PRIMARY KEY, a int, b text, tags int[], u int UNIQUE, at timestamp)",
        "CREATE INDEX ab ON t (a DESC, b NULLS FIRST)", "CREATE INDEX tags ON t USING gin (tags)",
        "CREATE INDEX at_brin ON t USING brin (at)", "CREATE INDEX a_hash ON t USING hash (a)",
        "CREATE INDEX partial ON t (a) WHERE a > 0", "CREATE INDEX expr ON t (lower(b))",
        "CREATE INDEX covering ON t (a) INCLUDE (b)", "CREATE INDEX pattern ON t (b text_pattern_ops)",
        "CREATE INDEX collated ON t (b COLLATE \"C\")", "CREATE INDEX spgist ON t USING spgist (b)"], dbname=database)
    with psycopg.connect(destination_pg.dsn(database)) as conn, conn.cursor() as cur:
        indexes = _by_name(postgres.secondary_indexes(cur, "public", ["t"]))
    assert indexes["ab"] == SourceIndex("t", "ab", "btree", (IndexColumn("a", descending=True, nulls_first=None),
                                                             IndexColumn("b", nulls_first=True)))
    assert (indexes["tags"].method, indexes["tags"].skipped) == ("gin", None)
    assert (indexes["at_brin"].method, indexes["at_brin"].skipped) == ("brin", None)
    assert (indexes["a_hash"].method, indexes["a_hash"].skipped) == ("hash", None)
    assert {name: index.skipped for name, index in indexes.items() if index.skipped} == {
        "partial": "a partial index (WHERE)", "expr": "an expression in its key", "covering": "INCLUDE columns",
        "pattern": "an operator class other than its type's default",
        "collated": "a collation other than its column's", "spgist": "the access method spgist"}
    assert "t_pkey" not in indexes and "t_u_key" not in indexes
