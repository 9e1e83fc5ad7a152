"""A run whose engine is quiet while its log reader is still inside a large transaction of tables it does not capture
goes on until the reader has read the source's log up to where it ended when the run went quiet: the captured change
behind the transaction is applied, and the position recorded for the change check strands nothing."""

from __future__ import annotations

import pytest

from cdc_pipeline.config import load_config
from cdc_pipeline.ops import pending
from tests.helpers.mariadb_source import Pipeline

pytestmark = pytest.mark.integration

UNCAPTURED_ROWS = 1_500_000


def test_a_run_reads_past_an_uncaptured_transaction_before_it_ends_idle(pipeline: Pipeline):
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v TEXT)",
                     "CREATE TABLE bulk (id INT PRIMARY KEY, pad CHAR(40))", "INSERT INTO items VALUES (1, 'a')"])
    pipeline.write_config(tables=[f"{pipeline.source_db}.items"], idle_timeout_seconds=0.4)
    pipeline.sync()
    # Behind the connector's position: one large transaction of a table it does not capture, then a captured change.
    pipeline.source([f"INSERT INTO bulk SELECT seq, 'x' FROM seq_1_to_{UNCAPTURED_ROWS}",
                     "INSERT INTO items VALUES (2, 'b')"])
    summary = pipeline.sync()
    assert summary["inserts"] == 1, f"the run read past the transaction and applied the change behind it: {summary}"
    pipeline.assert_same("items")
    config = load_config()
    found = pending.check(config.connector(pipeline.name), config.destination)
    assert not found.work, found.reason
