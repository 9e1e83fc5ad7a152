"""Moving a connector's Debezium offset: checking it against its type's shape (`OFFSET_SHAPE` of the source type's
module), and writing it where the engine reads it at its next start (`debezium_offsets`) and where re-deliveries
are recognised (`applied_positions`).

An offset names the last event already processed: the engine resumes after it, and every later event is applied
again, once (the applied position moves with it, so none of them counts as a re-delivery; nor as committed before a
keyless table's bulk snapshot: the positions of those snapshots are forgotten, see `move_offset`).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg import sql

from cdc_pipeline import sources
from cdc_pipeline.config import CONNECTOR_TYPES
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sources.offset_shape import OffsetShape


class OffsetError(CdcError):
    """An offset that cannot be given to the connector: not JSON, or not the shape its type uses."""


SHAPES: dict[str, OffsetShape] = {kind: sources.module_for(kind).OFFSET_SHAPE for kind in CONNECTOR_TYPES}


TRANSACTION_OFFSET_PREFIX = "transaction_"  # the offset keys Debezium's transaction metadata adds


def public_offset(offset: dict[str, Any] | None) -> dict[str, Any] | None:
    """A source offset without the keys transaction metadata adds (`transaction_id`, each table's order in the
    transaction; `EventSerializer.publicOffset`): the position the pipeline compares, records and moves."""
    if not offset or not any(key.startswith(TRANSACTION_OFFSET_PREFIX) for key in offset):
        return offset
    return {key: value for key, value in offset.items() if not key.startswith(TRANSACTION_OFFSET_PREFIX)}


def parse_offset(text: str, connector: str, connector_type: str) -> dict[str, Any]:
    """The offset in `text` (a JSON object) checked against the connector type's shape; raises OffsetError
    naming what is wrong and showing the shape. The keys Debezium's transaction metadata adds (an offset copied from
    `cdc.debezium_offsets`) are left out: the engine resumes from the position, outside any transaction."""
    shape = SHAPES[connector_type]
    hint = f"a {connector_type} offset looks like {shape.example}"
    try:
        offset = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise OffsetError(f"the offset is not JSON ({exc}); {hint}", connector=connector) from None
    if not isinstance(offset, dict):
        raise OffsetError(f"the offset must be a JSON object, got {text!r}; {hint}", connector=connector)
    offset = public_offset(offset) or {}
    missing = [name for name in shape.required if name not in offset]
    if missing:
        raise OffsetError(f"the offset lacks {', '.join(missing)}; {hint}", connector=connector)
    known = {**shape.required, **shape.optional}
    unknown = sorted(set(offset) - set(known))
    if unknown:
        raise OffsetError(f"the offset has fields a {connector_type} offset has not: {', '.join(unknown)}; "
                          f"fields: {', '.join(known)}", connector=connector)
    for name, value in offset.items():
        types = known[name]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise OffsetError(f"offset field {name!r} must be {' or '.join(t.__name__ for t in types)}, "
                              f"got {value!r}; {hint}", connector=connector)
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise OffsetError(f"offset field {name!r} must not be negative, got {value}", connector=connector)
        if isinstance(value, str) and not value and name in shape.required:
            raise OffsetError(f"offset field {name!r} must not be empty; {hint}", connector=connector)
    return offset


def offset_key(connector: str, connector_type: str, database: str) -> str:
    """The key Kafka Connect stores a connector's offset under: the engine name and Debezium's source partition
    (`source_partition` of the source type's module), as its JSON converter writes them."""
    partition = sources.module_for(connector_type).source_partition(connector, database)
    return json.dumps([connector, partition], separators=(",", ":"))


def move_offset(conn: psycopg.Connection, schema: str, connector: str, connector_type: str, database: str,
                offset: dict[str, Any]) -> None:
    """Makes `offset` the connector's Debezium offset and its applied position, in one transaction.

    The engine must not be running (its next start reads the offset): callers hold the run lock or have the
    connector paused. Every offset key the connector has gets the offset (there is one per source partition).

    The bulk snapshot's positions of keyless tables (`bulk_load_chunks.snapshot_position`) are forgotten with it:
    the offset says from where every event is to be applied, and a position is only comparable with offsets of
    the binlog (or transaction id epoch) it was taken in, which an offset moved after a `RESET MASTER` or to another
    server is not. So is the position the change check recorded as read (`source_checked`): a run would start past
    an offset moved back (`resume_offset` of the source's module).
    """
    offsets = sql.Identifier(schema, "debezium_offsets")
    value = json.dumps(offset, separators=(",", ":"))
    with conn.transaction():
        keys = [row[0] for row in conn.execute(
            sql.SQL("SELECT offset_key FROM {} WHERE connector = %s FOR UPDATE").format(offsets), (connector,))]
        for key in keys or [offset_key(connector, connector_type, database)]:
            conn.execute(sql.SQL(
                """INSERT INTO {} (connector, offset_key, offset_value, updated_at) VALUES (%s, %s, %s, now())
                   ON CONFLICT (connector, offset_key) DO UPDATE SET offset_value = EXCLUDED.offset_value,
                     updated_at = now()""").format(offsets), (connector, key, value))
        conn.execute(sql.SQL(
            """INSERT INTO {} (connector, batch_events, source_position, debezium_offset, applied_at)
               VALUES (%s, 0, NULL, %s, now())
               ON CONFLICT (connector) DO UPDATE SET debezium_offset = EXCLUDED.debezium_offset""").format(
            sql.Identifier(schema, "applied_positions")), (connector, value))
        # What the change check read past belongs to the old position: from the new one on, everything is to be read.
        conn.execute(sql.SQL("UPDATE {} SET last_offset = %s, source_checked = NULL, updated_at = now() "
                             "WHERE connector = %s").format(sql.Identifier(schema, "connector_state")),
                     (value, connector))
        conn.execute(sql.SQL("UPDATE {} SET snapshot_position = NULL WHERE connector = %s "
                             "AND snapshot_position IS NOT NULL").format(sql.Identifier(schema, "bulk_load_chunks")),
                     (connector,))


def advance_engine_offset(conn: psycopg.Connection, schema: str, connector: str, offset: dict[str, Any]) -> None:
    """Makes `offset`, a position past the stored one before which every change is applied, the engine's offset
    (every key the connector has), leaving the applied position as it is: the events after it are new."""
    conn.execute(sql.SQL("UPDATE {} SET offset_value = %s, updated_at = now() WHERE connector = %s").format(
        sql.Identifier(schema, "debezium_offsets")), (json.dumps(offset, separators=(",", ":")), connector))
