"""Debezium schema-change events to idempotent PostgreSQL DDL statements.

A schema-change payload lists `tableChanges` (CREATE, ALTER, DROP), each with the table's full new
definition. What that definition cannot tell, the DDL text does: column and table renames
(`parse_renames`) and unique keys (`parse_unique_keys`), read by `sources/ddl_text.py`. `changes_from_schema_event` turns both into
`DdlChange`s; `create_table_sql`, `alter_table_sql`, `rename_table_sql` and `drop_table_sql` turn those
into statements that can run again without harm (IF NOT EXISTS / IF EXISTS, or guarded by a diff
against the destination catalog), built only with `psycopg.sql`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from psycopg import sql

from cdc_pipeline.config import DATABASE_PLACEHOLDER
from cdc_pipeline.errors import ConversionError
from cdc_pipeline.sources.type_choice import balanced
from cdc_pipeline import sources
from cdc_pipeline.sources.ddl_text import QualifiedName, Statement, names_table, statements_about
from cdc_pipeline.convert.typemap import (
    INTEGER_PG_TYPES,
    ColumnDef,
    canonical_pg_type,
    column_def_from_source,
    dest_identifier,
)

logger = logging.getLogger(__name__)

_POSITION_KEYS = ("file", "pos", "row", "gtid", "lsn", "change_lsn", "commit_lsn", "scn")
_NUMBER_BASES = INTEGER_PG_TYPES | {"numeric", "real", "double precision"}
_MAX_IDENTIFIER_BYTES = 63

@dataclass(frozen=True)
class TableDef:
    """A destination table: schema, name, columns, primary key and unique keys, all in destination spelling.

    `unique_keys` pairs a constraint name with its columns; for an ALTER it holds only the keys the
    statement adds, since the source reports unique keys in the DDL text alone.
    """

    schema: str
    name: str
    columns: tuple[ColumnDef, ...]
    primary_key: tuple[str, ...]
    source_id: str
    unique_keys: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class DdlChange:
    """One table change of a schema-change event: "create", "alter" (with the new `table`) or "drop".

    What the DDL text adds, in destination names: `column_renames` (old, new), `renamed_from`
    (schema, old table name) when the table was renamed (`previous_source_table` is its old source id),
    and for an ALTER the unique constraints it adds (`unique_added`, also in `table.unique_keys`) and
    drops (`unique_dropped`).
    """

    kind: str
    table: TableDef | None
    schema: str
    name: str
    source_table: str
    ddl_text: str
    column_renames: tuple[tuple[str, str], ...] = ()
    renamed_from: tuple[str, str] | None = None
    unique_added: tuple[tuple[str, tuple[str, ...]], ...] = ()
    unique_dropped: tuple[str, ...] = ()
    previous_source_table: str | None = None


class _UnknownPrimaryKey:
    def __repr__(self) -> str:
        return "UNKNOWN_PRIMARY_KEY"


UNKNOWN_PRIMARY_KEY: Any = _UnknownPrimaryKey()
"""Default of `alter_table_sql(existing_primary_key=...)`: the caller did not look, so leave the key alone."""


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


def ddl_statements(ddl_text: str, connector_type: str) -> list[Statement]:
    """What the DDL text of a schema change does, read by the source type's parser (`parse_ddl` of its package:
    MariaDB/MySQL's, Oracle's names and quoting, none for SQL Server and PostgreSQL, whose changes carry no text)."""
    return sources.module_for(connector_type).parse_ddl(ddl_text)


DROP_DATABASE = "drop_database"


def dropped_database(payload: dict[str, Any], connector_type: str) -> str | None:
    """The database a streamed schema change drops (`DROP DATABASE`, `dropped_database` of the source package:
    MariaDB/MySQL's), or None. Debezium's event of it carries no table changes."""
    dropped = sources.module_for(connector_type).dropped_database
    return None if dropped is None else dropped(payload)


def database_drop(database: str, ddl_text: str) -> DdlChange:
    """The change that drops each destination table of the source database's tables (the applier lists them:
    `DROP_DATABASE`), in the DDL step of the statement."""
    return DdlChange(DROP_DATABASE, None, "", "", f"{database}.", ddl_text)


def source_table_of(parts: tuple[str, ...]) -> str:
    """The source table of a Debezium table id as data events name it: `db.table` (MariaDB/MySQL),
    `schema.table` (PostgreSQL; SQL Server's `shop.dbo.items` and Oracle's `ORCLPDB1.DEBEZIUM.ITEMS` without their
    database, which the connector names)."""
    return ".".join(parts[-2:])


def table_def_from_change(
    table_change: dict[str, Any],
    *,
    connector: str,
    connector_type: str,
    letter_casing: str,
    destination_schema: str | None,
    position: Any = None,
    ddl_text: str | None = None,
) -> TableDef:
    """Build the destination table definition from one CREATE or ALTER entry of `tableChanges`.

    The destination schema is `destination_schema` when given, else the source database (or schema)
    name in the chosen letter casing. Columns keep the source order (`position`). With `ddl_text`,
    the unique keys that text declares for this table fill `unique_keys`.
    """
    parts = _table_id_parts(table_change, connector=connector, position=position)
    source_id = source_table_of(parts)
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
    statements = statements_about(ddl_statements(ddl_text or "", connector_type), parts)
    unique_keys = _destination_unique_keys(statements, name, set(names), letter_casing, source_id)
    return TableDef(
        schema=schema,
        name=name,
        columns=columns,
        primary_key=primary_key,
        source_id=source_id,
        unique_keys=unique_keys,
    )


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
    applying it would empty the destination table on every new snapshot. Renames and unique keys are
    read from the DDL text, for the table each statement is about; a RENAME TABLE of several tables
    gives each change the pair whose new name is the change's table.
    """
    position = _source_position(payload)
    ddl_text = payload.get("ddl") or ""
    snapshotting = str((payload.get("source") or {}).get("snapshot") or "false").lower() != "false"
    statements = ddl_statements(ddl_text, connector_type)
    changes: list[DdlChange] = []
    for table_change in payload.get("tableChanges") or ():
        kind = str(table_change.get("type") or "").lower()
        parts = _table_id_parts(table_change, connector=connector, position=position)
        source_table = source_table_of(parts)
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
                ddl_text=ddl_text,
            )
            about = statements_about(statements, parts)
            previous = _previous_table(table_change, statements, parts, connector, position)
            renamed_from = _renamed_from(previous, table, letter_casing, destination_schema)
            change = DdlChange(
                kind,
                table,
                table.schema,
                table.name,
                source_table,
                ddl_text,
                renamed_from=renamed_from,
                previous_source_table=None if renamed_from is None else _source_id(previous, parts),
            )
            if kind == "alter":
                change = dataclasses.replace(
                    change,
                    column_renames=_destination_column_renames(about, table, letter_casing),
                    unique_added=table.unique_keys,
                    unique_dropped=tuple(
                        _unique_constraint_name(table.name, dest_identifier(index, letter_casing))
                        for statement in about
                        for index in statement.unique_dropped
                    ),
                )
            changes.append(change)
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
    elements.extend(unique_constraint_sql(name, columns) for name, columns in table.unique_keys)
    return [
        sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(table.schema)),
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            sql.Identifier(table.schema, table.name), sql.SQL(", ").join(elements)
        ),
    ]


