"""Parsing a batch of Debezium change events in Spark.

Every line the runner emits has one envelope (seq, topic, schema id, key, value, partition, offset), so one
fixed Spark schema reads them all; row images are read as string maps, so one parse serves every table and
every version of its schema. The per-column types come from the batch's value schemas (see `FieldSpec`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_pipeline.runner import FetchedBatch

log = logging.getLogger(__name__)

_STRING_MAP = T.MapType(T.StringType(), T.StringType())

ENVELOPE = T.StructType([
    T.StructField("seq", T.LongType()),
    T.StructField("topic", T.StringType()),
    T.StructField("schema", T.StringType()),
    T.StructField("key", T.StringType()),
    T.StructField("value", T.StructType([
        T.StructField("op", T.StringType()),
        T.StructField("before", _STRING_MAP),
        T.StructField("after", _STRING_MAP),
        T.StructField("source", _STRING_MAP),
        T.StructField("ts_ms", T.LongType()),
        T.StructField("databaseName", T.StringType()),
        T.StructField("ddl", T.StringType()),
        T.StructField("tableChanges", T.StringType()),
    ])),
    T.StructField("offset", T.StringType()),
])

DML_OPS = ("c", "r", "u", "d")
TRUNCATE_OP = "t"
SCHEMA_CHANGE = "schema_change"
DATA_CHANGE = "data_change"
TRUNCATE = "truncate"
OTHER = "other"


@dataclass(frozen=True)
class FieldSpec:
    """One column of a row image as Debezium describes it: Connect type, logical name, parameters."""

    name: str
    type: str
    logical: str | None
    parameters: dict[str, str]
    optional: bool


@dataclass(frozen=True)
class EventRef:
    """What the planner needs of one event: order, kind, table, schema and op; the payload for DDL only.

    The source block and the offset stay JSON text until asked for: most events never need them.
    """

    seq: int
    kind: str
    source_table: str | None
    schema_id: str | None
    op: str | None
    source_json: str | None
    source_ts_ms: int | None  # when the change happened in the source, not when Debezium processed it
    schema_change: dict[str, Any] | None = None
    offset_json: str | None = None

    @cached_property
    def source(self) -> dict[str, str]:
        raw = json.loads(self.source_json) if self.source_json else {}
        return {key: None if value is None else str(value) for key, value in raw.items()}

    @cached_property
    def offset(self) -> dict[str, Any] | None:
        return json.loads(self.offset_json) if self.offset_json else None

    @property
    def position(self) -> dict[str, Any]:
        """The event's source position (binlog file/pos/row, LSN, ...), for messages and the applied record."""
        keys = ("file", "pos", "row", "gtid", "lsn", "txId", "change_lsn", "commit_lsn", "scn", "snapshot")
        return {key: self.source[key] for key in keys if self.source.get(key) not in (None, "null")}


@dataclass
class ParsedBatch:
    """A batch parsed in Spark: the events DataFrame (cached) and the small per-event index on the driver."""

    batch: FetchedBatch
    events: DataFrame
    refs: list[EventRef] = field(default_factory=list)

    @property
    def batch_id(self) -> int:
        return self.batch.batch_id

    def fields(self, schema_id: str, image: str = "after") -> list[FieldSpec]:
        return row_image_fields(self.batch.schemas[schema_id], image)

    def release(self) -> None:
        self.events.unpersist()


def source_table_column(connector_type: str) -> Column:
    """The source table name of a data change, as `db.table` (PostgreSQL: `schema.table`)."""
    source = F.col("value.source")
    if connector_type in ("postgres", "sqlserver", "oracle"):
        return F.concat_ws(".", source["schema"], source["table"])
    return F.concat_ws(".", source["db"], source["table"])


def parse_events(lines: DataFrame, batch: FetchedBatch, connector_type: str) -> ParsedBatch:
    """Parses the batch's JSON lines, caches the result and collects the per-event index."""
    parsed = lines.select(F.from_json("line", ENVELOPE).alias("e")).select("e.*")
    value = F.col("value")
    is_schema_change = value["ddl"].isNotNull() | value["tableChanges"].isNotNull()
    kind = (
        F.when(is_schema_change, F.lit(SCHEMA_CHANGE))
        .when(value["op"].isin(*DML_OPS), F.lit(DATA_CHANGE))
        .when(value["op"] == TRUNCATE_OP, F.lit(TRUNCATE))
        .otherwise(F.lit(OTHER))
    )
    events = parsed.select(
        F.lit(batch.batch_id).alias("batch_id"),
        "seq",
        kind.alias("kind"),
        F.when(~is_schema_change & value["source"]["table"].isNotNull(),
               source_table_column(connector_type)).alias("source_table"),
        F.col("schema").alias("schema_id"),
        value["op"].alias("op"),
        value["before"].alias("before"),
        value["after"].alias("after"),
        value["source"].alias("source"),
        value["ts_ms"].alias("ts_ms"),
        F.when(is_schema_change, F.to_json(F.struct(
            value["databaseName"].alias("databaseName"),
            value["ddl"].alias("ddl"),
            value["tableChanges"].alias("tableChanges"),
        ))).alias("schema_change"),
        "offset",
    ).cache()
    rows = events.select("seq", "kind", "source_table", "schema_id", "op", F.to_json("source").alias("source_json"),
                         F.col("source")["ts_ms"].cast("long").alias("source_ts_ms"), "schema_change",
                         "offset").collect()
    refs = []
    for row in sorted(rows, key=lambda r: r.seq):
        change = None
        if row.schema_change is not None:
            raw = json.loads(row.schema_change)
            change = {
                "databaseName": raw.get("databaseName"),
                "ddl": raw.get("ddl"),
                "tableChanges": json.loads(raw["tableChanges"]) if raw.get("tableChanges") else [],
                "source": json.loads(row.source_json) if row.source_json else {},
            }
        refs.append(EventRef(
            seq=row.seq, kind=row.kind, source_table=row.source_table, schema_id=row.schema_id, op=row.op,
            source_json=row.source_json, source_ts_ms=row.source_ts_ms, schema_change=change, offset_json=row.offset,
        ))
    return ParsedBatch(batch=batch, events=events, refs=refs)


def row_image_fields(value_schema: dict[str, Any], image: str = "after") -> list[FieldSpec]:
    """The columns of the `after` (or `before`) struct of a Debezium value schema, in order."""
    for envelope_field in value_schema.get("fields", []):
        if envelope_field.get("field") == image:
            return [
                FieldSpec(
                    name=column["field"],
                    type=column.get("type", "string"),
                    logical=column.get("name"),
                    parameters={str(k): str(v) for k, v in (column.get("parameters") or {}).items()},
                    optional=bool(column.get("optional", True)),
                )
                for column in envelope_field.get("fields", [])
            ]
    return []


def offset_order(offset: dict[str, Any] | None) -> tuple[int | str, int, int, int] | None:
    """A sortable key of a binlog streaming offset (file, transaction position, event, row), or None.

    Debezium's MySQL/MariaDB offsets grow strictly from record to record while streaming, which is what lets
    re-delivered records be recognised. Snapshot offsets (all records share one position) and offsets of
    other sources have no such order here: None, and nothing is skipped by them.
    """
    if not offset or "snapshot" in offset or "file" not in offset or "pos" not in offset:
        return None
    file_name = str(offset["file"])
    suffix = file_name.rsplit(".", 1)[-1]
    return (int(suffix) if suffix.isdigit() else file_name, int(offset["pos"]), int(offset.get("event") or 0),
            int(offset.get("row") or 0))
