"""A streamed DROP DATABASE, whose Debezium event names no table, read from its DDL text."""

from __future__ import annotations

import pytest

from cdc_pipeline.convert.ddl import dropped_database


@pytest.mark.parametrize("ddl, database", [
    ("DROP DATABASE tenant_7", "tenant_7"),
    ("drop schema if exists `tenant 8`;", "tenant 8"),
    ("DROP DATABASE `we``ird`", "we`ird"),
    ("DROP TABLE tenant_7.orders", None),
    ("DROP DATABASE a; DROP DATABASE b", None),
])
def test_the_dropped_database_is_read_from_the_statement(ddl: str, database: str | None) -> None:
    assert dropped_database({"ddl": ddl, "source": {"snapshot": "false"}}, "mariadb") == database


def test_the_snapshots_own_drops_and_other_sources_are_not_a_drop() -> None:
    assert dropped_database({"ddl": "DROP DATABASE IF EXISTS shop", "source": {"snapshot": "true"}}, "mysql") is None
    assert dropped_database({"ddl": "DROP DATABASE shop", "source": {}}, "postgres") is None
