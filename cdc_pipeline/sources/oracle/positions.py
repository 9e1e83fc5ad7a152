"""An Oracle connector's positions: its Debezium offsets' shape and source partition, their order in the stream
(re-delivered events), and up to where an offset says changes were processed.

Offsets. Debezium's Oracle connector (3.5, LogMiner; `OracleOffsetContext.getOffset`) writes `scn` (where mining
resumes: the start of the oldest transaction still open), `commit_scn` (`CommitScn`: per redo thread, the SCN of the
last commit handled and the transactions committed at it, 'scn:thread:tx1-tx2' joined by ',') and, for a record,
`txId` and `txSeq` (its transaction and its place in it, from 1). Transactions are emitted whole at their commit, in
commit order, and the commit is recorded after their last record (`BufferedLogMinerStreamingChangeEventSource.
handleCommit`): the records of one transaction share one `commit_scn`, and it grows (per thread) from one transaction
to the next. On restart, Debezium skips a transaction its `commit_scn` covers (`CommitScn.hasBeenHandled`) and, in
the offset's own transaction, the records up to `txSeq`.
"""

from __future__ import annotations

from typing import Any

from cdc_pipeline.sources.change_check import inside_snapshot
from cdc_pipeline.sources.offset_shape import FLAG, INT, TEXT, OffsetShape

_INCREMENTAL_SNAPSHOT_KEYS = ("incremental_snapshot_primary_key", "incremental_snapshot_maximum_key",
                               "incremental_snapshot_collections", "incremental_snapshot_correlation_id")
OFFSET_SHAPE = OffsetShape(
    required={"scn": TEXT + INT},
    # As OracleOffsetContext.getOffset writes them (Debezium 3.5): commit_scn is CommitScn's per-thread list
    # ('scn:thread:txid-txid,...'), null before the first commit; the incremental snapshot's keys while one runs.
    optional={"commit_scn": TEXT + (type(None),), "txId": TEXT, "txSeq": INT, "scn_idx": INT, "lcr_position": TEXT,
              "snapshot_scn": TEXT, "snapshot_pending_tx": TEXT, "snapshot": FLAG, "snapshot_completed": FLAG,
              "window_advance_enabled": FLAG, "transaction_id": TEXT,
              **{key: TEXT + (type(None),) for key in _INCREMENTAL_SNAPSHOT_KEYS}},
    example='{"scn": "2891044", "commit_scn": "2891051:1:0a001b00c5030000", "txId": "0a001b00c5030000", "txSeq": 3}',
)
ORDERED_WITHIN_TRANSACTION = True  # a transaction's records come in `txSeq` order


def source_partition(connector: str, database: str) -> dict[str, str]:
    """Debezium's source partition of the connector's offsets: the connector's name (its topic prefix)."""
    return {"server": connector}


def commit_state(value: Any) -> dict[int, tuple[int, frozenset[str]]]:
    """Debezium's `commit_scn` offset value (`CommitScn.valueOf`) as {redo thread: (commit SCN, transactions committed
    at it)}: 'scn:thread:tx-tx' entries joined by ','; older forms: 'scn' alone (thread 1), 'scn:_:_:thread', or a
    number."""
    if value is None or value == "":
        return {}
    state = {}
    for entry in str(value).split(","):
        parts = entry.split(":")
        if len(parts) == 1:
            state[1] = (int(parts[0]), frozenset())
        elif len(parts) == 3:
            state[int(parts[1])] = (int(parts[0]), frozenset(filter(None, parts[2].split("-"))))
        elif len(parts) == 4:
            state[int(parts[3])] = (int(parts[0]), frozenset())
        else:
            raise ValueError(f"an unexpected commit_scn entry {entry!r}")
    return state


def committed_scn(offset: dict[str, Any]) -> int | None:
    """The SCN of the last commit an offset's `commit_scn` records (the highest of its redo threads), or None."""
    state = commit_state(offset.get("commit_scn"))
    return max(scn for scn, _ in state.values()) if state else None


def stream_order(offset: dict[str, Any] | None) -> tuple[tuple[int, int, int], tuple, tuple[int]] | None:
    """Where a streamed record's offset lies: (its transaction's order, its transaction, its place in it). The
    transaction's order is that of the commits recorded before it (`commit_scn`), which grow from one transaction to
    the next on each redo thread: the sum of their SCNs, then of their transactions, grows with them; among records of
one commit state, a DDL's (no `txSeq`) comes first. None for a
    snapshot's offset, an XStream one (`lcr_position`), or one that is not Oracle's."""
    if not offset or offset.get("snapshot") not in (None, False, "false") or "scn" not in offset \
            or "commit_lsn" in offset:
        return None
    try:
        state = commit_state(offset.get("commit_scn"))
    except ValueError:
        return None
    # A DDL's record carries its own commit already (the buffered source's handleSchemaChangeEvent records it before
    # dispatching), so it shares its commit state with the next transaction's records and comes before them. It has
    # no transaction sequence (its LogMiner row has none) and keeps the txId of the transaction before it.
    schema_change = offset.get("txSeq") is None
    order = (sum(scn for scn, _ in state.values()), sum(len(txs) for _, txs in state.values()),
             0 if schema_change else 1)
    transaction = (tuple(sorted((thread, scn, tuple(sorted(txs))) for thread, (scn, txs) in state.items())),
                   offset.get("txId"))
    return order, transaction, (int(offset.get("txSeq") or 0),)


def check_position(offset: dict[str, Any] | None) -> tuple[int, int] | None:
    """Up to where an offset says every change was processed, for the change check: (the SCN of its last commit
    handled, the SCN mining resumes from); a finished snapshot's counts. None inside a snapshot, or for an offset
    that is not Oracle's (LogMiner)."""
    if not offset or "scn" not in offset or "commit_lsn" in offset or inside_snapshot(offset):
        return None
    try:
        resume, committed = int(offset["scn"]), committed_scn(offset)
    except ValueError:
        return None
    return (resume - 1 if committed is None else committed), resume
