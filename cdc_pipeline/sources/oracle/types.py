"""Oracle's types: the type map (columns as Debezium describes them in `tableChanges`: from ojdbc's `getColumns` in a
snapshot, from its Oracle DDL parser's `ColumnDefinitionParserListener` while streaming), its notes, NUMBER's and
TIMESTAMP's rules, and how a column's default reads."""

from __future__ import annotations

import re
from typing import Any

from cdc_pipeline.sources.type_choice import MAX_VARCHAR_LENGTH, TypeChoice, column_number, default_literal


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
# An event may leave a LOB out, as Debezium's placeholder (`unavailable.value.placeholder`).
LEAVES_VALUES_OUT = True
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