def drop_table_sql(schema: str, name: str) -> list[sql.Composed]:
    """Return DROP TABLE IF EXISTS for the table; does nothing if it is already gone."""
    return [sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(schema, name))]


def rename_table_sql(schema: str, old: str, new: str, *, new_schema: str | None = None) -> list[sql.Composed]:
    """Return ALTER TABLE IF EXISTS ... RENAME TO, then SET SCHEMA when `new_schema` differs; does nothing once done."""
    statements = [
        sql.SQL("ALTER TABLE IF EXISTS {} RENAME TO {}").format(sql.Identifier(schema, old), sql.Identifier(new))
    ]
    if new_schema is not None and new_schema != schema:
        statements += [
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(new_schema)),
            sql.SQL("ALTER TABLE IF EXISTS {} SET SCHEMA {}").format(
                sql.Identifier(schema, new), sql.Identifier(new_schema)
            ),
        ]
    return statements


def alter_table_sql(
    table: TableDef,
    existing_columns: dict[str, str],
    *,
    preserve: Iterable[str] = (),
    existing_primary_key: tuple[str, tuple[str, ...]] | None = UNKNOWN_PRIMARY_KEY,
    column_renames: Iterable[tuple[str, str]] = (),
    existing_defaults: dict[str, str | None] | None = None,
    existing_not_null: set[str] | None = None,
    existing_unique: dict[str, tuple[str, ...]] | None = None,
    unique_dropped: Iterable[str] = (),
    user_typed: Iterable[str] = (),
) -> list[sql.Composed]:
    """Return the statements that bring an existing destination table to the new definition.

    `existing_columns` maps destination column names to their types as `format_type()` spells them;
    an empty mapping means the table does not exist, and the statements create it. The other
    `existing_*` arguments describe the catalog too; one left out (None, or UNKNOWN_PRIMARY_KEY for
    the key, since None there means "no primary key") is not diffed.

    In order: `column_renames` whose old column exists and new one does not are renamed (a rename
    delivered again does nothing); dropped unique constraints and a changed primary key are dropped;
    missing columns are added, changed types altered with a USING cast; nullability and defaults
    follow the new definition; columns no longer in it are dropped (except those in `preserve`, such
    as columns the pipeline itself adds); then the new primary key and missing unique keys are added.
    Columns in `user_typed` have a type the destination's owner chose (a domain, an enum, citext, ...; see
    `catalog.ColumnType`): their type and default are never changed, values reach them by the type's category.
    A NOT NULL column added without a default is first filled with the value MySQL/MariaDB give
    existing rows, and so are NULLs of a column that becomes NOT NULL. Without `existing_not_null`,
    nullable columns lose NOT NULL and a column that became NOT NULL is left as it is.
    """
    if not existing_columns:
        return create_table_sql(table)
    target = sql.Identifier(table.schema, table.name)
    wanted = {column.name for column in table.columns}
    existing = {name: canonical_pg_type(pg_type) for name, pg_type in existing_columns.items()}
    statements: list[sql.Composed] = []
    renamed: dict[str, str] = {}
    for old, new in column_renames:
        if old == new or old not in existing or new in existing or new not in wanted or old in wanted:
            continue
        statements.append(
            sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}").format(target, sql.Identifier(old), sql.Identifier(new))
        )
        existing[new] = existing.pop(old)
        renamed[old] = new

    def current(name: str) -> str:
        return renamed.get(name, name)

    chosen_types = {current(name) for name in user_typed}

    primary_key_changes = False
    if existing_primary_key is not UNKNOWN_PRIMARY_KEY:
        old_key = tuple(current(name) for name in existing_primary_key[1]) if existing_primary_key else ()
        primary_key_changes = old_key != table.primary_key
    unique = None
    if existing_unique is not None:
        unique = {name: tuple(current(column) for column in columns) for name, columns in existing_unique.items()}
    statements.extend(_drop_unique_sql(target, table.name, unique, unique_dropped))
    if primary_key_changes and existing_primary_key:
        statements.append(
            sql.SQL("ALTER TABLE {} DROP CONSTRAINT IF EXISTS {}").format(
                target, sql.Identifier(existing_primary_key[0])
            )
        )

    kept: set[str] = set()
    for column in table.columns:
        if column.name not in existing:
            statements.extend(_add_column_sql(target, column, table))
        elif column.name in chosen_types:
            continue
        elif canonical_pg_type(column.pg_type) != existing[column.name]:
            statements.extend(_retype_column_sql(target, column, existing[column.name]))
        else:
            kept.add(column.name)
    not_null = None if existing_not_null is None else {current(name) for name in existing_not_null}
    statements.extend(_nullability_sql(target, table, existing, not_null))
    if existing_defaults is not None:
        defaults = {current(name): default for name, default in existing_defaults.items()}
        statements.extend(_defaults_sql(target, table, kept, defaults))
    kept_columns = wanted | set(preserve)
    for name in existing:
        if name not in kept_columns:
            statements.append(
                sql.SQL("ALTER TABLE {} DROP COLUMN IF EXISTS {}").format(target, sql.Identifier(name))
            )

    if primary_key_changes and table.primary_key:
        statements.append(
            sql.SQL("ALTER TABLE {} ADD PRIMARY KEY ({})").format(
                target, sql.SQL(", ").join(sql.Identifier(key) for key in table.primary_key)
            )
        )
    if unique is not None:
        for name, columns in table.unique_keys:
            if name not in unique:
                statements.append(
                    sql.SQL("ALTER TABLE {} ADD {}").format(target, unique_constraint_sql(name, columns))
                )
            elif unique[name] != columns:
                logger.warning(
                    "Unique constraint %r of %s covers %s in the destination, not %s: left as it is",
                    name,
                    table.source_id,
                    unique[name],
                    columns,
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


def unique_constraint_sql(name: str, columns: tuple[str, ...]) -> sql.Composed:
    """Deferred, because a batch applies each row's final state: rows swapping values would clash midway."""
    return sql.SQL("CONSTRAINT {} UNIQUE ({}) DEFERRABLE INITIALLY DEFERRED").format(
        sql.Identifier(name), sql.SQL(", ").join(sql.Identifier(column) for column in columns)
    )


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


def _nullability_sql(
    target: sql.Identifier, table: TableDef, existing: dict[str, str], not_null: set[str] | None
) -> list[sql.Composed]:
    """DROP NOT NULL where the column became nullable; SET NOT NULL, after filling NULLs, where it stopped being.

    Without `not_null` the current nullability is unknown: every nullable column loses NOT NULL and no
    column gains it. MariaDB turns the NULLs of a column made NOT NULL into the type's implicit
    default without logging rows, so the same fill runs here; with no such value the column stays nullable.
    """
    relaxed = [
        sql.SQL("ALTER COLUMN {} DROP NOT NULL").format(sql.Identifier(column.name))
        for column in table.columns
        if column.name in existing
        and column.nullable
        and (not_null is None or column.name in not_null)
        and column.name not in table.primary_key
        and not _emits_identity(column)
    ]
    statements = []
    if relaxed:
        statements.append(sql.SQL("ALTER TABLE {} {}").format(target, sql.SQL(", ").join(relaxed)))
    if not_null is None:
        return statements
    for column in table.columns:
        if column.name not in existing or column.nullable or column.name in not_null or _emits_identity(column):
            continue
        name = sql.Identifier(column.name)
        if column.implicit_default_sql is None:
            logger.warning(
                "Column %r of %s became NOT NULL but no value replaces its NULLs: left nullable",
                column.name,
                table.source_id,
            )
            continue
        statements += [
            sql.SQL("UPDATE {} SET {} = {} WHERE {} IS NULL").format(
                target, name, sql.SQL(column.implicit_default_sql), name
            ),
            sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET NOT NULL").format(target, name),
        ]
    return statements


def _defaults_sql(
    target: sql.Identifier, table: TableDef, kept: set[str], defaults: dict[str, str | None]
) -> list[sql.Composed]:
    """SET or DROP DEFAULT where a kept column's default changed; added and retyped columns got theirs already."""
    statements = []
    for column in table.columns:
        if column.name not in kept or _emits_identity(column):
            continue
        name = sql.Identifier(column.name)
        current = defaults.get(column.name)
        if column.default_sql is None:
            if current is not None:
                statements.append(sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP DEFAULT").format(target, name))
        elif current is None or not _same_default(column.default_sql, current):
            statements.append(
                sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET DEFAULT {}").format(
                    target, name, sql.SQL(column.default_sql)
                )
            )
    return statements


def _drop_unique_sql(
    target: sql.Identifier, table_name: str, unique: dict[str, tuple[str, ...]] | None, dropped: Iterable[str]
) -> list[sql.Composed]:
    """DROP CONSTRAINT IF EXISTS for each dropped key; the catalog's names (when known) also cover a renamed table.

    A constraint keeps the name it was made with, `<old table>_<key>_key`, when its table is renamed;
    with the catalog known, the one constraint whose name differs only in that prefix is dropped.
    """
    statements = []
    for name in dropped:
        if unique is not None:
            found = _constraint_of_dropped_key(name, table_name, unique)
            if found is None:
                continue
            del unique[found]
            name = found
        statements.append(sql.SQL("ALTER TABLE {} DROP CONSTRAINT IF EXISTS {}").format(target, sql.Identifier(name)))
    return statements


def _constraint_of_dropped_key(name: str, table_name: str, unique: dict[str, tuple[str, ...]]) -> str | None:
    if name in unique:
        return name
    prefix = f"{table_name}_"
    if not name.startswith(prefix):
        return None
    suffix = name[len(table_name) :]
    candidates = [other for other in unique if other.endswith(suffix) and not other.startswith(prefix)]
    return candidates[0] if len(candidates) == 1 else None


_TRAILING_CAST = re.compile(r"(.*?)::[\w\s\".,()\[\]]+", re.DOTALL)
_QUOTED_LITERAL = re.compile(r"([EeBbXxNn]?)'((?:[^']|'')*)'", re.DOTALL)


def _same_default(wanted: str, current: str) -> bool:
    """Compare a default expression with `pg_get_expr`'s spelling of one, ignoring casts and literal quoting."""
    wanted_value, wanted_quoted = _normalised_default(wanted)
    current_value, current_quoted = _normalised_default(current)
    if not (wanted_quoted and current_quoted):
        try:
            return Decimal(wanted_value) == Decimal(current_value)
        except InvalidOperation:
            pass
    if wanted_quoted or current_quoted:
        return wanted_value == current_value
    return wanted_value.lower() == current_value.lower()


def _normalised_default(expression: str) -> tuple[str, bool]:
    """Return the expression without casts and outer parentheses, unquoted if one literal, and whether it was."""
    text = expression.strip()
    while True:
        previous = text
        cast = _TRAILING_CAST.fullmatch(text)
        if cast and balanced(cast.group(1)):
            text = cast.group(1).strip()
        if text.startswith("(") and text.endswith(")") and balanced(text[1:-1]):
            text = text[1:-1].strip()
        if text == previous:
            break
    literal = _QUOTED_LITERAL.fullmatch(text)
    if literal is None:
        return text, False
    value = literal.group(2).replace("''", "'")
    if literal.group(1) in ("E", "e"):
        value = value.replace("\\\\", "\\")
    return value, True



def retype_column_sql(schema: str, table: str, column: str, old_type: str, new_type: str) -> sql.Composed:
    """ALTER COLUMN ... TYPE with an explicit cast of the stored values; identity and default are left alone."""
    name = sql.Identifier(column)
    return sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {} USING {}").format(
        sql.Identifier(schema, table), name, sql.SQL(new_type), _using_cast(name, old_type, new_type)
    )


