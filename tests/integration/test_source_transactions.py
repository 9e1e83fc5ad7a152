"""Whole source transactions: a destination transaction ends only where a source transaction ends, a source
transaction larger than a group is applied in one destination transaction that spans groups, and a kill inside it
leaves the destination at the previous source commit. MariaDB and PostgreSQL alike.

A "bank" of accounts whose every source transaction keeps the total: a deferred constraint trigger on the
destination table records, at each destination commit that changed it, the total it committed. Groups are tiny
(`batch_size` 4, `apply_batch_events` 10), so a whole-table transaction of 40 changes spans several of them and a
transfer of two changes straddles a group's bound."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from cdc_pipeline import faults
from tests.helpers.commit_audit import audit_commits, totals_committed
from tests.helpers.runs import kill_at

pytestmark = pytest.mark.integration

ACCOUNTS = 40
TOTAL = 100 * ACCOUNTS


def _postgres(pipeline) -> bool:
    return not hasattr(pipeline, "mariadb")


def _transaction(pipeline, changes: str) -> str:
    if _postgres(pipeline):
        return f"BEGIN; {changes} COMMIT;"
    return f"BEGIN NOT ATOMIC START TRANSACTION; {changes} COMMIT; END"


def _bank(pipeline, **settings) -> None:
    """The accounts (100 each), loaded by a first run; then the destination's audit of its commits."""
    pipeline.write_config(batch_size=4, apply_batch_events=10, tables=[pipeline.table_id("accounts")], **settings)
    pipeline.source(["CREATE TABLE accounts (id INT PRIMARY KEY, balance INT NOT NULL)",
                     f"INSERT INTO accounts SELECT seq, 100 FROM {pipeline.numbers(ACCOUNTS)}"])
    pipeline.sync()
    audit_commits(pipeline.dest_dsn, f'"{pipeline.dest_schema}".accounts')


def _whole_table(pipeline, step: int) -> str:
    """One transaction of every account: the even ones gain `step`, the odd ones lose it."""
    return _transaction(pipeline, f"UPDATE accounts SET balance = balance + {step} WHERE id % 2 = 0; "
                                  f"UPDATE accounts SET balance = balance - {step} WHERE id % 2 = 1;")


def _transfer(pipeline, source: int, target: int, amount: int) -> str:
    return _transaction(pipeline, f"UPDATE accounts SET balance = balance - {amount} WHERE id = {source}; "
                                  f"UPDATE accounts SET balance = balance + {amount} WHERE id = {target};")


def _workload(pipeline) -> list[str]:
    """Two whole-table transactions among transfers."""
    transfers = [_transfer(pipeline, 1 + index % ACCOUNTS, 1 + (index * 7 + 3) % ACCOUNTS, 1 + index % 5)
                 for index in range(12)]
    return [_whole_table(pipeline, 3), *transfers[:6], _whole_table(pipeline, 5), *transfers[6:]]


def _totals_committed(pipeline) -> list[int]:
    return totals_committed(pipeline.dest_dsn)


def _dest_total(pipeline) -> int:
    return int(pipeline.dest_query(f'SELECT sum(balance) FROM "{pipeline.dest_schema}".accounts')[0][0])


def test_transactions_larger_than_a_group_commit_once_and_no_commit_shows_half_of_one(any_source, caplog):
    pipeline = any_source
    _bank(pipeline)
    pipeline.source(_workload(pipeline))

    with caplog.at_level(logging.INFO, logger="cdc_pipeline"):
        pipeline.sync()

    pipeline.assert_same("accounts")
    totals = _totals_committed(pipeline)
    assert totals, "the run's commits changed the audited table"
    assert set(totals) == {TOTAL}, f"a destination commit held part of a source transaction: totals {totals}"
    spanned = [record.getMessage() for record in caplog.records if "spanned" in record.getMessage()]
    assert len(spanned) == 2, f"each whole-table transaction spans groups and commits once: {spanned}"
    for message in spanned:
        events, groups = map(int, re.search(r"of (\d+) events spanned (\d+) groups", message).groups())
        assert events >= ACCOUNTS and groups >= 3, message


def test_a_kill_inside_a_spanning_transaction_leaves_the_previous_commit_and_the_next_run_applies_it(
        any_source, tmp_path: Path):
    pipeline = any_source
    _bank(pipeline)
    pipeline.source(_workload(pipeline))

    # The third group's transaction is a savepoint inside the first whole-table transaction's span.
    kill_at(pipeline.name, f"{faults.IN_TRANSACTION}@3", tmp_path / "paused", env=getattr(pipeline, "env", None))

    assert _dest_total(pipeline) == TOTAL
    assert set(_totals_committed(pipeline)) <= {TOTAL}
    assert all(balance == 100 for _, balance in pipeline.dest_rows("accounts")), \
        "the destination is at the commit before the transaction the kill cut"
    pipeline.sync()
    pipeline.assert_same("accounts")
    assert set(_totals_committed(pipeline)) == {TOTAL}
