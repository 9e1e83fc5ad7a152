"""Quiet by default: a run prints no third-party warning a user cannot act on (ANTLR's version check of
Debezium's DDL parser against Spark's ANTLR runtime); `sync -v` shows them."""

from __future__ import annotations

import pytest

from tests.helpers.runs import start_sync

pytestmark = pytest.mark.integration


def _stderr(pipeline, *args: str) -> str:
    run = start_sync(pipeline.name, *args, env=pipeline.env)
    _, stderr = run.communicate(timeout=600)
    assert run.returncode == 0, stderr
    return stderr


def test_a_sync_prints_no_antlr_version_warning_unless_verbose(pipeline):
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v INT)", "INSERT INTO items VALUES (1, 1)"])
    quiet = _stderr(pipeline)
    pipeline.source("CREATE TABLE more (id INT PRIMARY KEY)")  # DDL text for Debezium's parser in the stream
    verbose = _stderr(pipeline, "-v")

    assert "ANTLR" not in quiet, quiet
    assert "ANTLR Tool version" in verbose, "the verbose run shows the warning the quiet one leaves out"
    pipeline.assert_same("items")