def _using_cast(name: sql.Identifier, old_type: str, new_type: str) -> sql.Composed:
    """PostgreSQL has no direct cast between boolean and smallint, numeric or bit: go through integer."""
    old_base, new_base = old_type.split("(", 1)[0], new_type.split("(", 1)[0]
    through_integer = (new_base == "boolean" and (old_base in _NUMBER_BASES or old_base == "bit")) or (
        old_base == "boolean" and new_base in _NUMBER_BASES - {"integer"}
    )
    template = "{}::integer::{}" if through_integer else "{}::{}"
    return sql.SQL(template).format(name, sql.SQL(new_type))


def _unique_constraint_name(table_name: str, key_name: str) -> str:
    """`<table>_<key>_key`: PostgreSQL constraint (index) names are unique per schema, MariaDB key names per table."""
    return table_scoped_name(table_name, key_name, "key")


def table_scoped_name(table_name: str, name: str, suffix: str) -> str:
    """`<table>_<name>_<suffix>`, the destination's name of a source's key or index named per table.

    A name longer than PostgreSQL's 63 bytes is cut and ends in a hash of the whole, so that two long
    names stay apart and the name read back from the catalog is the one computed here.
    """
    name = f"{table_name}_{name}_{suffix}"
    encoded = name.encode()
    if len(encoded) <= _MAX_IDENTIFIER_BYTES:
        return name
    digest = hashlib.sha1(encoded).hexdigest()[:8]
    head = encoded[: _MAX_IDENTIFIER_BYTES - len(digest) - 1].decode(errors="ignore")
    return f"{head}_{digest}"


