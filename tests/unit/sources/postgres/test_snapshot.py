"""The PostgreSQL source's reads for the bulk snapshot that need no server: chunk predicates, a keyless table's parts,
chunk literals, and type modifiers; and, on the suite's server, its catalog read of a table's secondary indexes (their
columns, direction and access method, and why one PostgreSQL cannot rebuild from plain columns is skipped)."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from cdc_pipeline.sources import postgres
from cdc_pipeline.sources.postgres import snapshot
from cdc_pipeline.sources.source_index import IndexColumn, SourceIndex


def test_chunk_predicates_are_row_comparisons_with_quoted_literals() -> None:
    assert postgres.chunk_predicate(["id"], ["5"], ["10"]) == """"id" >= E'5' AND "id" < E'10'"""
    assert postgres.chunk_predicate(["re\"gion", "n"], None, ["it's", "3"]) == \
        """ROW("re""gion", "n") < ROW(E'it''s', E'3')"""
    assert postgres.chunk_predicate(["id"], None, None) == "true"


def test_parts_of_a_table_without_a_key_are_block_ranges_of_its_heap() -> None:
    assert postgres.ctid_predicate(None, [40]) == "ctid < '(40,0)'::tid"
    assert postgres.ctid_predicate([40], [80]) == "ctid >= '(40,0)'::tid AND ctid < '(80,0)'::tid"
    assert postgres.ctid_predicate([80], None) == "ctid >= '(80,0)'::tid"
    assert postgres.import_snapshot("00000003-0000001B-1") == (
        "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY; SET TRANSACTION SNAPSHOT E'00000003-0000001B-1'")


def test_chunk_literals_read_the_same_whatever_standard_conforming_strings() -> None:
    assert postgres.literal("k\\1100") == "E'k\\\\1100'"


@pytest.mark.parametrize("type_name, typmod, modifiers", [
    ("varchar", 24, (20, None)), ("numeric", (12 << 16) + 2 + 4, (12, 2)), ("timestamp", 3, (None, 3)),
    ("bit", 5, (5, None)), ("int4", -1, (None, None)), ("timestamptz", -1, (None, None)),
])
def test_array_element_modifiers_are_read_from_the_type_modifier(type_name, typmod, modifiers) -> None:
    assert snapshot._modifiers(type_name, typmod) == modifiers


def _by_name(indexes: list[SourceIndex]) -> dict[str, SourceIndex]:
    return {index.name: index for index in indexes}


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
