"""Bad input the pipeline must not trust: an event line that is not the JSON it should be fails where it is used
(never goes missing), with the connector, the table and the event's position; under `skip` it alone becomes a dead
letter. (Odd identifiers: `tests/integration/test_identifiers.py`; values out of range, tables and columns missing on the
destination: `tests/faults/test_error_strategies.py`; unknown configuration keys: `tests/unit/test_config.py`.)"""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import functions as F

from cdc_pipeline import control
from cdc_pipeline.sink.apply import BatchApplier
from cdc_pipeline.sink.plan import attach_dml_frames, plan_batch
from cdc_pipeline.config import parse_config
from cdc_pipeline.errors import ConversionError
from cdc_pipeline.decode.events import DATA_CHANGE, ParsedBatch, fail_on_malformed, parse_events
from tests.helpers.spark import fetched_batch, fixture_records, get_spark

BROKEN_SEQ = 10  # the insert of products row 4, which no later event touches
BROKEN_PREFIX = f'{{"seq":{BROKEN_SEQ},'


def _parsed(broken: bool) -> ParsedBatch:
    """The captured batch as the runner would ship it, its line BROKEN_SEQ cut off after its seq when `broken`."""
    batch, lines = fetched_batch(fixture_records())
    if broken:
        assert lines[BROKEN_SEQ - 1].startswith(BROKEN_PREFIX)
        lines[BROKEN_SEQ - 1] = BROKEN_PREFIX + '"topic":"mdb.inventory.pro'
    data_lines = [line for line, entry in zip(lines, batch.index) if entry["kind"] == DATA_CHANGE]
    return parse_events(get_spark().createDataFrame([(line,) for line in data_lines], "line string"), batch)


def test_a_malformed_line_fails_where_it_is_used_and_only_there() -> None:
    events = _parsed(broken=True).events
    with pytest.raises(Exception, match=rf"malformed event line \(seq {BROKEN_SEQ} of runner batch 1\)"):
        fail_on_malformed(events).collect()
    others = fail_on_malformed(events.where(F.col("seq") != BROKEN_SEQ)).select("seq", "op").collect()
    assert [row.seq for row in others] == [7, 8, 9, 11, 12, 15, 16, 18, 20, 22, 24]


@pytest.fixture
def destination(destination_pg) -> str:
    name = f"bad_{uuid.uuid4().hex[:8]}"
    destination_pg.create_database(name)
    return destination_pg.dsn(name)


def _apply(dsn: str, error_strategy: str, broken: bool) -> None:
    connector = parse_config({
        "destination": {"dsn": dsn},
        "connectors": {"mdb": {"type": "mariadb", "hostname": "localhost", "user": "cdc", "password": "secret",
                               "database": "inventory", "error_strategy": error_strategy}},
    }, Path("x.yaml")).connector("mdb")
    plan = plan_batch(_parsed(broken), connector)
    attach_dml_frames(plan)
    with psycopg.connect(dsn) as conn:
        control.ensure_control_schema(conn, "cdc")
        BatchApplier(conn, connector, "cdc").apply(plan)


def _products(dsn: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT * FROM inventory.products ORDER BY id").fetchall()


@pytest.mark.integration
def test_a_malformed_line_stops_the_batch_under_exit(destination) -> None:
    with pytest.raises(ConversionError) as failed:
        _apply(destination, "exit", broken=True)
    message = str(failed.value)
    assert f"malformed event line (seq {BROKEN_SEQ} of runner batch 1)" in message
    assert "connector 'mdb'" in message and "table 'inventory.products'" in message and "'pos'" in message
    with psycopg.connect(destination) as conn:
        assert conn.execute("SELECT to_regclass('inventory.products')").fetchone() == (None,), "all rolled back"


@pytest.mark.integration
def test_a_malformed_line_alone_becomes_a_dead_letter_under_skip(destination, destination_pg) -> None:
    clean = f"clean_{uuid.uuid4().hex[:8]}"
    destination_pg.create_database(clean)
    _apply(destination_pg.dsn(clean), "skip", broken=False)

    _apply(destination, "skip", broken=True)

    assert _products(destination) == [row for row in _products(destination_pg.dsn(clean)) if row[0] != 4]
    with psycopg.connect(destination) as conn:
        letters = conn.execute("SELECT source_table, op, error, raw_event FROM cdc.dead_letters").fetchall()
        bad_events = conn.execute("SELECT bad_events FROM cdc.stats WHERE connector = 'mdb'").fetchone()
    assert len(letters) == 1
    source_table, op, error, raw_event = letters[0]
    assert (source_table, op) == ("inventory.products", "c")
    assert f"malformed event line (seq {BROKEN_SEQ}" in error
    assert raw_event.startswith(BROKEN_PREFIX), "the dead letter keeps the line as it came"
    assert bad_events == (1,)


@pytest.mark.integration
def test_nul_characters_in_text_are_taken_out_by_the_bulk_snapshot_and_the_stream(pipeline) -> None:
    # PostgreSQL's text types cannot hold NUL; MariaDB's strings can. Bytes keep theirs.
    pipeline.source([
        "CREATE TABLE notes (id INT PRIMARY KEY, short VARCHAR(20), body TEXT, raw VARBINARY(8))",
        "INSERT INTO notes VALUES (1, CONCAT('a', CHAR(0), 'b'), CONCAT(CHAR(0), 'x\\ty'), CONCAT('p', CHAR(0)))",
    ])
    pipeline.sync()
    pipeline.source(["INSERT INTO notes VALUES (2, CHAR(0), CONCAT('n', CHAR(0), CHAR(0)), CHAR(0))",
                     "UPDATE notes SET body = CONCAT('u', CHAR(0), 'v') WHERE id = 1"])
    summary = pipeline.sync()

    assert (summary["inserts"], summary["updates"]) == (1, 1)
    assert pipeline.dest_query('SELECT id, short, body, raw FROM "{}".notes ORDER BY id'.format(pipeline.source_db)) == [
        (1, "ab", "uv", b"p\x00"), (2, "", "n", b"\x00")]
