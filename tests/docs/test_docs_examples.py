"""The docs' shell examples, run as a user pastes them (with the test's connector name)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import PROJECT_ROOT

pytestmark = pytest.mark.integration

OPERATIONS = PROJECT_ROOT / "docs" / "operations.md"
ITEMS = "CREATE TABLE items (id INT PRIMARY KEY, v VARCHAR(20))"


def docs_block(heading: str) -> str:
    """The first ```sh block after a heading of docs/operations.md."""
    text = OPERATIONS.read_text()
    start = text.index(heading)
    match = re.search(r"```sh\n(.*?)```", text[start:], re.S)
    assert match, f"no shell block after {heading!r}"
    return match.group(1)


def run_block(block: str, pipeline, cwd: Path) -> subprocess.CompletedProcess:
    script = block.replace("inventory", pipeline.name)
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, **pipeline.env, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(PROJECT_ROOT)}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_backfill_example_replays_with_the_cli_and_with_dagster_one_engine_per_run(pipeline, tmp_path):
    pipeline.source([ITEMS, "INSERT INTO items VALUES (1, 'a'), (2, 'b')"])
    pipeline.sync()
    # Changes after the offset the example reads from the state: its CLI run applies them, then its Dagster run
    # replays them again.
    pipeline.source(["INSERT INTO items VALUES (3, 'c')", "UPDATE items SET v = 'B' WHERE id = 2"])

    result = run_block(docs_block("### Backfill from an offset"), pipeline, tmp_path)

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "Cannot change engine state" not in result.stderr, result.stderr[-5000:]
    starts = result.stderr.count("Engine state has changed from 'CREATING' to 'POLLING_TASKS'")
    assert starts <= 2, f"one engine per run (two runs), started {starts} times"
    pipeline.assert_same("items")
    [(inserts, updates)] = pipeline.dest_query("SELECT inserts, updates FROM cdc.stats WHERE connector = %s",
                                               (pipeline.name,))
    assert (inserts, updates) == (2, 2), "each of the two runs replayed the changes after the offset"
