"""A local Spark session shared by the tests, and captured Debezium fixtures turned into runner batches.

The fixtures were captured from real Debezium in the Kafka Connect shape (`destination`, `key` and `value`,
each with `schema` and `payload`). `runner_lines` rewrites them in the line format the Java runner emits
(see `EventSerializer.java` and `ChangeBatch.java`), and `index_entry` computes each line's index entry as the
runner does (tests/integration/test_runner_index.py checks the two agree on a real run), so the tests plan and parse
exactly what the pipeline does.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from pyspark.sql import SparkSession

from cdc_pipeline.decode.events import DATA_CHANGE, ParsedBatch, index_entry, parse_events  # noqa: F401 (index_entry: for tests)
from cdc_pipeline.capture.runner import FetchedBatch
from cdc_pipeline.capture.spark import build_spark_session
from tests.helpers import FIXTURES

ALL_EVENTS = "mariadb_all_events.jsonl"


@functools.cache
def get_spark() -> SparkSession:
    """The one Spark session of the test process (the JVM can start only once, with the runner's classpath)."""
    return build_spark_session()


def fixture_records(name: str = ALL_EVENTS) -> list[dict[str, Any]]:
    """The captured records of a `.jsonl` fixture (one a line) or a `.json` fixture (one record)."""
    text = (FIXTURES / name).read_text()
    if name.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return [json.loads(text)]


def _payload(envelope: dict[str, Any] | None) -> Any:
    return None if envelope is None else envelope.get("payload")


def _offset(value: dict[str, Any] | None) -> dict[str, Any]:
    source = (value or {}).get("source") or {}
    return {key: source[key] for key in ("file", "pos", "row", "gtid", "snapshot") if source.get(key) is not None}


def runner_lines(records: list[dict[str, Any]], first_seq: int = 1) -> tuple[list[str], dict[str, Any]]:
    """The records as the runner's JSON lines, and the value schemas by id, as a batch carries them."""
    lines: list[str] = []
    schemas: dict[str, Any] = {}
    id_by_schema: dict[str, str] = {}
    for seq, record in enumerate(records, start=first_seq):
        value_schema = (record.get("value") or {}).get("schema")
        schema_id = None
        if value_schema is not None:
            canonical = json.dumps(value_schema, sort_keys=True)
            schema_id = id_by_schema.setdefault(canonical, f"s{len(id_by_schema) + 1}")
            schemas.setdefault(schema_id, value_schema)
        value = _payload(record.get("value"))
        line = {
            "seq": seq,
            "topic": record["destination"],
            "schema": schema_id,
            "key": _payload(record.get("key")),
            "value": value,
            "partition": {"server": record["destination"].split(".")[0]},
            "offset": _offset(value),
        }
        lines.append(json.dumps(line, ensure_ascii=False, separators=(",", ":")))
    return lines, schemas


def fetched_batch(records: list[dict[str, Any]], batch_id: int = 1,
                  first_seq: int = 1) -> tuple[FetchedBatch, list[str]]:
    """A FetchedBatch of the records (no Java list behind it) and its lines; `first_seq` is its first event's seq
    (1: the engine's first event)."""
    lines, schemas = runner_lines(records, first_seq)
    last = json.loads(lines[-1]) if lines else None
    batch = FetchedBatch(
        batch_id=batch_id,
        size=len(lines),
        java_batch=None,
        schemas=schemas,
        last_offset=last["offset"] if last else None,
        last_partition=last["partition"] if last else None,
        index=[index_entry(line) for line in lines],
    )
    return batch, lines


def parse_records(records: list[dict[str, Any]], batch_id: int = 1, first_seq: int = 1) -> ParsedBatch:
    """Parses the records in Spark as the pipeline parses a batch popped from the runner."""
    batch, lines = fetched_batch(records, batch_id, first_seq)
    data_lines = [line for line, entry in zip(lines, batch.index) if entry["kind"] == DATA_CHANGE]
    lines_df = get_spark().createDataFrame([(line,) for line in data_lines], "line string")
    return parse_events(lines_df, batch)


@functools.cache
def all_events_batch() -> ParsedBatch:
    """The parsed `mariadb_all_events.jsonl` batch, parsed once per test process (its events stay cached)."""
    return parse_records(fixture_records(ALL_EVENTS))
