"""Destination tables derived from the value schemas of change events, for sources that emit no DDL events.

PostgreSQL's logical decoding carries no DDL: a new table, or a column added or dropped, first shows in the
value schema of the table's next data change. With `column.propagate.source.type` each field of that schema
carries its source type, length and scale (`__debezium.source.column.*` parameters), which map through the
PostgreSQL type map; a field without them falls back to its Connect type and logical name. The runner marks
the key columns of each schema with `KEY_POSITION_PARAMETER`, since a value schema alone does not say them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import psycopg

from cdc_pipeline.catalog import CatalogCache, DestinationTable, destination_table
from cdc_pipeline import sources
from cdc_pipeline.config import CONNECTOR_TYPES, ConnectorConfig
from cdc_pipeline.convert.ddl import TableDef, alter_table_sql, create_table_sql
from cdc_pipeline.errors import ConversionError
from cdc_pipeline.decode.events import FieldSpec
from cdc_pipeline.convert.typemap import (
    ColumnDef,
    canonical_pg_type,
    column_def_from_source,
    default_table_name,
    dest_identifier,
    knows_source_type,
)

if TYPE_CHECKING:
    from cdc_pipeline.mapping.objmap import ObjectMap

log = logging.getLogger(__name__)

KEY_POSITION_PARAMETER = "__cdc.key.position"
SOURCE_TYPE_PARAMETER = "__debezium.source.column.type"
SOURCE_LENGTH_PARAMETER = "__debezium.source.column.length"
SOURCE_SCALE_PARAMETER = "__debezium.source.column.scale"
DECIMAL_PRECISION_PARAMETER = "connect.decimal.precision"

# The source types that emit no DDL (`DDL_EVENTS` of their package: PostgreSQL): their destination tables are made
# and altered from the row images' value schemas.
SCHEMA_FROM_EVENTS_TYPES = frozenset(kind for kind in CONNECTOR_TYPES if not sources.module_for(kind).DDL_EVENTS)

CONNECT_PG_TYPES: dict[str, str] = {
    "int8": "smallint",
    "int16": "smallint",
    "int32": "integer",
    "int64": "bigint",
    "float32": "real",
    "float64": "double precision",
    "boolean": "boolean",
    "string": "text",
    "bytes": "bytea",
    "array": "text[]",  # an array whose element type the event schema does not give
}

LOGICAL_PG_TYPES: dict[str, str] = {
    "io.debezium.data.VariableScaleDecimal": "numeric",
    "io.debezium.time.Date": "date",
    "org.apache.kafka.connect.data.Date": "date",
    "io.debezium.time.Time": "time(3) without time zone",
    "org.apache.kafka.connect.data.Time": "time(3) without time zone",
    "io.debezium.time.MicroTime": "time(6) without time zone",
    "io.debezium.time.NanoTime": "time(6) without time zone",
    "io.debezium.time.ZonedTime": "time with time zone",
    "io.debezium.time.Timestamp": "timestamp(3) without time zone",
    "org.apache.kafka.connect.data.Timestamp": "timestamp(3) without time zone",
    "io.debezium.time.MicroTimestamp": "timestamp(6) without time zone",
    "io.debezium.time.NanoTimestamp": "timestamp(6) without time zone",
    "io.debezium.time.ZonedTimestamp": "timestamp with time zone",
    "io.debezium.time.Year": "integer",
    "io.debezium.data.Json": "jsonb",
    "io.debezium.data.Uuid": "uuid",
    "io.debezium.data.Xml": "xml",
    "io.debezium.data.Enum": "text",
    "io.debezium.data.EnumSet": "text",
    "io.debezium.time.MicroDuration": "interval",
    "io.debezium.time.NanoDuration": "interval",
    "io.debezium.time.Interval": "interval",
    "io.debezium.data.geometry.Geometry": "bytea",
    "io.debezium.data.geometry.Geography": "bytea",
    "io.debezium.data.geometry.Point": "bytea",
}

_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_BITS = "io.debezium.data.Bits"


def key_fields_of(fields: Sequence[FieldSpec]) -> list[str]:
    """The names of the record-key columns, in key order, as the runner marked them in the value schema."""
    marked = [(int(spec.parameters[KEY_POSITION_PARAMETER]), spec.name)
              for spec in fields if KEY_POSITION_PARAMETER in spec.parameters]
    return [name for _, name in sorted(marked)]


def column_def_from_field(spec: FieldSpec, *, connector_type: str, letter_casing: str) -> ColumnDef:
    """The destination column of one row-image field: the source type when known, else the Connect type."""
    source_type = spec.parameters.get(SOURCE_TYPE_PARAMETER)
    if connector_type in SCHEMA_FROM_EVENTS_TYPES and source_type and knows_source_type(source_type, connector_type):
        return column_def_from_source(
            {
                "name": spec.name,
                "typeName": source_type,
                "length": spec.parameters.get(SOURCE_LENGTH_PARAMETER),
                "scale": spec.parameters.get(SOURCE_SCALE_PARAMETER),
                "optional": spec.optional,
            },
            connector_type=connector_type,
            letter_casing=letter_casing,
        )
    return ColumnDef(
        name=dest_identifier(spec.name, letter_casing),
        source_name=spec.name,
        pg_type=pg_type_from_connect(spec),
        nullable=spec.optional,
        default_sql=None,
        identity=False,
        source_type=source_type or spec.logical or spec.type,
    )


def pg_type_from_connect(spec: FieldSpec) -> str:
    """The PostgreSQL type of a field from its Connect type and logical name; text (with a warning) if unknown."""
    if spec.logical == _DECIMAL:
        precision = _int_or_none(spec.parameters.get(DECIMAL_PRECISION_PARAMETER))
        scale = _int_or_none(spec.parameters.get("scale")) or 0
        return f"numeric({precision},{scale})" if precision and 0 <= scale <= precision else "numeric"
    if spec.logical == _BITS:
        length = _int_or_none(spec.parameters.get("length"))
        return f"bit({length})" if length else "bit varying"
    if spec.logical in LOGICAL_PG_TYPES:
        return LOGICAL_PG_TYPES[spec.logical]
    if spec.type in CONNECT_PG_TYPES:
        return CONNECT_PG_TYPES[spec.type]
    log.warning("Unknown Connect type %s (%s) of column %r: mapped to text", spec.type, spec.logical, spec.name)
    return "text"


def table_def_from_event_schema(fields: Sequence[FieldSpec], key_fields: Sequence[str], *,
                                connector: ConnectorConfig, source_table: str) -> TableDef:
    """The destination table of a source table as one value schema of its change events describes it.

    Names follow the applier's rule: the destination schema is `destination_schema`, else the source
    schema; `key_fields` (source names) become the primary key.
    """
    if not fields:
        raise ConversionError("the change events carry no row-image columns", connector=connector.name,
                              table=source_table)
    schema, name = default_table_name(connector, source_table)
    columns = tuple(
        column_def_from_field(spec, connector_type=connector.type, letter_casing=connector.letter_casing)
        for spec in fields
    )
    names = [column.name for column in columns]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConversionError(
            f"columns collide in letter casing {connector.letter_casing!r}: {', '.join(duplicates)}",
            connector=connector.name, table=source_table)
    primary_key = tuple(dest_identifier(name, connector.letter_casing) for name in key_fields)
    missing = [name for name in primary_key if name not in names]
    if missing:
        raise ConversionError(f"key columns not among the columns: {', '.join(missing)}",
                              connector=connector.name, table=source_table)
    return TableDef(
        schema=schema,
        name=name,
        columns=columns,
        primary_key=primary_key,
        source_id=source_table,
    )


def ensure_table_matches(cur: psycopg.Cursor, connector: ConnectorConfig, schema: str, table: str,
                         fields: Sequence[FieldSpec], key_fields: Sequence[str] | None = None, *,
                         source_table: str, position: object = None, object_map: ObjectMap | None = None,
                         on_change: Callable[[TableDef], None] | None = None,
                         catalog: CatalogCache | None = None) -> DestinationTable:
    """Makes the destination table match the events' value schema, then returns what the catalog says of it.

    For sources without DDL events (PostgreSQL) a missing table is created, with the record key (by
    default the columns the runner marked) as primary key, and a table whose columns differ is altered
    before the rows are applied; nothing runs when they already match. Column names and types follow
    `object_map`'s rules, and `on_change` is given the table definition created or altered. For the
    others a missing table is an error: their DDL events create tables. With `catalog`, the table is read through
    that run's cache, and forgotten there once altered.
    """
    def mapped(wanted: TableDef) -> TableDef:
        return replace(object_map.map_table_def(wanted) if object_map else wanted, schema=schema, name=table)

    def column_name(name: str) -> str:
        if object_map:
            return object_map.column_name(source_table, name)
        return dest_identifier(name, connector.letter_casing)

    def read() -> DestinationTable | None:
        return catalog.table(cur, schema, table) if catalog is not None else destination_table(cur, schema, table)

    existing = read()
    if connector.type not in SCHEMA_FROM_EVENTS_TYPES:
        if existing is None:
            raise ConversionError(
                f"destination table {schema}.{table} does not exist and no schema change created it",
                connector=connector.name, table=source_table, position=position)
        return existing
    if existing is None:
        keys = key_fields_of(fields) if key_fields is None else list(key_fields)
        wanted = mapped(table_def_from_event_schema(fields, keys, connector=connector, source_table=source_table))
        if not keys:
            log.warning("%s: the change events of %s carry no key: %s.%s is created without a primary key",
                        connector.name, source_table, schema, table)
        statements = create_table_sql(wanted)
        action = "created"
    else:
        destination_key = existing.primary_key[1] if existing.primary_key else ()
        keys = [spec.name for spec in fields if column_name(spec.name) in destination_key]
        wanted = _keep_chosen_types(
            mapped(table_def_from_event_schema(fields, keys, connector=connector, source_table=source_table)), existing)
        if not _differs(wanted, existing):
            return existing
        statements = alter_table_sql(wanted, existing.columns)
        action = "altered"
    try:
        for statement in statements:
            cur.execute(statement)
    except psycopg.Error as exc:
        raise ConversionError(f"cannot bring {schema}.{table} to the events' columns: {exc}",
                              connector=connector.name, table=source_table, position=position) from exc
    log.info("%s: %s %s.%s from the value schema of %s (%d statements) at %s", connector.name, action, schema,
             table, source_table, len(statements), position)
    if on_change is not None:
        on_change(wanted)
    if catalog is not None:
        catalog.forget(schema, table)
    altered = read()
    assert altered is not None
    return altered


def _keep_chosen_types(wanted: TableDef, existing: DestinationTable) -> TableDef:
    """The definition with the destination's own type kept for the columns whose type its owner chose (a domain,
    an enum, citext, ...: `DestinationTable.user_typed`): the events never retype them."""
    chosen = existing.user_typed
    if not chosen:
        return wanted
    return replace(wanted, columns=[replace(column, pg_type=existing.columns[column.name]) if column.name in chosen
                                    else column for column in wanted.columns])


def _differs(wanted: TableDef, existing: DestinationTable) -> bool:
    """Whether the columns, their types, or a column that became nullable differ from the destination's."""
    if {column.name for column in wanted.columns} != set(existing.columns):
        return True
    key = set(wanted.primary_key)
    return any(
        canonical_pg_type(column.pg_type) != canonical_pg_type(existing.columns[column.name])
        or (column.nullable and column.name in existing.not_null and column.name not in key)
        for column in wanted.columns
    )


def _int_or_none(value: object) -> int | None:
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def field_specs_of(columns: Sequence[Any], key: Sequence[str]) -> list[FieldSpec]:
    """A source table's columns (as a source type's catalog lists them: name, data type, length, scale, nullable)
    the way the value schema of its first change event would describe them, its primary key's positions included:
    the stream's own rule then creates or alters the destination table (`ensure_table_matches`) for a bulk snapshot
    that runs before any change event arrives."""
    specs = []
    for column in columns:
        parameters = {SOURCE_TYPE_PARAMETER: column.data_type}
        if column.length is not None:
            parameters[SOURCE_LENGTH_PARAMETER] = str(column.length)
        if column.scale is not None:
            parameters[SOURCE_SCALE_PARAMETER] = str(column.scale)
        if column.name in key:
            parameters[KEY_POSITION_PARAMETER] = str(list(key).index(column.name))
        specs.append(FieldSpec(name=column.name, type="string", logical=None, parameters=parameters,
                               optional=column.nullable))
    return specs
