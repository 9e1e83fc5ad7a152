"""Re-delivered SQL Server and Oracle events are told by their offsets, as Debezium 3.5 writes them.

SQL Server: `SqlServerOffsetContext.getOffset` writes `commit_lsn`, `change_lsn` (`Lsn.toString`: lower-case hex,
'xxxxxxxx:xxxxxxxx:xxxx'), `event_serial_no` (the records at that position so far, an update counting 2: 
`setChangePosition`). Oracle: `OracleOffsetContext.getOffset` writes `scn`, `commit_scn` (`CommitScn`, per redo
thread 'scn:thread:txid-txid', as `CommitScnTest` shows: '12345:1:23456-78901,678901:2:12345-67890'), `txId` and
`txSeq`; a transaction's records share the `commit_scn` recorded before it (`handleCommit` records its commit after
its last record)."""

from __future__ import annotations

from cdc_pipeline.decode.events import StreamRedeliveries, redelivery_test, same_stream_position
from cdc_pipeline.sources import oracle, sqlserver


def _ms(commit: str, change: str | None, serial: int) -> dict:
    return {"commit_lsn": commit, "change_lsn": change, "event_serial_no": serial}


# One transaction (commit 0x2c:0xa38:0x5) of three rows: an insert, an update (its two rows count 2), a delete;
# then the next transaction.
T1_INSERT = _ms("0000002c:00000a38:0005", "0000002c:00000a38:0002", 1)
T1_UPDATE = _ms("0000002c:00000a38:0005", "0000002c:00000a38:0003", 2)
T1_DELETE = _ms("0000002c:00000a38:0005", "0000002c:00000a38:0004", 1)
T2_INSERT = _ms("0000002c:00000a40:0003", "0000002c:00000a40:0002", 1)
# The commit LSN's high bytes decide, not the text's length or case: 0x2d > 0x2c.
T3_INSERT = _ms("0000002d:00000010:0002", "0000002d:00000010:0001", 1)


def test_sqlserver_offsets_order_by_commit_then_change_lsn_then_serial() -> None:
    places = [sqlserver.stream_order(offset) for offset in (T1_INSERT, T1_UPDATE, T1_DELETE, T2_INSERT, T3_INSERT)]
    assert places == sorted(places)
    assert len(set(places)) == 5
    # Debezium's heartbeat position without a change: change_lsn null (Lsn.NULL sorts first), serial 0.
    assert sqlserver.stream_order(_ms("0000002c:00000a38:0005", None, 0)) < places[0]
    assert sqlserver.stream_order(_ms("0000002c:00000a38:0005", "NULL", 0)) < places[0]


def test_sqlserver_records_of_earlier_transactions_and_up_to_the_applied_one_are_redelivered() -> None:
    redelivered = redelivery_test(T1_UPDATE)
    assert redelivered is not None
    assert [redelivered(offset) for offset in (T1_INSERT, T1_UPDATE, T1_DELETE, T2_INSERT, T3_INSERT)] == [
        True, True, False, False, False]
    later = redelivery_test(T2_INSERT)
    assert later(T1_DELETE) and later(T2_INSERT) and not later(T3_INSERT)


def test_sqlserver_a_transaction_whose_rows_go_down_is_taken_from_there_as_debezium_does() -> None:
    # DBZ-2329: a multi-row update of a key; the change table gives the rows with change LSNs 6, 7, then 3, 4.
    rows = [_ms("00000030:00000100:0009", f"00000030:00000100:000{n}", 1) for n in (6, 7, 3, 4)]
    # Applied up to the 7th; the engine resumed from the 6th and gives the 7th again, then 3 and 4 (new).
    redelivered = redelivery_test(rows[1], rows[0])
    assert [redelivered(offset) for offset in rows[1:]] == [True, False, False]
    # A run that ended after the 7th: Debezium skips 6 and 7 by itself and gives 3 and 4, which are new though
    # placed before the applied 7th.
    resumed_at_applied = redelivery_test(rows[1], rows[1])
    assert [resumed_at_applied(offset) for offset in rows[2:]] == [False, False]


def test_sqlserver_run_takes_a_transaction_whose_rows_go_down_and_skips_an_earlier_one_given_again() -> None:
    rows = [_ms("00000030:00000100:0009", f"00000030:00000100:000{n}", 1) for n in (6, 7, 3, 4)]
    redeliveries = StreamRedeliveries(T2_INSERT)
    assert [redeliveries(offset) for offset in (T2_INSERT, *rows)] == [True, False, False, False, False]
    assert redeliveries(T3_INSERT) is True, "an earlier transaction given again"


