"""Debezium schema-change events to idempotent PostgreSQL DDL statements.

A schema-change payload lists `tableChanges` (CREATE, ALTER, DROP), each with the table's full new
definition. `changes_from_schema_event` turns them into `DdlChange`s; `create_table_sql`,
`alter_table_sql` and `drop_table_sql` turn those into statements that can run again without harm
(IF NOT EXISTS / IF EXISTS), built only with `psycopg.sql`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from cdc_pipeline.errors import ConversionError
from cdc_pipeline.typemap import (
    INTEGER_PG_TYPES,
    ColumnDef,
    canonical_pg_type,
    column_def_from_source,
    dest_identifier,
)

logger = logging.getLogger(__name__)

_POSITION_KEYS = ("file", "pos", "row", "gtid", "lsn", "change_lsn", "commit_lsn", "scn")
_NUMBER_BASES = INTEGER_PG_TYPES | {"numeric", "real", "double precision"}


@dataclass(frozen=True)
class TableDef:
    """A destination table: schema, name, columns and primary key, all in destination spelling."""

    schema: str
    name: str
    columns: tuple[ColumnDef, ...]
    primary_key: tuple[str, ...]
    source_id: str


@dataclass(frozen=True)
class DdlChange:
    """One table change of a schema-change event: "create", "alter" (with the new `table`) or "drop"."""

    kind: str
    table: TableDef | None
    schema: str
    name: str
    source_table: str
    ddl_text: str


def parse_table_id(table_id: str) -> tuple[str, ...]:
    """Split a Debezium table id such as `"inventory"."my.table"` into its parts, honouring quotes ("" is ")."""
    parts: list[str] = []
    index = 0
    while True:
        if index < len(table_id) and table_id[index] == '"':
            part, index = _read_quoted(table_id, index)
        else:
            end = table_id.find(".", index)
            end = len(table_id) if end < 0 else end
            part, index = table_id[index:end], end
        if not part:
            raise ValueError(f"empty part in table id {table_id!r}")
        parts.append(part)
        if index == len(table_id):
            return tuple(parts)
        if table_id[index] != ".":
            raise ValueError(f"unexpected {table_id[index]!r} at offset {index} of table id {table_id!r}")
        index += 1


def table_def_from_change(
    table_change: dict[str, Any],
    *,
    connector: str,
    connector_type: str,
    letter_casing: str,
    destination_schema: str | None,
    position: Any = None,
) -> TableDef:
    """Build the destination table definition from one CREATE or ALTER entry of `tableChanges`.

    The destination schema is `destination_schema` when given, else the source database (or schema)
    name in the chosen letter casing. Columns keep the source order (`position`).
    """
    parts = _table_id_parts(table_change, connector=connector, position=position)
    source_id = ".".join(parts)
    schema, name = _destination_names(parts, letter_casing, destination_schema, connector, position)
    table = table_change.get("table")
    if not isinstance(table, dict) or not table.get("columns"):
        raise ConversionError(
            f"{table_change.get('type')} change without columns",
            connector=connector,
            table=source_id,
            position=position,
        )
    source_columns = sorted(table["columns"], key=lambda column: column.get("position") or 0)
    try:
        columns = tuple(
            column_def_from_source(column, connector_type=connector_type, letter_casing=letter_casing)
            for column in source_columns
        )
    except ConversionError as error:
        raise ConversionError(error.message, connector=connector, table=source_id, position=position) from error
    names = [column.name for column in columns]
    duplicates = sorted({column_name for column_name in names if names.count(column_name) > 1})
    if duplicates:
        raise ConversionError(
            f"columns collide in letter casing {letter_casing!r}: {', '.join(duplicates)}",
            connector=connector,
            table=source_id,
            position=position,
        )
    primary_key = tuple(dest_identifier(key, letter_casing) for key in table.get("primaryKeyColumnNames") or ())
    missing = [key for key in primary_key if key not in names]
    if missing:
        raise ConversionError(
            f"primary key columns not among the columns: {', '.join(missing)}",
            connector=connector,
            table=source_id,
            position=position,
        )
    return TableDef(schema=schema, name=name, columns=columns, primary_key=primary_key, source_id=source_id)


def changes_from_schema_event(
    payload: dict[str, Any],
    *,
    connector: str,
    connector_type: str,
    letter_casing: str,
    destination_schema: str | None,
) -> list[DdlChange]:
    """Return the table changes of a schema-change event payload; statements without table changes give [].

    DROP entries emitted while snapshotting are skipped: Debezium writes `DROP TABLE IF EXISTS` before
    each CREATE of a snapshot to rebuild its own schema history, not because the table was dropped, and
    applying it would empty the destination table on every new snapshot.
    """
    position = _source_position(payload)
    ddl_text = payload.get("ddl") or ""
    snapshotting = str((payload.get("source") or {}).get("snapshot") or "false").lower() != "false"
    changes: list[DdlChange] = []
    for table_change in payload.get("tableChanges") or ():
        kind = str(table_change.get("type") or "").lower()
        parts = _table_id_parts(table_change, connector=connector, position=position)
        source_table = ".".join(parts)
        if kind == "drop":
            if snapshotting:
                logger.debug("Skipped snapshot %r for %s", ddl_text, source_table)
                continue
            schema, name = _destination_names(parts, letter_casing, destination_schema, connector, position)
            changes.append(DdlChange("drop", None, schema, name, source_table, ddl_text))
        elif kind in ("create", "alter"):
            table = table_def_from_change(
                table_change,
                connector=connector,
                connector_type=connector_type,
                letter_casing=letter_casing,
                destination_schema=destination_schema,
                position=position,
            )
            changes.append(DdlChange(kind, table, table.schema, table.name, source_table, ddl_text))
        else:
            raise ConversionError(
                f"unknown table change type {table_change.get('type')!r}",
                connector=connector,
                table=source_table,
                position=position,
            )
    return changes


def create_table_sql(table: TableDef) -> list[sql.Composed]:
    """Return CREATE SCHEMA IF NOT EXISTS and CREATE TABLE IF NOT EXISTS for the table; does nothing if it exists."""
    elements = [_column_sql(column, not_null=not column.nullable) for column in table.columns]
    if table.primary_key:
        elements.append(
            sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(sql.Identifier(key) for key in table.primary_key))
        )
    return [
        sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(table.schema)),
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            sql.Identifier(table.schema, table.name), sql.SQL(", ").join(elements)
        ),
    ]


