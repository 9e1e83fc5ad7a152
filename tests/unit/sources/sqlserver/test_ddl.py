"""SQL Server's schema changes: three-part table ids, no DDL text, the table's whole definition from a new capture
instance, the key from primaryKeyColumnNames."""

from __future__ import annotations

from typing import Any

from cdc_pipeline.convert.ddl import alter_table_sql, changes_from_schema_event
from tests.unit.sources.sqlserver.test_types import column


def schema_change(kind: str, columns: list[dict[str, Any]], keys: list[str]) -> dict[str, Any]:
    """A SQL Server schema-change payload: no DDL text ("N/A"), the table's whole definition."""
    return {"ddl": "N/A", "databaseName": "shop", "schemaName": "dbo",
            "source": {"db": "shop", "schema": "dbo", "table": "Items", "commit_lsn": "0000002c:00000a38:0003",
                       "snapshot": "false"},
            "tableChanges": [{"type": kind, "id": "shop.dbo.Items",
                              "table": {"primaryKeyColumnNames": keys, "columns": columns}}]}


def test_a_capture_instance_creates_the_table_as_data_events_name_it():
    columns = [column("ID", "int identity", 1, optional=False, autoIncremented=True, length=10, scale=0),
               column("Price", "money", 2, length=19, scale=4), column("At", "datetime2", 3, length=27, scale=7)]
    [change] = changes_from_schema_event(schema_change("CREATE", columns, ["ID"]), connector="c",
                                         connector_type="sqlserver", letter_casing="lowercase",
                                         destination_schema=None)
    assert (change.kind, change.source_table, change.schema, change.name) == ("create", "dbo.Items", "dbo", "items")
    assert change.table.source_id == "dbo.Items" and change.table.primary_key == ("id",)
    assert [(c.name, c.pg_type) for c in change.table.columns] == [
        ("id", "integer"), ("price", "numeric(19,4)"), ("at", "timestamp(6) without time zone")]
    assert change.column_renames == () and change.table.unique_keys == ()


def test_a_new_capture_instance_adds_drops_and_retypes_by_comparison_and_a_keyless_table_has_no_key():
    columns = [column("ID", "int", 1, optional=False, length=10, scale=0),
               column("Qty", "bigint", 2, length=19, scale=0), column("Note", "nvarchar", 3, length=50)]
    [change] = changes_from_schema_event(schema_change("ALTER", columns, []), connector="c",
                                         connector_type="sqlserver", letter_casing="lowercase",
                                         destination_schema=None)
    assert change.table.primary_key == () and change.column_renames == ()
    statements = [s.as_string(None) for s in alter_table_sql(
        change.table, {"id": "integer", "qty": "integer", "gone": "text"}, existing_primary_key=None)]
    assert any('ADD COLUMN IF NOT EXISTS "note" character varying(50)' in s for s in statements)
    assert any('ALTER COLUMN "qty" TYPE bigint' in s for s in statements)
    assert any('DROP COLUMN' in s and '"gone"' in s for s in statements)
