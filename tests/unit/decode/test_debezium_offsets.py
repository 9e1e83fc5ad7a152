"""SQL Server's and Oracle's offsets made by Debezium's own offset contexts (the runner's 3.5 jars, in the test's
driver JVM), as their streaming sources set them for each record, are taken by `set-offset` and ordered for
re-delivered events: `SqlServerOffsetContext.setChangePosition` (a position's records count up `event_serial_no`,
an update by 2) and `getOffset`; `OracleOffsetContext.getOffset` with `CommitScn` and the record's `txId`/`txSeq`
(the commit state after a transaction is written as `CommitScn.recordCommit` makes it: the thread's SCN, or the
transaction added at the same SCN)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cdc_pipeline.decode.events import StreamRedeliveries, redelivery_test
from cdc_pipeline.decode.offsets import parse_offset
from cdc_pipeline.sources import oracle, sqlserver
from tests.helpers.spark import get_spark


@pytest.fixture(scope="module")
def jvm() -> Any:
    return get_spark()._jvm


def _config(jvm: Any, config_class: Any, properties: dict[str, str]) -> Any:
    builder = jvm.io.debezium.config.Configuration.create()
    for key, value in properties.items():
        builder = getattr(builder, "with")(key, value)
    return config_class(builder.build())


def _offset(java_map: Any) -> dict[str, Any]:
    """A Java offset map as the runner stores it (JSON)."""
    return json.loads(json.dumps(dict(java_map)))


def test_sqlserver_offsets_of_a_stream_as_debezium_sets_them(jvm):
    sql = jvm.io.debezium.connector.sqlserver
    config = _config(jvm, sql.SqlServerConnectorConfig, {"topic.prefix": "erp", "database.names": "shop",
                                                        "database.hostname": "h", "database.user": "u"})

    def position(commit: str, change: str) -> Any:
        return sql.TxLogPosition.valueOf(sql.Lsn.valueOf(commit), sql.Lsn.valueOf(change))

    context = sql.SqlServerOffsetContext(config, position("0000002c:00000a38:0005", "NULL"), None, False, 0,
                                         jvm.io.debezium.pipeline.txmetadata.TransactionContext(),
                                         jvm.io.debezium.pipeline.source.snapshot.incremental
                                         .SignalBasedIncrementalSnapshotContext())
    offsets = []
    # An insert, an update (its before and after rows: 2), a delete, then the next transaction; LSNs upper-case
    # as SQL Server prints them: Debezium writes them lower-case.
    for commit, change, records in (("0000002C:00000A38:0005", "0000002C:00000A38:0002", 1),
                                    ("0000002C:00000A38:0005", "0000002C:00000A38:0003", 2),
                                    ("0000002C:00000A38:0005", "0000002C:00000A38:0004", 1),
                                    ("0000002C:00000A40:0003", "0000002C:00000A40:0002", 1)):
        context.setChangePosition(position(commit, change), records)
        offsets.append(_offset(context.getOffset()))
    assert offsets[1] == {"commit_lsn": "0000002c:00000a38:0005", "change_lsn": "0000002c:00000a38:0003",
                          "event_serial_no": 2}
    assert [parse_offset(json.dumps(offset), "erp", "sqlserver") for offset in offsets] == offsets
    assert sorted(offsets, key=sqlserver.stream_order) == offsets
    redelivered = redelivery_test(offsets[1])
    assert [redelivered(offset) for offset in offsets] == [True, True, False, False]
    run = StreamRedeliveries(offsets[0])
    assert [run(offset) for offset in offsets + offsets[1:3]] == [True, False, False, False, True, True]


def test_oracle_offsets_of_a_stream_as_debezium_sets_them(jvm):
    ora = jvm.io.debezium.connector.oracle
    config = _config(jvm, ora.OracleConnectorConfig, {"topic.prefix": "ledger", "database.dbname": "ORCLCDB",
                                                      "database.hostname": "h", "database.user": "u"})
    Long = jvm.java.lang.Long

    def offsets_of(commit_scn: str | None, transaction: str, records: int, scn: str = "289100") -> list[dict]:
        context = (ora.OracleOffsetContext.create().logicalName(config).scn(ora.Scn.valueOf(scn))
                   .commitScn(ora.CommitScn.valueOf(commit_scn)).transactionId(transaction)
                   .snapshotCompleted(False)
                   .transactionContext(jvm.io.debezium.pipeline.txmetadata.TransactionContext())
                   .incrementalSnapshotContext(jvm.io.debezium.pipeline.source.snapshot.incremental
                                               .SignalBasedIncrementalSnapshotContext()).build())
        made = []
        for sequence in range(1, records + 1):
            context.setTransactionSequence(Long.valueOf(sequence))
            made.append(_offset(context.getOffset()))
        return made

    # Two redo threads; 0b000200 commits at 289130 on thread 1, then 0c000100 at 289130 on thread 1 too.
    first = offsets_of("289120:1:0a001b00,289118:2:", "0b000200", 3)
    second = offsets_of("289130:1:0b000200,289118:2:", "0c000100", 2)
    third = offsets_of("289130:1:0b000200-0c000100,289118:2:", "0d000400", 1)
    stream = first + second + third
    assert first[1] == {"scn": "289100", "commit_scn": "289120:1:0a001b00,289118:2:", "txId": "0b000200",
                        "txSeq": 2}
    assert [parse_offset(json.dumps(offset), "ledger", "oracle") for offset in stream] == stream
    assert sorted(stream, key=oracle.stream_order) == stream
    redelivered = redelivery_test(second[0])
    assert [redelivered(offset) for offset in stream] == [True, True, True, True, False, False]
    run = StreamRedeliveries(first[0])
    assert [run(offset) for offset in stream + first[1:]] == [True, False, False, False, False, False, True, True]
