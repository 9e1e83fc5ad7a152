"""What the pipeline knows of Oracle sources: the type map (columns as Debezium describes them in `tableChanges`:
from ojdbc's `getColumns` in a snapshot, from its Oracle DDL parser's `ColumnDefinitionParserListener` while
streaming), the Debezium connector's properties (their changes take the stream's path only: no bulk snapshot)."""

from __future__ import annotations

import re
from typing import Any

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.sources.ddl_text import ORACLE, Statement, parse_statements
from cdc_pipeline.sources.offset_shape import FLAG, INT, TEXT, OffsetShape
from cdc_pipeline.sources.debezium import HEARTBEAT_TOPICS_PROPERTY
from cdc_pipeline.sources.type_choice import MAX_VARCHAR_LENGTH, TypeChoice, column_number, default_literal

CONNECTOR_CLASS = "io.debezium.connector.oracle.OracleConnector"
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
DDL_EVENTS = True  # LogMiner gives the DDL text Oracle logged and Debezium's parse of it


# Oracle's columns to PostgreSQL's, by type name (upper case, precisions taken out: ojdbc reports
# "TIMESTAMP(6) WITH TIME ZONE", the DDL parser "TIMESTAMP WITH TIME ZONE" with the precision as length).
# convert/typemap.py reads them; NUMBER's rows are `column_type`'s.
ORACLE_TYPE_MAP: dict[str, str] = {
    "NUMBER": "numeric(p,s)",
    "FLOAT": "numeric",  # FLOAT(p) is a decimal of up to 38 digits (VariableScaleDecimal), not a binary float
    "BINARY_FLOAT": "real",
    "BINARY_DOUBLE": "double precision",
    "DATE": "timestamp(0) without time zone",  # an Oracle DATE has a time of day, to the second
    "TIMESTAMP": "timestamp(fsp) without time zone",
    "TIMESTAMP WITH TIME ZONE": "timestamp(fsp) with time zone",
    "TIMESTAMP WITH LOCAL TIME ZONE": "timestamp(fsp) with time zone",
    "INTERVAL YEAR TO MONTH": "interval",
    "INTERVAL DAY TO SECOND": "interval",
    "CHAR": "character(n)",
    "NCHAR": "character(n)",
    "VARCHAR2": "character varying(n)",
    "VARCHAR": "character varying(n)",
    "NVARCHAR2": "character varying(n)",
    "CLOB": "text",
    "NCLOB": "text",
    "LONG": "text",
    "RAW": "bytea",
    "LONG RAW": "bytea",
    "BLOB": "bytea",
    "ROWID": "text",
    "UROWID": "text",
    "XMLTYPE": "text",
    "JSON": "json",  # Oracle 21: json keeps the text as written, jsonb would reorder keys
    "BOOLEAN": "boolean",  # Oracle 23
}
ORACLE_TYPE_ALIASES: dict[str, str] = {
    "INTEGER": "NUMBER", "INT": "NUMBER", "SMALLINT": "NUMBER", "DECIMAL": "NUMBER", "NUMERIC": "NUMBER",
    "REAL": "FLOAT", "DOUBLE PRECISION": "FLOAT", "LONGRAW": "LONG RAW", "CHARACTER": "CHAR",
    "NATIONAL CHARACTER": "NCHAR", "NATIONAL CHAR": "NCHAR",
}

