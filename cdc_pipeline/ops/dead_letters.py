"""Dead letters: the events the `skip` error strategy set aside, and how an operator retries or discards them.

A dead letter keeps the event as the runner wrote it (the JSON line of a data change with its value schema; the
index entry of a schema change or truncate), the error, the table and the source position. Retrying one replays
that event through the same parse, plan and apply as a fetch cycle, in its own destination transaction, after
the operator fixed the cause; it then counts as applied (its kind's counter) instead of as a bad event.
Dead letters are retried in the order their events came in, each at most once.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import psycopg
from psycopg import sql
from pyspark.sql import SparkSession

from cdc_pipeline import control

from cdc_pipeline.mapping import objmap, rule_store
from cdc_pipeline.sink.apply import BatchApplier
from cdc_pipeline.sink.plan import SnapshotStep, attach_dml_frames, plan_batch
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline.decode.events import DATA_CHANGE, index_entry, parse_events
from cdc_pipeline.capture.runner import FetchedBatch

log = logging.getLogger(__name__)


def replay_batch(spark: SparkSession, connector: ConnectorConfig, letter: dict[str, Any]) -> Any:
    """The parsed one-event batch of a dead letter."""
    raw = letter["raw_event"]
    entry = json.loads(raw)
    lines: list[str] = []
    schemas: dict[str, Any] = {}
    if entry.get("kind") is None:  # a data change keeps its line: its index entry is made from it
        entry = index_entry(raw)
        lines = [raw]
        if entry.get("schema") is not None and letter.get("value_schema"):
            schemas[entry["schema"]] = json.loads(letter["value_schema"])
    if entry["kind"] == DATA_CHANGE and entry.get("schema") not in schemas:
        raise CdcError(f"dead letter {letter['id']} keeps no value schema for its event", connector=connector.name,
                       table=letter.get("source_table"))
    batch = FetchedBatch(batch_id=0, size=1, java_batch=None, schemas=schemas, last_offset=entry.get("offset"),
                         last_partition=None, index=[entry])
    return parse_events(spark.createDataFrame([(line,) for line in lines], "line string"), batch)


def retry(conn: psycopg.Connection, spark: SparkSession, connector: ConnectorConfig, control_schema: str,
          ids: list[int] | None = None) -> list[tuple[int, str]]:
    """Replays the connector's pending dead letters (all, or the given ids) in order, each in its own transaction;
    returns (id, outcome) per letter. The first one that fails again stops the retry (the later ones may depend on
    it), with the error; it stays pending."""
    letters = control.read_dead_letters(conn, control_schema, connector.name, ids=ids,
                                        status=control.DEAD_LETTER_PENDING)
    if ids:
        missing = sorted(set(ids) - {letter["id"] for letter in letters})
        if missing:
            raise CdcError(f"no pending dead letter with id {', '.join(map(str, missing))}", connector=connector.name)
    control.acquire_run_lock(conn, connector.name)
    try:
        outcomes: list[tuple[int, str]] = []
        # The rules as the cycles apply them: a retried event lands where its table's events land, transformed.
        object_map = objmap.ObjectMap(connector, rule_store.read_rules(conn, control_schema, connector.name))
        applier = BatchApplier(conn, connector, control_schema, object_map)
        for letter in letters:
            parsed = replay_batch(spark, connector, letter)
            try:
                plan = plan_batch(parsed, connector, object_map=object_map)
                # A replayed event is never a snapshot's start or end.
                plan.steps = [step for step in plan.steps if not isinstance(step, SnapshotStep)]
                attach_dml_frames(plan)
                try:
                    applier.apply(plan, dead_letter=letter["id"])
                except (psycopg.Error, CdcError) as exc:
                    raise CdcError(f"dead letter {letter['id']} (table {letter['source_table']}, op {letter['op']}, "
                                   f"position {letter['position']}) failed again: {exc}",
                                   connector=connector.name) from exc
            finally:
                parsed.release()
            log.info("%s: dead letter %d applied", connector.name, letter["id"])
            outcomes.append((letter["id"], control.DEAD_LETTER_RETRIED))
        return outcomes
    finally:
        control.release_run_lock(conn, connector.name)


def discard(conn: psycopg.Connection, connector: str, control_schema: str, ids: list[int]) -> list[int]:
    """Marks pending dead letters discarded (they stay in the table, counted as bad events); returns their ids."""
    discarded = []
    with conn.transaction(), conn.cursor() as cur:
        for letter_id in ids:
            owner = cur.execute(sql.SQL("SELECT connector FROM {} WHERE id = %s").format(
                sql.Identifier(control_schema, "dead_letters")), (letter_id,)).fetchone()
            if owner is None or owner[0] != connector:
                raise CdcError(f"no dead letter {letter_id} of this connector", connector=connector)
            if not control.resolve_dead_letter(cur, control_schema, letter_id, control.DEAD_LETTER_DISCARDED):
                raise CdcError(f"dead letter {letter_id} is not pending", connector=connector)
            discarded.append(letter_id)
    return discarded