def _destination_unique_keys(
    statements: list[Statement], table_name: str, columns: set[str], letter_casing: str, source_id: str
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Name the keys the way MariaDB does (an unnamed key after its first column, then _2, _3...), then map them."""
    keys: dict[str, tuple[str, ...]] = {}
    for statement in statements:
        taken = {name.lower() for name, _ in statement.unique_added if name is not None}
        for key_name, key_columns in statement.unique_added:
            if key_name is None:
                key_name = base = key_columns[0]
                suffix = 2
                while key_name.lower() in taken:
                    key_name, suffix = f"{base}_{suffix}", suffix + 1
                taken.add(key_name.lower())
            destination_columns = tuple(dest_identifier(column, letter_casing) for column in key_columns)
            unknown = [column for column in destination_columns if column not in columns]
            if unknown:
                logger.warning(
                    "Unique key %r of %s names unknown columns %s: not replicated", key_name, source_id, unknown
                )
                continue
            name = _unique_constraint_name(table_name, dest_identifier(key_name, letter_casing))
            keys.setdefault(name, destination_columns)
    return tuple(keys.items())


def _destination_column_renames(
    statements: list[Statement], table: TableDef, letter_casing: str
) -> tuple[tuple[str, str], ...]:
    """Keep the renames the new definition confirms: the new name is a column, the old one is not."""
    names = {column.name for column in table.columns}
    renames = []
    for statement in statements:
        for old, new in statement.column_renames:
            old, new = dest_identifier(old, letter_casing), dest_identifier(new, letter_casing)
            if old != new and new in names and old not in names:
                renames.append((old, new))
    return tuple(renames)


def _previous_table(
    table_change: dict[str, Any], statements: list[Statement], parts: tuple[str, ...], connector: str, position: Any
) -> QualifiedName | None:
    """The source (database or None, table) the table had before this statement renamed it, or None."""
    if table_change.get("previousId"):
        previous = _table_id_parts({"id": table_change["previousId"]}, connector=connector, position=position)
        return (previous[-2] if len(previous) >= 2 else None, previous[-1])
    return next(
        (
            (old_db, old_table)
            for statement in statements
            for old_db, old_table, new_db, new_table in statement.table_renames
            if names_table((new_db, new_table), parts)
        ),
        None,
    )


def _source_id(old: QualifiedName | None, parts: tuple[str, ...]) -> str | None:
    """A table named in the DDL text as a source id like `parts` (`db.table`), its database defaulting to theirs."""
    if old is None:
        return None
    database, table = old
    if len(parts) < 2:
        return table
    return source_table_of((database or parts[-2], table))


def _renamed_from(
    old: QualifiedName | None,
    table: TableDef,
    letter_casing: str,
    destination_schema: str | None,
) -> tuple[str, str] | None:
    """The destination (schema, name) the table had before this statement renamed it, or None."""
    if old is None:
        return None
    old_db, old_table = old
    if destination_schema:
        schema = _filled(destination_schema, old_db or table.schema, letter_casing)
    elif old_db is not None:
        schema = dest_identifier(old_db, letter_casing)
    else:
        schema = table.schema
    renamed_from = (schema, dest_identifier(old_table, letter_casing))
    return None if renamed_from == (table.schema, table.name) else renamed_from


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
        schema = _filled(destination_schema, parts[-2] if len(parts) >= 2 else "", letter_casing)
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


def _filled(destination_schema: str, database: str, letter_casing: str) -> str:
    """A `destination_schema` with its {database} (a connector of several databases) filled in, as
    `ConnectorConfig.destination_schema_for` does."""
    return destination_schema.replace(DATABASE_PLACEHOLDER, dest_identifier(database, letter_casing))


def _source_position(payload: dict[str, Any]) -> dict[str, Any] | None:
    source = payload.get("source") or {}
    position = {key: source[key] for key in _POSITION_KEYS if source.get(key) is not None}
    return position or None
