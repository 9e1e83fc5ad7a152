"""A quiet connector on a busy server: its run's engine starts where the change checks read to over the other
databases' events, not at the connector's last captured change, so a run with a small budget applies a change
that follows millions of other databases' binlog events; and a run that ends on its budget while its reader goes
through them leaves its offset where the reader got to (Debezium's heartbeat), so the next run starts further on."""

from __future__ import annotations

import json

import pytest

from cdc_pipeline.config import load_config
from cdc_pipeline.ops import pending
from tests.helpers.mariadb_source import Pipeline

pytestmark = pytest.mark.integration

# Five binlog events each (GTID, annotation, table map, rows, XID): more than a run of BUDGET_SECONDS reads here
# from the connector's last change (Debezium's reader takes about 400,000 events a second on this machine), fewer
# than the checks read in half a minute.
FOREIGN_TRANSACTIONS = 600_000
BUDGET_SECONDS = 5


def _elsewhere(pipeline: Pipeline) -> str:
    """A table of another database of the same server, which the connector does not capture."""
    other = f"elsewhere_{pipeline.name}"
    pipeline.mariadb.execute([f"CREATE DATABASE IF NOT EXISTS `{other}`",
                              f"CREATE TABLE IF NOT EXISTS `{other}`.log (id INT AUTO_INCREMENT PRIMARY KEY, v TEXT)"])
    return f"`{other}`.log"


def _write_elsewhere(pipeline: Pipeline, table: str, transactions: int) -> None:
    """Commits `transactions` one-row inserts into `table`, in one round trip (a loop run by the server)."""
    pipeline.mariadb.execute(f"BEGIN NOT ATOMIC DECLARE i INT DEFAULT 0; WHILE i < {transactions} DO "
                             f"INSERT INTO {table} (v) VALUES ('written elsewhere'); SET i = i + 1; END WHILE; END")


def _engine_offset(pipeline: Pipeline) -> dict:
    return json.loads(pipeline.dest_query("SELECT offset_value FROM cdc.debezium_offsets WHERE connector = %s",
                                          (pipeline.name,))[0][0])


def _source_checked(pipeline: Pipeline) -> dict:
    return pipeline.dest_query("SELECT source_checked FROM cdc.connector_state WHERE connector = %s",
                               (pipeline.name,))[0][0]


def _quiet_spell(pipeline: Pipeline, checks: bool = True) -> None:
    """The connector's last change, then the other database's transactions, read to the binlog's end by change
    checks as the sensor's would be (each reads for 5 s at most and records how far it read)."""
    elsewhere = _elsewhere(pipeline)
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, v TEXT)"])
    pipeline.write_config(tables=[f"{pipeline.source_db}.items"])
    pipeline.sync()
    pipeline.source(["INSERT INTO items VALUES (1, 'before the quiet spell')"])
    assert pipeline.sync()["inserts"] == 1
    _write_elsewhere(pipeline, elsewhere, FOREIGN_TRANSACTIONS)
    if not checks:
        return
    config = load_config()
    connector = config.connector(pipeline.name)
    for _ in range(30):
        checked = pending.check(connector, config.destination)
        if checked.caught_up:
            break
        assert "was not read to its end" in checked.reason, checked
    assert checked.caught_up, checked


def test_a_run_starts_where_the_checks_read_to_and_applies_a_change_behind_millions_of_events(pipeline: Pipeline):
    _quiet_spell(pipeline)
    pipeline.source(["INSERT INTO items VALUES (2, 'after the quiet spell')"])
    pipeline.write_config(tables=[f"{pipeline.source_db}.items"], max_seconds_per_run=BUDGET_SECONDS)

    run = pipeline.sync()

    assert run["inserts"] == 1, f"the change after the quiet spell was not applied within the run's budget: {run}"
    pipeline.assert_same("items")


def test_a_run_out_of_budget_among_other_databases_events_leaves_its_offset_further_on(pipeline: Pipeline):
    _quiet_spell(pipeline, checks=False)
    last_change = _engine_offset(pipeline)
    pipeline.write_config(tables=[f"{pipeline.source_db}.items"], max_seconds_per_run=BUDGET_SECONDS)

    run = pipeline.sync()

    assert run.get("budget_spent") and run["inserts"] == 0, run
    moved = _engine_offset(pipeline)
    assert (moved["file"], moved["pos"]) > (last_change["file"], last_change["pos"]), \
        f"the run's heartbeats left no offset past the last change {last_change}: {moved}"
