"""`cdc-pipeline bench --databases N` on a tiny shape (3 tenant databases of 2 tables, a 10 s trickle): under Dagster's
daemon every tenant table ends exact, every trickled row arrives, no run fails, the runs' processes are forked from
the code server's forkserver, and the daemon's process tree is measured (the figures themselves are for the command's
output, never asserted). The bench starts its own servers."""

import shutil
import tempfile
from pathlib import Path

import pytest

from cdc_pipeline.testing import bench_tenants

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("per_database", [False, True], ids=["one connector", "connector per database"])
def test_bench_tenants_makes_every_tenant_exact_and_applies_the_trickle(per_database):
    # A short directory of its own: the bench's PostgreSQL sockets are in it, and pytest-xdist's tmp_path is too deep
    # for a Unix socket's path (107 bytes at most).
    work = Path(tempfile.mkdtemp(prefix="tenants-"))
    try:
        result = bench_tenants.run_tenants(3, 2, trickle_seconds=10, trickle_interval=2, per_database=per_database,
                                           tail_seconds=40, exact_timeout=120, keep=work / "work")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    assert result["connectors"] == (3 if per_database else 1)
    assert result["tables"] == result["tables_exact"] == 6 and result["exact_seconds"] is not None
    trickle = result["trickle"]
    assert trickle["rows"] == 5 and trickle["arrived"] == 5 and trickle["not_applied"] == 0
    assert result["runs"]["launched"] >= result["connectors"] and result["runs"]["failed"] == 0
    assert result["peak_rss_mb"] > 0 and result["peak_processes"] > 1
    assert result["cpu_seconds"].get("daemon", 0) > 0 and result["cpu_seconds"].get("code server", 0) > 0
    assert result["runs"]["launch_p50"] > 0
    # The code server forks the runs' processes from its forkserver (resources.run_processes), none spawned.
    assert result["run_processes"]["forked"] >= result["connectors"] and result["run_processes"]["spawned"] == 0
    assert 0 < result["peak_pss_mb"] < result["peak_rss_mb"]
    assert ("new_tenant" in result) is not per_database
    assert "3 tenant databases x 2 tables" in bench_tenants.describe(result)