TYPE_MAP_NOTES: dict[str, list[tuple[str, str]]] = {
    "oracle": [
        ("NUMBER(1-4,0) / (5-9,0) / (10-18,0)", "smallint / integer / bigint (as Debezium sends them: int8..int64)"),
        ("NUMBER(p,-s): rounded to 10^s", "smallint / integer / bigint by p + s digits, numeric beyond"),
        ("NUMBER(19-38,0), NUMBER(p,s)", "numeric(p,s)"),
        ("NUMBER without precision, FLOAT(p)", "numeric (any scale, exact)"),
        ("TIMESTAMP(7-9) and WITH (LOCAL) TIME ZONE", "6 fractional digits: PostgreSQL keeps microseconds"),
        ("TIMESTAMP WITH TIME ZONE", "timestamptz keeps the instant, not the source's zone"),
        ("CHAR / VARCHAR2 (n BYTE or n CHAR)", "character(n) / character varying(n): n characters hold n bytes"),
        ("BFILE, SDO_GEOMETRY and other object types", "text (logged as a warning): Debezium emits no value"),
        ("anything else", "text (logged as a warning)"),
    ],
}
TYPE_MAPS: dict[str, dict[str, str]] = {"oracle": ORACLE_TYPE_MAP}
# Oracle refuses to add a NOT NULL column without a DEFAULT to a table with rows: no implicit value to copy.
IMPLICIT_DEFAULTS = False
_DEFAULT_TIMESTAMP_DIGITS = 6
_PRECISION = re.compile(r"\(\s*(\d+)")
_NOW = re.compile(r"(sysdate|systimestamp|current_timestamp|localtimestamp|current_date)\s*(\(\s*\d*\s*\))?",
                  re.IGNORECASE)


def column_type(source_type: str, column: dict[str, Any], connector_type: str) -> TypeChoice | None:
    """The destination type of an Oracle column of `source_type` (Debezium's typeName), or None when the map does not
    know it. NUMBER follows Debezium's `OracleValueConverters.getNumericSchema`: without a scale (NUMBER, FLOAT) a
    VariableScaleDecimal, numeric; a scale of 0 or less an integer of p - s digits while it fits in 18; else numeric.
    A timestamp's fractional digits are the type name's precision, else the column's length (Debezium's DDL parser
    and `OracleConnection.overrideColumn` put it there)."""
    base = _base_type(source_type)
    template = ORACLE_TYPE_MAP.get(base)
    if template is None:
        return None
    if base == "NUMBER":
        return _number_type(column)
    if template.endswith("(n)"):
        length = column_number(column.get("length"))
        if length is None or not 1 <= length <= MAX_VARCHAR_LENGTH:
            return TypeChoice(template.removesuffix("(n)") if template.startswith("character varying") else "text")
    if "(fsp)" in template:
        return TypeChoice(template, min(_timestamp_digits(source_type, column), 6))
    return TypeChoice(template)


def _base_type(source_type: str) -> str:
    """`TIMESTAMP(6) WITH TIME ZONE` -> `TIMESTAMP WITH TIME ZONE`, `SYS.XMLTYPE` -> `XMLTYPE`, `LONGRAW` -> `LONG RAW`."""
    words = " ".join(re.sub(r"\(.*?\)", " ", source_type).upper().split())
    words = words.rsplit(".", 1)[-1].strip('"')
    return ORACLE_TYPE_ALIASES.get(words, words)


def _number_type(column: dict[str, Any]) -> TypeChoice:
    precision = column_number(column.get("length"))
    scale = column_number(column.get("scale"))
    if scale is None or not precision:
        return TypeChoice("numeric")
    if scale <= 0:
        width = precision - scale
        for limit, pg_type in ((5, "smallint"), (10, "integer"), (19, "bigint")):
            if width < limit:
                return TypeChoice(pg_type)
        return TypeChoice("numeric(p,s)" if scale == 0 else "numeric")
    return TypeChoice("numeric(p,s)")


def _timestamp_digits(source_type: str, column: dict[str, Any]) -> int:
    named = _PRECISION.search(source_type)
    if named:
        return int(named.group(1))
    length = column_number(column.get("length"))
    return length if length is not None and 0 <= length <= 9 else _DEFAULT_TIMESTAMP_DIGITS


def always_nullable(source_type: str) -> bool:
    """No Oracle type holds a value that replicates as NULL (Oracle's empty string is NULL at the source already)."""
    return False


