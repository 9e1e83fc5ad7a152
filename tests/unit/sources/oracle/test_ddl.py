"""Oracle's schema changes: its DDL text (column and table renames, unique keys, in Oracle's quoting) beside the
new definition in `tableChanges`, and three-part table ids."""

from __future__ import annotations

import pytest

from tests.unit.sources.oracle.test_types import column, oracle_change

ITEMS = [column("ID", "NUMBER", 1, optional=False, length=9, scale=0),
         column("QTY2", "NUMBER", 2, length=38, scale=None), column("Mixed", "VARCHAR2", 3, length=20)]


@pytest.mark.parametrize("ddl", [
    'ALTER TABLE "DEBEZIUM"."ITEMS" RENAME COLUMN "QTY" TO "QTY2";',
    "alter table debezium.items rename column qty to qty2",
    "ALTER TABLE items RENAME COLUMN Qty TO qTy2",
])
def test_an_oracle_column_rename_is_taken_from_its_text_in_oracles_names(ddl):
    [change] = oracle_change("ALTER", ddl, ITEMS, ["ID"])
    assert (change.source_table, change.schema, change.name) == ("DEBEZIUM.ITEMS", "debezium", "items")
    assert change.column_renames == (("qty", "qty2"),)
    assert [c.name for c in change.table.columns] == ["id", "qty2", "mixed"] and change.table.primary_key == ("id",)


@pytest.mark.parametrize("ddl", [
    "COMMENT ON COLUMN items.qty IS 'RENAME COLUMN qty TO qty2'",
    'ALTER TABLE "DEBEZIUM"."OTHER" RENAME COLUMN "QTY" TO "QTY2"',
    "ALTER TABLE items RENAME CONSTRAINT qty TO qty2",
    "ALTER TABLE items ADD (qty2 NUMBER)",
    "N/A",
])
def test_oracle_text_that_renames_no_column_of_the_table_gives_no_rename(ddl):
    [change] = oracle_change("ALTER", ddl, ITEMS, ["ID"])
    assert change.column_renames == () and change.renamed_from is None


def test_oracle_unique_keys_and_table_renames_read_in_oracles_quoting():
    created = oracle_change("CREATE", 'CREATE TABLE "DEBEZIUM"."ITEMS" ("ID" NUMBER(9) PRIMARY KEY, '
                                      '"QTY2" NUMBER, "Mixed" VARCHAR2(20) CONSTRAINT "uq_m" UNIQUE, '
                                      "CONSTRAINT uq_q UNIQUE (qty2, \"Mixed\"))", ITEMS, ["ID"])[0]
    assert set(created.table.unique_keys) == {("items_mixed_key", ("mixed",)), ("items_uq_q_key", ("qty2", "mixed"))}
    [renamed] = oracle_change("ALTER", "ALTER TABLE debezium.old_items RENAME TO items", ITEMS, ["ID"])
    assert renamed.renamed_from == ("debezium", "old_items")
    assert renamed.previous_source_table == "DEBEZIUM.OLD_ITEMS"
    [renamed] = oracle_change("ALTER", "RENAME old_items TO items", ITEMS, ["ID"])
    assert renamed.renamed_from == ("debezium", "old_items")
