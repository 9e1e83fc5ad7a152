"""A MariaDB/MySQL connector's Debezium properties: the database include list as spelled, and the binlog client's
reconnect after a source restart."""

from __future__ import annotations

import dataclasses

from cdc_pipeline.sources.mariadb import debezium_properties
from tests.unit.sources.mariadb.connectors import connector_of


def test_the_database_include_list_matches_the_name_as_spelled():
    # Debezium reads it as a regular expression: `$` would end the name, `.` match any character.
    connector = dataclasses.replace(connector_of("mariadb"), database="shop$1.a")
    assert debezium_properties(connector)["database.include.list"] == "shop\\$1\\.a"


def test_by_default_a_run_waits_out_the_binlog_clients_reconnect_after_a_source_restart():
    # The keep-alive thread reconnects one to two intervals after the loss, then connects within connect.timeout.ms
    # (tests/faults/test_faults.py restarts a source with a shorter interval, so as not to wait for it).
    connector = connector_of("mariadb")
    properties = debezium_properties(connector)
    reconnect_seconds = (2 * int(properties["connect.keep.alive.interval.ms"])
                         + int(properties["connect.timeout.ms"])) / 1000
    assert properties["connect.keep.alive.interval.ms"] == "60000"
    assert connector.source_lost_timeout_seconds > reconnect_seconds