def default_expression(expression: str) -> str | None:
    """A column default as Oracle keeps it (`0 `, `'abc'`, `SYSDATE`) in the form the type map's defaults read: spaces
    and outer parentheses taken off, the N of a national literal too, the clock functions as CURRENT_TIMESTAMP; None
    for NULL."""
    return default_literal(expression, _NOW)


def parse_ddl(ddl_text: str) -> list[Statement]:
    """What Oracle's DDL text (as LogMiner logged it) does: column renames (`ALTER TABLE t RENAME COLUMN a TO b`), table
    renames (`ALTER TABLE t RENAME TO u`, `RENAME t TO u`) and unique keys, in Oracle's names (quoted "as written",
    unquoted upper case). Debezium's `tableChanges` has the new definition but not which column a rename came from."""
    return parse_statements(ddl_text, ORACLE)


def debezium_properties(connector: ConnectorConfig) -> dict[str, str]:
    """The connector properties of an Oracle source (the engine's own are the runner's).

    - `lob.enabled=true`: CLOB, NCLOB and BLOB values are captured (by default Debezium leaves LOB columns out of its
      events, and the destination would hold NULL); an UPDATE that does not change a LOB sends Debezium's placeholder
      for it, which the apply never writes (`convert.dml.unavailable_placeholder`).
    - `interval.handling.mode=string`: INTERVAL YEAR TO MONTH as ISO-8601 years and months
      (`OracleValueConverters.convertOracleIntervalYearMonth`); the default (`numeric`) turns a month into 30.4375
      days of microseconds (`MicroDuration.DAYS_PER_MONTH_AVG`), which PostgreSQL's interval would keep as days.
    - `time.precision.mode=microseconds`: DATE and TIMESTAMP(n) as microseconds (`MicroTimestamp`), all PostgreSQL
      keeps. The runner's `adaptive_time_microseconds` would send TIMESTAMP(7-9) as a `NanoTimestamp`, which cannot
      hold a value before 1677-09-21 or after 2262-04-11 (Debezium's `NanoTimestamp.toEpochNanos` fails the
      connector on one; Oracle's span 4712 BC..9999).
    The runner's shared properties keep numbers exact (`decimal.handling.mode=precise`: NUMBER as decimals,
    NUMBER without precision as `VariableScaleDecimal`).
    """
    props = {"connector.class": CONNECTOR_CLASS, "database.dbname": connector.database, "lob.enabled": "true",
             "interval.handling.mode": "string", "time.precision.mode": "microseconds"}
    # Debezium's heartbeat (`HeartbeatFactory`) sends the connector's offset every heartbeat_interval_seconds, also
    # on a quiet source, to `<topic.heartbeat.prefix>.<topic.prefix>` (`AbstractTopicNamingStrategy.heartbeatTopic`);
    # the runner commits a batch of them itself.
    props["heartbeat.interval.ms"] = str(max(1, round(connector.heartbeat_interval_seconds * 1000)))
    heartbeat_prefix = connector.debezium.get("topic.heartbeat.prefix", "__debezium-heartbeat")
    props[HEARTBEAT_TOPICS_PROPERTY] = f"{heartbeat_prefix}.{connector.name}"
    return props


def replicates(connector: ConnectorConfig, source_table: str) -> bool:
    """Every table an Oracle connector reports may be replicated: the connector's `tables` list is the only filter."""
    return True


def source_partition(connector: str, database: str) -> dict[str, str]:
    """Debezium's source partition of the connector's offsets: the connector's name (its topic prefix)."""
    return {"server": connector}


# The server's reads (python-oracledb, thin mode): the change check, the preflight, row counts, and the order of
# streaming offsets.
from cdc_pipeline.sources.oracle_checks import (  # noqa: E402
    ORDERED_WITHIN_TRANSACTION, check_changes, check_position, key_range_counts, preflight, row_counts,
    stream_order)