def test_sqlserver_records_sharing_an_offset_are_applied_together() -> None:
    # A new capture instance's schema change takes the offset of the record before it.
    assert same_stream_position(T1_DELETE, dict(T1_DELETE))
    assert not same_stream_position(T1_DELETE, T2_INSERT)
    assert not same_stream_position({**T1_DELETE, "snapshot": "INITIAL"}, {**T1_DELETE, "snapshot": "INITIAL"})


def _ora(commit_scn: str | None, tx: str, seq: int, scn: str = "289100") -> dict:
    return {"scn": scn, "commit_scn": commit_scn, "txId": tx, "txSeq": seq}


# Transaction 0a001b00 committed at 289120 on thread 1 after 289110 was recorded; then 0b00 at 289130 on thread 2.
A1 = _ora("289110:1:09000400", "0a001b00", 1)
A2 = _ora("289110:1:09000400", "0a001b00", 2)
A3 = _ora("289110:1:09000400", "0a001b00", 3)
B1 = _ora("289120:1:0a001b00", "0b000200", 1)
C1 = _ora("289120:1:0a001b00,289130:2:0b000200", "0c000100", 1)


def test_oracle_commit_scn_reads_every_form_debezium_writes() -> None:
    assert oracle.commit_state("12345:1:23456-78901,678901:2:12345-67890") == {
        1: (12345, frozenset({"23456", "78901"})), 2: (678901, frozenset({"12345", "67890"}))}
    assert oracle.commit_state("745688898024:1:") == {1: (745688898024, frozenset())}
    assert oracle.commit_state("23456") == {1: (23456, frozenset())}, "before 1.9.6: the SCN alone"
    assert oracle.commit_state("23456:0:0:1") == {1: (23456, frozenset())}, "the 4-part form of 1.9.5"
    assert oracle.commit_state(None) == {}
    assert oracle.committed_scn(C1) == 289130


def test_oracle_records_of_earlier_transactions_and_up_to_the_applied_txseq_are_redelivered() -> None:
    redelivered = redelivery_test(A2)
    assert [redelivered(offset) for offset in (A1, A2, A3, B1, C1)] == [True, True, False, False, False]
    after_b = redelivery_test(B1)
    assert [after_b(offset) for offset in (A1, A3, B1, C1)] == [True, True, True, False]
    # Two transactions committed at one SCN on one thread: the second's records follow the first's commit.
    same_scn = redelivery_test(_ora("289140:1:0d00", "0e00", 1))
    assert not same_scn(_ora("289140:1:0d00-0e00", "0f00", 1))
    assert same_scn(_ora("289130:1:0c00", "0d00", 4))


def test_oracle_a_run_skips_a_transaction_given_again() -> None:
    redeliveries = StreamRedeliveries(A1)
    assert [redeliveries(offset) for offset in (A1, A2, A3, B1, A2, A3, B1, C1)] == [
        True, False, False, False, True, True, True, False]


def test_oracle_first_transaction_after_the_snapshot_has_no_commit_yet() -> None:
    first = _ora(None, "0a00", 1, scn="1001")
    redelivered = redelivery_test(first)
    assert redelivered(_ora(None, "0a00", 1, scn="1001"))
    assert not redelivered(_ora("1005:1:0a00", "0b00", 1, scn="1006"))
    assert redelivery_test({"commit_scn": "1001:1:", "snapshot_scn": "1001", "scn": "1001",
                            "snapshot": "INITIAL", "snapshot_completed": False}) is None


def test_offsets_of_one_source_are_not_placed_by_another() -> None:
    assert oracle.stream_order(T1_INSERT) is None
    assert sqlserver.stream_order(A1) is None
    assert oracle.stream_order({"lsn": 24023128, "txId": 555}) is None
    assert sqlserver.stream_order({"file": "mariadb-bin.000001", "pos": 4}) is None


def test_an_oracle_ddl_comes_before_the_transaction_that_shares_its_commit_state():
    """Offsets as the scripted Oracle source (the connector's OracleOffsetContext and CommitScn) gave them: the DDL's
    record carries its own commit already, keeps the txId of the transaction before it and has no txSeq; the next
    transaction's records share its commit state. Re-delivered from the offset before the DDL, all three are
    skipped."""
    resumed_from = {"commit_scn": "109:1:0000000000000005", "txSeq": 1, "txId": "0000000000000006", "scn": "109"}
    ddl = {"commit_scn": "112:1:0000000000000007", "txId": "0000000000000006", "scn": "112"}
    first = {"commit_scn": "112:1:0000000000000007", "txSeq": 1, "txId": "0000000000000008", "scn": "112"}
    applied = {**first, "txSeq": 2}
    redelivered = StreamRedeliveries(applied, resumed_from)
    assert [redelivered(offset) for offset in (ddl, first, applied)] == [True, True, True]
    after_ddl = StreamRedeliveries(ddl, resumed_from)
    assert [after_ddl(offset) for offset in (ddl, first, applied)] == [True, False, False]
