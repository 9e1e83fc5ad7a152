"""The error strategies on a poison event (a value the destination refuses): `exit` stops at it, `retry` gives
up after its bound, `skip` sets exactly that event aside as a dead letter and applies the rest; then the
dead-letter commands retry (after the cause is fixed) and discard."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging

import psycopg
import pytest

from cdc_pipeline.ops import cli

pytestmark = pytest.mark.integration

ORDERS = "CREATE TABLE orders (id INT PRIMARY KEY, qty INT NOT NULL, note VARCHAR(20))"
# The destination refuses quantities of 1000 and more: an event carrying one is poison there.
LIMIT = 'ALTER TABLE {schema}.orders ADD CONSTRAINT qty_limit CHECK (qty < 1000)'
POISON_ID = 123
STATS = ("inserts", "updates", "deletes", "bad_events")
CHANGES = [
    f"INSERT INTO orders SELECT seq, IF(seq = {POISON_ID}, 5000, seq % 50), CONCAT('n', seq) FROM seq_1_to_200",
    "UPDATE orders SET qty = qty + 1, note = 'updated' WHERE id % 10 = 0",
    "DELETE FROM orders WHERE id <= 5",
]


def _failure(pipeline) -> Exception:
    with pytest.raises(Exception) as failed:
        pipeline.sync()
    return cli._root_cause(failed.value)


def _assert_stopped_before_the_poison(pipeline) -> None:
    """The batches before the poison's committed, its own batch was rolled back: the destination holds some of the
    rows inserted before it, as inserted, and nothing from the poison on."""
    inserted = {(i, i % 50, f"n{i}") for i in range(1, POISON_ID)}
    assert set(pipeline.dest_rows("orders")) <= inserted


def _letters(pipeline, *args: str) -> list[dict]:
    return json.loads(_cli(pipeline, "list", *args, "--json"))


def _cli(pipeline, action: str, *args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["dead-letters", action, pipeline.name, *args]) == 0
    return out.getvalue()


def test_a_poison_event_under_each_error_strategy(pipeline, caplog):
    pipeline.source(ORDERS)
    pipeline.sync()
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        conn.execute(LIMIT.format(schema=f'"{pipeline.source_db}"'))
    pipeline.source(CHANGES)

    # exit: the batch is rolled back, the run fails naming connector, table, constraint and position; the
    # connector's state keeps the error; the next run stops at the same place.
    pipeline.write_config(error_strategy="exit")
    for _ in range(2):
        error = _failure(pipeline)
        message = str(error)
        assert pipeline.name in message and "orders" in message and "qty_limit" in message
        assert "mariadb-bin" in message or "pos" in message, "the error names the source position"
        _assert_stopped_before_the_poison(pipeline)
    state = pipeline.dest_query("SELECT state, last_error FROM cdc.connector_state WHERE connector = %s",
                                (pipeline.name,))
    assert state[0][0] == "stopped" and "qty_limit" in state[0][1]

    # retry: applied again with backoff, then the run fails with the attempts it made.
    pipeline.write_config(error_strategy="retry", retry_attempts=2, retry_backoff_seconds=0.1)
    with caplog.at_level(logging.WARNING, logger="cdc_pipeline.cycle"):
        error = _failure(pipeline)
    assert "failed 2 times" in str(error) and "qty_limit" in str(error)
    assert "attempt 1 of 2" in caplog.text
    _assert_stopped_before_the_poison(pipeline)

    # skip: exactly the poison event is set aside; the rest of the batch applies, in order.
    pipeline.write_config(error_strategy="skip")
    summary = pipeline.sync()
    assert summary["bad_events"] == 1
    expected = [row for row in pipeline.source_rows("orders") if row[0] != POISON_ID]
    assert pipeline.dest_rows("orders") == expected
    letters = _letters(pipeline)
    assert len(letters) == 1
    letter = letters[0]
    assert (letter["source_table"], letter["op"], letter["status"]) == (f"{pipeline.source_db}.orders", "c", "pending")
    assert "qty_limit" in letter["error"] and letter["position"].get("pos")
    raw_event = json.loads(letter["raw_event"])
    # The whole line as the runner writes it (Spark parsed a shorter one: row images only).
    assert raw_event["value"]["after"]["qty"] == 5000 and raw_event["key"] == {"id": POISON_ID}
    assert raw_event["value"]["source"]["table"] == "orders" and str(raw_event["value"]["source"]["pos"]) == str(
        letter["position"]["pos"]) and raw_event["offset"]["file"]
    # Set aside, it breaks its source transaction's atomicity: the letter names the transaction, as Debezium does.
    assert letter["position"]["transaction"] == raw_event["value"]["transaction"]["id"]
    stats = pipeline.stats(STATS)
    assert stats == {"inserts": 199, "updates": 20, "deletes": 5, "bad_events": 1}
    assert "qty_limit" in _cli(pipeline, "show", str(letter["id"]))

    # The operator fixes the cause and retries: the event applies once, and counts as an insert.
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{pipeline.source_db}".orders DROP CONSTRAINT qty_limit')
    assert f"applied dead letters {letter['id']}" in _cli(pipeline, "retry")
    pipeline.assert_same("orders")
    assert pipeline.stats(STATS) == {"inserts": 200, "updates": 20, "deletes": 5, "bad_events": 0}
    assert _letters(pipeline) == []
    assert "no pending dead letters" in _cli(pipeline, "retry")

    # A later poison event is discarded: it stays listed, counted as a bad event, never applied.
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        conn.execute(LIMIT.format(schema=f'"{pipeline.source_db}"') + " NOT VALID")
    pipeline.source(["INSERT INTO orders VALUES (900, 7000, 'late poison'), (901, 1, 'fine')"])
    assert pipeline.sync()["bad_events"] == 1
    (late,) = _letters(pipeline)
    _cli(pipeline, "discard", str(late["id"]))
    assert _letters(pipeline) == []
    assert [row["status"] for row in _letters(pipeline, "--all")] == ["retried", "discarded"]
    assert [row for row in pipeline.source_rows("orders") if row[0] != 900] == pipeline.dest_rows("orders")
    assert pipeline.stats(STATS)["bad_events"] == 1


def test_dagster_retries_a_failed_run_as_the_connector_says(pipeline):
    from dagster import DagsterInstance
    from dagster._daemon.auto_run_reexecution.auto_run_reexecution import get_reexecution_strategy, should_retry

    from assets.definitions import build_definitions
    from cdc_pipeline.config import load_config

    pipeline.source(ORDERS)
    pipeline.sync()
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        conn.execute(LIMIT.format(schema=f'"{pipeline.source_db}"'))
    pipeline.source(CHANGES)

    decisions = {}
    for strategy in ("retry", "exit"):
        pipeline.write_config(error_strategy=strategy, retry_attempts=1)
        job = build_definitions(load_config(pipeline.config_path)).resolve_job_def(f"sync_{pipeline.name}")
        # The project's instance settings (dagster_home/dagster.yaml) enable run retries.
        with DagsterInstance.ephemeral(settings={"run_retries": {"enabled": True}}) as instance:
            result = job.execute_in_process(instance=instance, raise_on_error=False)
            run = instance.get_run_by_id(result.run_id)
            decisions[strategy] = (result.success, should_retry(run, instance), run.tags.get("dagster/max_retries"),
                                   get_reexecution_strategy(run, instance))
    retry_strategy = decisions["retry"][3]
    assert decisions["retry"][:3] == (False, True, "2") and retry_strategy.value == "ALL_STEPS", \
        "under retry the daemon launches the failed run again, all of its steps"
    assert decisions["exit"] == (False, False, "0", None), "under exit the next scheduled run retries the batch"


def test_a_retried_dead_letter_follows_the_mapping_rules(pipeline):
    db = pipeline.source_db
    pipeline.write_config(error_strategy="skip")
    pipeline.source(ORDERS)
    # The table is renamed and its note masked by the rules: a retried event must land there, masked, as well.
    for rule in (("table", f"{db}.orders", "sales.purchases"), ("transform", f"{db}.orders.note", "left(md5(%d), 12)")):
        assert cli.main(["objmap", "add", pipeline.name, *rule]) == 0
    pipeline.sync()
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        conn.execute(LIMIT.format(schema="sales").replace(".orders", ".purchases"))
    pipeline.source("INSERT INTO orders VALUES (1, 5000, 'secret-1'), (2, 3, 'secret-2')")
    summary = pipeline.sync()
    assert summary["bad_events"] == 1, [letter["error"] for letter in _letters(pipeline)]
    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE sales.purchases DROP CONSTRAINT qty_limit")

    _cli(pipeline, "retry")

    rows = pipeline.dest_query("SELECT id, qty, note FROM sales.purchases ORDER BY id")
    assert rows == [(1, 5000, hashlib.md5(b"secret-1").hexdigest()[:12]),
                    (2, 3, hashlib.md5(b"secret-2").hexdigest()[:12])]
    assert not pipeline.dest_table_exists("orders"), "nothing under the default name"
