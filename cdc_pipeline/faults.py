"""Pause points: a run told so by its environment stops dead at a named stage, so a fault test can kill it there;
and one injected fault (`EARLY_SNAPSHOT_ENV`).

`CDC_PIPELINE_PAUSE_AT=<stage>` (or `<stage>@<n>`: the nth time the run reaches it; the first by default) makes
the run write the stage's name to the file named by `CDC_PIPELINE_PAUSE_FILE` and then sleep until it is killed.
Without `CDC_PIPELINE_PAUSE_AT` (always, outside the fault tests) a pause point does nothing; so does the fault
without its variable.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

PAUSE_AT_ENV = "CDC_PIPELINE_PAUSE_AT"
PAUSE_FILE_ENV = "CDC_PIPELINE_PAUSE_FILE"
# A Debezium batch was popped from the runner; nothing of it is parsed yet.
FETCHED = "fetched"
# A batch is planned and its DML steps have their Spark frames; its destination transaction has not begun.
CONVERTED = "converted"
# A batch's steps, applied position and counts are written; its destination transaction is not committed.
IN_TRANSACTION = "in_transaction"
# A group of streamed batches is committed; it is not marked complete in the runner yet (Debezium's offset is
# where the group began): the one group a kill can make come again.
GROUP_COMMITTED = "group_committed"
# The cycle's batches are committed, the streamed ones marked complete group by group; those of a snapshot Debezium
# is still taking are not marked complete yet.
COMMITTED = "committed"
# The bulk snapshot committed a slice of chunks (each with its checkpoint); the next slice has not begun.
BULK_SLICE = "bulk_slice"
# Inside a bulk snapshot chunk's transaction: its rows are COPYed and its checkpoint written, not committed. This
# pause point is in the runner's ChunkCopyWriter (a Spark task); `@n` is not read there.
BULK_COPY = "bulk_copy"
STAGES = (FETCHED, CONVERTED, IN_TRANSACTION, GROUP_COMMITTED, COMMITTED, BULK_SLICE, BULK_COPY)

# Set (to anything), every batch's transaction runs REPEATABLE READ with its snapshot taken as it begins, before
# Spark's tasks stage the batch's rows: what a destination defaulting to REPEATABLE READ did before the sessions
# pinned READ COMMITTED, so that a test sees the merge refuse a staging it cannot see.
EARLY_SNAPSHOT_ENV = "CDC_PIPELINE_FAULT_EARLY_SNAPSHOT"

_reached: Counter = Counter()


def take_snapshot_early(cursor: Any) -> None:
    """Makes the transaction `cursor` has just begun REPEATABLE READ, its snapshot taken now, when the environment
    asks for it (`EARLY_SNAPSHOT_ENV`); does nothing otherwise."""
    if os.environ.get(EARLY_SNAPSHOT_ENV):
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cursor.execute("SELECT 1")


def pause_point(stage: str) -> None:
    """Pauses the process for good when the environment asks for this stage (and this occurrence of it)."""
    wanted = os.environ.get(PAUSE_AT_ENV)
    if not wanted:
        return
    name, _, nth = wanted.partition("@")
    if name not in STAGES:
        raise ValueError(f"{PAUSE_AT_ENV}={wanted!r}: the stage must be one of {', '.join(STAGES)}")
    if name != stage:
        return
    _reached[stage] += 1
    if _reached[stage] != int(nth or 1):
        return
    marker = os.environ.get(PAUSE_FILE_ENV)
    if marker:
        # Written aside and renamed: a test polling for the file must never find it created but still empty.
        part = Path(marker + ".part")
        part.write_text(stage)
        part.replace(marker)
    while True:
        time.sleep(3600)
