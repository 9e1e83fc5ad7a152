"""A run that ends idle while Debezium's log reader is still inside a large transaction of tables it does not
capture records where the reader is, not the server's end: the change check then finds the captured change that
follows the transaction, which the run never reached."""

from __future__ import annotations

import pytest

from cdc_pipeline.config import load_config
from cdc_pipeline.ops import pending
from tests.helpers.mariadb_source import Pipeline

pytestmark = pytest.mark.integration

UNCAPTURED_ROWS = 1_500_000


def test_a_run_ending_behind_an_uncaptured_transaction_strands_no_change(pipeline: Pipeline):
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v TEXT)",
                     "CREATE TABLE bulk (id INT PRIMARY KEY, pad CHAR(40))", "INSERT INTO items VALUES (1, 'a')"])
    pipeline.write_config(tables=[f"{pipeline.source_db}.items"], idle_timeout_seconds=0.4)
    pipeline.sync()
    # Behind the connector's position: one large transaction of a table it does not capture, then a captured change.
    pipeline.source([f"INSERT INTO bulk SELECT seq, 'x' FROM seq_1_to_{UNCAPTURED_ROWS}",
                     "INSERT INTO items VALUES (2, 'b')"])
    summary = pipeline.sync()
    if summary["inserts"] == 1:
        pytest.skip("the log reader went through the large transaction within the idle timeout: nothing to strand")
    config = load_config()
    checked = pipeline.dest_query("SELECT source_checked FROM cdc.connector_state WHERE connector = %s",
                                  (pipeline.name,))[0][0]
    found = pending.check(config.connector(pipeline.name), config.destination)
    assert found.work, f"the change check sees the captured change past {checked}: {found.reason}"
    pipeline.sync()
    pipeline.assert_same("items")
