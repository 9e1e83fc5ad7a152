"""`cdc-pipeline bench --databases N` on a tiny shape (3 tenant databases of 2 tables, a 10 s trickle): under Dagster's
daemon every tenant table ends exact, every trickled row arrives, no run fails, the runs' processes are forked from
the code server's forkserver, and the daemon's process tree is measured (the figures themselves are for the command's
output, never asserted). The bench starts its own servers."""

import shutil
import tempfile
from pathlib import Path

import pytest

from assets.change_sensor import CHANGES_SENSOR_NAME, ONE_SENSOR_BEYOND_CONNECTORS
from cdc_pipeline.testing import bench_tenants

pytestmark = pytest.mark.integration


# A connector per database: one more than the change sensors of one connector each, so that one sensor checks them all.
@pytest.mark.parametrize("per_database", [False, True], ids=["one connector", "connector per database"])
def test_bench_tenants_makes_every_tenant_exact_and_applies_the_trickle(per_database):
    databases, tables = (ONE_SENSOR_BEYOND_CONNECTORS + 1, 1) if per_database else (3, 2)
    # A short directory of its own: the bench's PostgreSQL sockets are in it, and pytest-xdist's tmp_path is too deep
    # for a Unix socket's path (107 bytes at most).
    work = Path(tempfile.mkdtemp(prefix="tenants-"))
    try:
        result = bench_tenants.run_tenants(databases, tables, trickle_seconds=10, trickle_interval=2,
                                           per_database=per_database, tail_seconds=40, exact_timeout=120,
                                           keep=work / "work")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    assert result["connectors"] == (databases if per_database else 1)
    assert result["tables"] == result["tables_exact"] == databases * tables and result["exact_seconds"] is not None
    # The runs are launched by the change sensor(s): with a connector per database, the one sensor of them all.
    sensors = result["runs"]["by_sensor"]
    if per_database:
        assert sensors.get(CHANGES_SENSOR_NAME, 0) >= databases, sensors
        assert not [name for name in sensors if name.endswith("_on_changes")], sensors
    else:
        assert sensors.get("sync_tenants_on_changes", 0) >= 1, sensors
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
    assert f"{databases} tenant databases x {tables} tables" in bench_tenants.describe(result)