def drop_table_sql(schema: str, name: str) -> list[sql.Composed]:
    """Return DROP TABLE IF EXISTS for the table; does nothing if it is already gone."""
    return [sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(schema, name))]


def alter_table_sql(
    table: TableDef, existing_columns: dict[str, str], *, preserve: Iterable[str] = ()
) -> list[sql.Composed]:
    """Return the statements that bring an existing destination table to the new definition.

    `existing_columns` maps destination column names to their types as `format_type()` spells them;
    an empty mapping means the table does not exist, and the statements create it. Missing columns are
    added, columns no longer in the definition dropped (except those named in `preserve`, such as
    columns the pipeline itself adds), and changed types altered with a USING cast. A NOT NULL column
    added without a default is first filled with the value MySQL/MariaDB give existing rows. Columns
    that became nullable lose NOT NULL; a column that became NOT NULL is left as it is, since that
    constraint could fail on rows the source fixed silently.
    """
    if not existing_columns:
        return create_table_sql(table)
    existing = {name: canonical_pg_type(pg_type) for name, pg_type in existing_columns.items()}
    target = sql.Identifier(table.schema, table.name)
    statements: list[sql.Composed] = []
    for column in table.columns:
        if column.name not in existing:
            statements.extend(_add_column_sql(target, column, table))
        elif canonical_pg_type(column.pg_type) != existing[column.name]:
            statements.extend(_retype_column_sql(target, column, existing[column.name]))
    relaxed = [
        sql.SQL("ALTER COLUMN {} DROP NOT NULL").format(sql.Identifier(column.name))
        for column in table.columns
        if column.name in existing
        and column.nullable
        and column.name not in table.primary_key
        and not _emits_identity(column)
    ]
    if relaxed:
        statements.append(sql.SQL("ALTER TABLE {} {}").format(target, sql.SQL(", ").join(relaxed)))
    wanted = {column.name for column in table.columns} | set(preserve)
    for name in existing:
        if name not in wanted:
            statements.append(
                sql.SQL("ALTER TABLE {} DROP COLUMN IF EXISTS {}").format(target, sql.Identifier(name))
            )
    return statements


