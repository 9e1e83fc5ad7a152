"""A MariaDB run ends idle only once every change its log reader read has reached it: records the engine took from
Debezium's queue and still holds (converting them; a loaded machine held them for seconds) are in neither queue, and
a run that ended then recorded its check past changes it never applied, which the next run would skip."""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers.mariadb_source import Pipeline
from tests.helpers.runs import start_sync

pytestmark = pytest.mark.integration

# Test only (the runner's `TaskPolls`): the engine holds every batch it polled this long before handing it over.
SLOW_HANDOVER_ENV = "CDC_PIPELINE_FAULT_SLOW_HANDOVER_MS"


def test_a_run_waits_for_changes_the_engine_holds_past_its_idle_timeout(pipeline: Pipeline):
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v INT)", "INSERT INTO items VALUES (1, 1)"])
    pipeline.sync()
    pipeline.source(["INSERT INTO items VALUES (2, 2)", "UPDATE items SET v = 10 WHERE id = 1"])

    # The engine holds what it polled 1.5 times the idle timeout (2 s): the run must not take that for quiet.
    run = start_sync(pipeline.name, env={**pipeline.env, SLOW_HANDOVER_ENV: "3000"}, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT)
    output, _ = run.communicate(timeout=600)
    assert run.returncode == 0, output
    assert pipeline.dest_rows("items") == [(1, 10), (2, 2)], output

    # Nothing was recorded as read past what was applied: a change after it is applied too, and nothing twice.
    pipeline.source("INSERT INTO items VALUES (3, 3)")
    pipeline.sync()
    pipeline.assert_same("items")
