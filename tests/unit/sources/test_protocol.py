"""What every source package holds (`protocol.Source`), so that adding a source type is adding one package of the same
rooms (and its tests): the stages ask `sources.module_for(type)` for these, never test the type themselves."""

from __future__ import annotations

import pytest

from cdc_pipeline import sources
from cdc_pipeline.config import CONNECTOR_TYPES
from cdc_pipeline.sources import protocol
from cdc_pipeline.sources.offset_shape import OffsetShape

# What a source package must have, and what it has when it does that part (the bulk snapshot's reads aside).
REQUIRED = ("OFFSET_SHAPE", "DDL_EVENTS", "debezium_properties", "replicates", "source_partition")
TYPE_MAP = ("TYPE_MAPS", "TYPE_MAP_NOTES", "IMPLICIT_DEFAULTS", "column_type", "always_nullable")


@pytest.mark.parametrize("connector_type", CONNECTOR_TYPES)
def test_each_connector_type_has_a_source_module_with_the_required_parts(connector_type):
    module = sources.module_for(connector_type)
    assert [name for name in REQUIRED if not hasattr(module, name)] == []
    assert isinstance(module.OFFSET_SHAPE, OffsetShape)
    if hasattr(module, "TYPE_MAPS"):
        assert [name for name in TYPE_MAP if not hasattr(module, name)] == []
        assert connector_type in module.TYPE_MAPS and connector_type in module.TYPE_MAP_NOTES


@pytest.mark.parametrize("connector_type", CONNECTOR_TYPES)
def test_each_source_package_provides_every_member_of_the_protocol(connector_type):
    """A member a source lacks is set to None in its package, so no caller needs a default to find it."""
    package = sources.module_for(connector_type)
    assert [name for name in protocol.members() if not hasattr(package, name)] == []


def test_the_protocol_names_what_the_callers_read():
    assert {"OFFSET_SHAPE", "debezium_properties", "is_heartbeat_table", "ctid_split", "parse_ddl"} <= set(
        protocol.members())