def _emits_identity(column: ColumnDef) -> bool:
    """Only integer columns can be identities; replicated rows carry their values, hence BY DEFAULT."""
    return column.identity and column.pg_type in INTEGER_PG_TYPES


def _column_sql(column: ColumnDef, *, not_null: bool) -> sql.Composed:
    parts: list[sql.Composable] = [sql.Identifier(column.name), sql.SQL(column.pg_type)]
    if not_null:
        parts.append(sql.SQL("NOT NULL"))
    if _emits_identity(column):
        parts.append(sql.SQL("GENERATED BY DEFAULT AS IDENTITY"))
    elif column.default_sql is not None:
        parts.append(sql.SQL("DEFAULT {}").format(sql.SQL(column.default_sql)))
    return sql.SQL(" ").join(parts)


def _add_column_sql(target: sql.Identifier, column: ColumnDef, table: TableDef) -> list[sql.Composed]:
    add = sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {}")
    if column.nullable or column.default_sql is not None or _emits_identity(column):
        return [add.format(target, _column_sql(column, not_null=not column.nullable))]
    if column.implicit_default_sql is not None:
        filled = sql.SQL("{} {} NOT NULL DEFAULT {}").format(
            sql.Identifier(column.name), sql.SQL(column.pg_type), sql.SQL(column.implicit_default_sql)
        )
        return [
            add.format(target, filled),
            sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP DEFAULT").format(target, sql.Identifier(column.name)),
        ]
    logger.warning(
        "Column %r of %s is NOT NULL without a default and no value fills existing rows: added as nullable",
        column.name,
        table.source_id,
    )
    return [add.format(target, _column_sql(column, not_null=False))]


def _retype_column_sql(target: sql.Identifier, column: ColumnDef, old_type: str) -> list[sql.Composed]:
    name = sql.Identifier(column.name)
    retype = sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {} USING {}").format(
        target, name, sql.SQL(column.pg_type), _using_cast(name, old_type, column.pg_type)
    )
    if _emits_identity(column):
        return [retype]
    statements = [
        sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP IDENTITY IF EXISTS").format(target, name),
        sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP DEFAULT").format(target, name),
        retype,
    ]
    if column.default_sql is not None:
        statements.append(
            sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET DEFAULT {}").format(target, name, sql.SQL(column.default_sql))
        )
    return statements


def _using_cast(name: sql.Identifier, old_type: str, new_type: str) -> sql.Composed:
    """PostgreSQL has no direct cast between boolean and smallint, numeric or bit: go through integer."""
    old_base, new_base = old_type.split("(", 1)[0], new_type.split("(", 1)[0]
    through_integer = (new_base == "boolean" and (old_base in _NUMBER_BASES or old_base == "bit")) or (
        old_base == "boolean" and new_base in _NUMBER_BASES - {"integer"}
    )
    template = "{}::integer::{}" if through_integer else "{}::{}"
    return sql.SQL(template).format(name, sql.SQL(new_type))


def _read_quoted(text: str, start: int) -> tuple[str, int]:
    characters: list[str] = []
    index = start + 1
    while index < len(text):
        if text[index] == '"':
            if text.startswith('""', index):
                characters.append('"')
                index += 2
                continue
            return "".join(characters), index + 1
        characters.append(text[index])
        index += 1
    raise ValueError(f"unterminated quote in table id {text!r}")


def _table_id_parts(table_change: dict[str, Any], *, connector: str, position: Any) -> tuple[str, ...]:
    table_id = table_change.get("id")
    try:
        return parse_table_id(str(table_id or ""))
    except ValueError as error:
        raise ConversionError(str(error), connector=connector, table=str(table_id), position=position) from error


def _destination_names(
    parts: tuple[str, ...], letter_casing: str, destination_schema: str | None, connector: str, position: Any
) -> tuple[str, str]:
    if destination_schema:
        schema = destination_schema
    elif len(parts) >= 2:
        schema = dest_identifier(parts[-2], letter_casing)
    else:
        raise ConversionError(
            "table id names no database or schema and no destination schema is configured",
            connector=connector,
            table=".".join(parts),
            position=position,
        )
    return schema, dest_identifier(parts[-1], letter_casing)


def _source_position(payload: dict[str, Any]) -> dict[str, Any] | None:
    source = payload.get("source") or {}
    position = {key: source[key] for key in _POSITION_KEYS if source.get(key) is not None}
    return position or None
