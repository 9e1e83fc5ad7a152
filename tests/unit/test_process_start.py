"""A run's `first_row_seconds` counts from its process's start: that start, read from /proc, is the moment the
process was spawned to within the kernel's clock tick, not up to a second early (the boot time in whole seconds)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from cdc_pipeline.cycle import process_started_epoch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="read from /proc")


def test_a_process_start_is_when_it_was_spawned():
    starts = []
    for _ in range(3):
        spawned = time.time()
        child = subprocess.run([sys.executable, "-c", "from cdc_pipeline.cycle import process_started_epoch; "
                                "print(repr(process_started_epoch()))"], capture_output=True, text=True, check=True)
        ended = time.time()
        start = float(child.stdout)
        starts.append(start)
        # The clock tick is 10 ms; the child starts after the parent read its clock and before it ended.
        assert spawned - 0.02 <= start <= ended, (spawned, start, ended)
    assert process_started_epoch() < min(starts)
