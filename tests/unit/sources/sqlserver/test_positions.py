"""A SQL Server connector's positions against SQL Server's recorded answers: whether the change tables still hold
the changes after a connector's offset (`lost_position`), which a run asks before its engine starts."""

from __future__ import annotations

from cdc_pipeline.sources import captures, sqlserver
from tests.fixtures.recorded import closed_port
from tests.unit.sources.sqlserver.test_checks import APPLIED, PASSWORD, connector


def test_a_run_is_told_of_changes_the_cleanup_job_removed_after_its_offset(server):
    """What the fetch cycle asks before its engine starts (`sources.lost_position`): Debezium's connector would read
    on from the change table's oldest row without a word."""
    source = connector()
    server.scenario = "out_of_retention"
    lost = sqlserver.lost_position(source, APPLIED, lambda table: captures(source, table))
    assert "fell out of the change tables' retention" in lost.held and "dbo_orders" in lost.held
    assert lost.first_line("erp").startswith(f"connector 'erp': the source no longer holds the connector's position "
                                             f"{lost.position}: ")
    assert lost.first_line("erp").endswith("; recover with `cdc-pipeline restart erp always`")
    server.scenario = "new_capture_instance"
    assert sqlserver.lost_position(source, APPLIED, lambda table: captures(source, table)) is None


def test_a_source_that_cannot_be_read_leaves_the_engine_to_say_so(caplog):
    from cdc_pipeline.sources import lost_position

    source = connector(hostname="127.0.0.1", port=closed_port())
    assert lost_position(source, APPLIED) is None
    assert "cannot check that the source still holds the connector's position" in caplog.text and PASSWORD not in caplog.text
