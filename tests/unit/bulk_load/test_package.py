"""The bulk load's package is an address, not a load: importing it (as an operator's command that only reads a load's
bookkeeping does) brings in neither its Spark engine nor Spark."""

from __future__ import annotations

import subprocess
import sys

ENGINE = {"cdc_pipeline.bulk_load.engine", "cdc_pipeline.bulk_load.chunk_plan", "cdc_pipeline.bulk_load.copy_plan",
          "cdc_pipeline.bulk_load.slices"}


def test_importing_the_package_brings_in_no_engine_nor_spark():
    child = subprocess.run([sys.executable, "-c", "import sys, cdc_pipeline.bulk_load; print(*sys.modules)"],
                           capture_output=True, text=True, check=True)
    loaded = set(child.stdout.split())
    assert "cdc_pipeline.bulk_load" in loaded
    assert not loaded & ENGINE and "pyspark" not in loaded
