"""A PostgreSQL source's type map: its columns to the destination's by type name, the aliases, the rules the map does
not show, and how a column reads by them (`column_type`, arrays included)."""

from __future__ import annotations

from typing import Any

from cdc_pipeline.sources.type_choice import TypeChoice, column_length, column_number

GEOMETRY_TYPES: frozenset[str] = frozenset()


# PostgreSQL's columns to the destination's, by type name (convert/typemap.py reads them).
POSTGRES_TYPE_MAP: dict[str, str] = {
    "int2": "smallint",
    "smallint": "smallint",
    "smallserial": "smallint",
    "int4": "integer",
    "integer": "integer",
    "serial": "integer",
    "int8": "bigint",
    "bigint": "bigint",
    "bigserial": "bigint",
    "numeric": "numeric(p,s)",
    "decimal": "numeric(p,s)",
    "text": "text",
    "varchar": "character varying(n)",
    "bpchar": "character(n)",
    "bool": "boolean",
    "float4": "real",
    "float8": "double precision",
    "date": "date",
    "time": "time(fsp) without time zone",
    "timetz": "time(fsp) with time zone",
    "timestamp": "timestamp(fsp) without time zone",
    "timestamptz": "timestamp(fsp) with time zone",
    "bytea": "bytea",
    "json": "json",
    "jsonb": "jsonb",
    "uuid": "uuid",
    "interval": "interval",
    "xml": "xml",
    "bit": "bit(n)",
    "varbit": "bit varying(n)",
    "inet": "inet",
    "cidr": "cidr",
    "macaddr": "macaddr",
    "macaddr8": "macaddr8",
    "money": "numeric(19,2)",
    "point": "point",
    "int4range": "int4range",
    "int8range": "int8range",
    "numrange": "numrange",
    "daterange": "daterange",
    "tsrange": "tsrange",
    "tstzrange": "tstzrange",
}

POSTGRES_TYPE_ALIASES: dict[str, str] = {
    "character varying": "varchar",
    "character": "bpchar",
    "char": "bpchar",
    "boolean": "bool",
    "real": "float4",
    "double precision": "float8",
    "time without time zone": "time",
    "time with time zone": "timetz",
    "timestamp without time zone": "timestamp",
    "timestamp with time zone": "timestamptz",
}

# The rules the map above does not show, as the docs print them beside it.
TYPE_MAP_NOTES: dict[str, list[tuple[str, str]]] = {
    "postgres": [
        ("numeric without precision", "numeric"),
        ("time types without precision", "PostgreSQL's default (6 digits)"),
        ("arrays of the types above (`_int4` ...)", "the element's type, as an array (`integer[]` ...)"),
        ("arrays of other types", "text[]"),
        ("enum types", "text"),
        ("anything else", "text (logged as a warning)"),
    ],
}
TYPE_MAPS: dict[str, dict[str, str]] = {"postgres": POSTGRES_TYPE_MAP}
# PostgreSQL emits no DDL: no column is added by a statement whose implicit default the destination would need.
IMPLICIT_DEFAULTS = False
# An update's event leaves an unchanged TOASTed value out, as Debezium's placeholder
# (`unavailable.value.placeholder`).
LEAVES_VALUES_OUT = True


def column_type(source_type: str, column: dict[str, Any], connector_type: str) -> TypeChoice | None:
    """The destination type of a PostgreSQL column of `source_type` (Debezium's type name), or None when the map does
    not know it. `column` is the Debezium column description, read for its length and scale. An array of a type the
    map knows is an array of that type's destination type, of another type `text[]`."""
    element = array_element(source_type)
    if element is None:
        return _scalar_type(source_type, column)
    choice = _scalar_type(element, column)
    return TypeChoice("text[]") if choice is None else TypeChoice(choice.template + "[]", choice.fractional_digits)


def _scalar_type(source_type: str, column: dict[str, Any]) -> TypeChoice | None:
    base = " ".join(source_type.strip().strip('"').lower().split())
    template = POSTGRES_TYPE_MAP.get(base) or POSTGRES_TYPE_MAP.get(POSTGRES_TYPE_ALIASES.get(base, ""))
    if template is None:
        return None
    if template == "character(n)" and column_length(column.get("length")) is None:
        return TypeChoice("bpchar")
    scale = column_number(column.get("scale"))
    return TypeChoice(template, scale if scale is not None and 0 <= scale <= 6 else None)


def array_element(source_type: str) -> str | None:
    """The element type of a PostgreSQL array type as Debezium names it (`_int4` -> `int4`), or None."""
    base = " ".join(source_type.strip().strip('"').lower().split())
    if base.startswith("_"):
        return base[1:]
    if base.endswith("[]"):
        return base[:-2].rstrip()
    return None


def always_nullable(source_type: str) -> bool:
    """No PostgreSQL type holds a value that replicates as NULL: a column's nullability is its definition's."""
    return False
