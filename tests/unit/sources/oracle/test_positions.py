"""An Oracle connector's positions: up to where an offset says changes were processed (`check_position`), from
which the change check mines."""

from __future__ import annotations

from cdc_pipeline.sources import oracle
from tests.unit.sources.oracle.test_checks import APPLIED


def test_a_finished_snapshot_is_a_position_to_check_from(server):
    finished = {"commit_scn": "289120:1:", "snapshot_scn": "289120", "scn": "289120", "snapshot_completed": True}
    assert oracle.check_position(finished) == (289120, 289120)
    assert oracle.check_position(APPLIED) == (289120, 289100)
    assert oracle.check_position({"scn": "1001", "snapshot": "INITIAL", "snapshot_completed": False}) is None
    assert oracle.check_position({"scn": "1001", "commit_scn": None}) == (1000, 1001), "no commit handled yet"
