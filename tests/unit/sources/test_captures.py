"""Which source tables belong to a connector (`sources.captures`): its source type's rule (`replicates` of the source
module), then its `tables` list."""

from __future__ import annotations

import pytest

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.sources import captures


def _connector(connector_type: str, **fields) -> ConnectorConfig:
    return ConnectorConfig(name="shop", type=connector_type, hostname="h", user="u", password="p", database="shop",
                           **fields)


@pytest.mark.parametrize("connector_type", ["mariadb", "mysql", "postgres", "sqlserver", "oracle"])
def test_a_listed_table_is_captured_and_an_unlisted_one_not(connector_type):
    connector = _connector(connector_type, tables=["shop.orders"])
    assert captures(connector, "shop.orders")
    assert not captures(connector, "shop.customers")
    assert captures(_connector(connector_type), "shop.customers")


@pytest.mark.parametrize("connector_type", ["mariadb", "mysql"])
def test_a_binlog_connector_captures_only_its_database(connector_type):
    connector = _connector(connector_type)
    assert captures(connector, "shop.orders")
    assert captures(connector, "shop.a.b")  # table `a.b` of the connector's database
    assert not captures(connector, "other.orders")


@pytest.mark.parametrize("connector_type", ["sqlserver", "oracle"])
def test_other_source_types_capture_every_table_they_report(connector_type):
    assert captures(_connector(connector_type), "dbo.orders")
