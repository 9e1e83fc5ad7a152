"""The mapping rules in the control schema: added, deleted and listed (`objmap`); what each source column became,
recorded with the DDL (`objmap_columns`) and shown beside its rule (`objmap_attributes`); which connector writes
each destination table (`table_owners`: one writer per table); and `reload_mapping`, which renames and retypes what
a changed rule maps differently, keeping the data."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from cdc_pipeline.catalog import CatalogCache, destination_table
from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.convert.ddl import TableDef, rename_table_sql, retype_column_sql
from cdc_pipeline.errors import MappingRuleError, TableOwnerError
from cdc_pipeline.mapping.objmap import TABLE, ObjectMap, Rule, checked_kind, normalized_source
from cdc_pipeline.convert.typemap import canonical_pg_type

log = logging.getLogger(__name__)


def _rules_table(schema: str) -> sql.Identifier:
    return sql.Identifier(schema, "objmap")


def add_rule(conn: psycopg.Connection, schema: str, connector: ConnectorConfig, rule: Rule) -> None:
    """Adds the rule, or replaces the connector's rule of that kind for that source object. A table rule whose
    destination table another connector writes is refused (MappingRuleError naming both)."""
    with conn.transaction():
        if rule.kind == TABLE:
            dest_schema, dest_table = ObjectMap(connector, [rule]).table_name(rule.source)
            owner = table_owner(conn, schema, dest_schema, dest_table)
            if owner is not None and owner != connector.name:
                raise MappingRuleError(f"table rule refused: {dest_schema}.{dest_table} is written by connector "
                                       f"{owner!r}, and a destination table has one writer", connector=connector.name,
                                       table=rule.source)
        conn.execute(sql.SQL(
            """INSERT INTO {} (connector, kind, source_object, destination_object) VALUES (%s, %s, %s, %s)
               ON CONFLICT (connector, kind, lower(source_object)) DO UPDATE SET
                 source_object = EXCLUDED.source_object, destination_object = EXCLUDED.destination_object,
                 updated_at = now()""").format(_rules_table(schema)),
            (connector.name, rule.kind, rule.source, rule.destination))


def delete_rule(conn: psycopg.Connection, schema: str, connector: ConnectorConfig, kind: str, source: str) -> bool:
    """Deletes the connector's rule of that kind for that source object; False when there was none."""
    kind = checked_kind(connector, kind)
    source = normalized_source(connector, kind, source)
    with conn.transaction():
        deleted = conn.execute(sql.SQL(
            "DELETE FROM {} WHERE connector = %s AND kind = %s AND lower(source_object) = lower(%s)").format(
            _rules_table(schema)), (connector.name, kind, source)).rowcount
    return deleted > 0


def read_rules(conn: psycopg.Connection | psycopg.Cursor, schema: str, connector: str | None = None) -> list[Rule]:
    """The rules of a connector (all connectors' when None), by kind and source object."""
    rows = conn.execute(sql.SQL(
        """SELECT kind, source_object, destination_object FROM {} WHERE %(c)s::text IS NULL OR connector = %(c)s
           ORDER BY connector, kind, lower(source_object)""").format(_rules_table(schema)), {"c": connector}).fetchall()
    return [Rule(*row) for row in rows]


def list_rules(conn: psycopg.Connection, schema: str, connector: str | None = None) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return list(cur.execute(sql.SQL(
            """SELECT connector, kind, source_object, destination_object, updated_at FROM {}
               WHERE %(c)s::text IS NULL OR connector = %(c)s ORDER BY connector, kind, lower(source_object)""").format(
            _rules_table(schema)), {"c": connector}))


def read_attributes(conn: psycopg.Connection, schema: str, connector: str) -> list[dict[str, Any]]:
    """The attribute view's rows of a connector, by source table and column position."""
    with conn.cursor(row_factory=dict_row) as cur:
        return list(cur.execute(sql.SQL(
            """SELECT source_table, source_column, source_type, dest_schema, dest_table, dest_column, dest_type,
                      transform FROM {} WHERE connector = %s ORDER BY source_table, position""").format(
            sql.Identifier(schema, "objmap_attributes")), (connector,)))


def record_columns(cur: psycopg.Cursor, schema: str, connector: str, table: TableDef) -> None:
    """Records what each source column of a created or altered table became (in the batch's transaction), and the
    connector as the table's writer (`claim_table`)."""
    forget_columns(cur, schema, connector, table.source_id)
    claim_table(cur, schema, connector, table.schema, table.name, table.source_id)
    with cur.copy(sql.SQL(
            """COPY {} (connector, source_table, source_column, position, source_type, source_length, source_scale,
                        autoincrement, type_map_type, dest_schema, dest_table, dest_column, dest_type)
               FROM STDIN""").format(sql.Identifier(schema, "objmap_columns"))) as copy:
        for position, column in enumerate(table.columns, start=1):
            copy.write_row((connector, table.source_id, column.source_name, position, column.source_type,
                            column.source_length, column.source_scale, column.identity,
                            column.type_map_type or column.pg_type, table.schema, table.name, column.name,
                            column.pg_type))


def forget_columns(cur: psycopg.Cursor, schema: str, connector: str, source_table: str) -> None:
    """Forgets what the source table's columns became, and lets its destination table go (a dropped or renamed
    table: another connector may then create one of that name)."""
    cur.execute(sql.SQL("DELETE FROM {} WHERE connector = %s AND source_table = %s").format(
        sql.Identifier(schema, "objmap_columns")), (connector, source_table))
    release_table(cur, schema, connector, source_table)


def release_table(cur: psycopg.Cursor, schema: str, connector: str, source_table: str) -> None:
    """Lets the destination table of the connector's source table go: no connector writes it any more."""
    cur.execute(sql.SQL("DELETE FROM {} WHERE connector = %s AND source_table = %s").format(
        sql.Identifier(schema, "table_owners")), (connector, source_table))


def owned_source_tables(cur: psycopg.Cursor, schema: str, connector: str) -> list[str]:
    """The source tables whose destination tables the connector writes (has claimed), sorted."""
    cur.execute(sql.SQL("SELECT source_table FROM {} WHERE connector = %s ORDER BY source_table").format(
        sql.Identifier(schema, "table_owners")), (connector,))
    return [row[0] for row in cur.fetchall()]


def owned_tables(cur: psycopg.Cursor, schema: str, connector: str) -> list[tuple[str, str]]:
    """The destination tables (schema, name) the connector writes (has claimed)."""
    cur.execute(sql.SQL("SELECT dest_schema, dest_table FROM {} WHERE connector = %s").format(
        sql.Identifier(schema, "table_owners")), (connector,))
    return [(row[0], row[1]) for row in cur.fetchall()]


def table_owner(conn: psycopg.Connection | psycopg.Cursor, schema: str, dest_schema: str,
                dest_table: str) -> str | None:
    """The connector that writes the destination table, or None when none has claimed it."""
    row = conn.execute(sql.SQL("SELECT connector FROM {} WHERE dest_schema = %s AND dest_table = %s").format(
        sql.Identifier(schema, "table_owners")), (dest_schema, dest_table)).fetchone()
    return row[0] if row else None


def claim_table(cur: psycopg.Cursor, schema: str, connector: str, dest_schema: str, dest_table: str,
                source_table: str) -> None:
    """Records the connector as the one writer of the destination table, in the transaction of the write that needs
    it (a DDL, a load's emptying, a rename by the rules); does nothing when the connector holds it already. Raises
    TableOwnerError, naming both connectors and the table, when another connector writes it: the transaction, and
    the write, go no further. Two connectors claiming one table at once: the second waits for the first's commit,
    then fails."""
    claim_tables(cur, schema, connector, [(dest_schema, dest_table, source_table)])


def claim_tables(cur: psycopg.Cursor, schema: str, connector: str, tables: list[tuple[str, str, str]]) -> None:
    """`claim_table` for several (dest_schema, dest_table, source_table) at once, in two statements."""
    wanted = list(dict.fromkeys(tables))
    if not wanted:
        return
    columns = ([dest_schema for dest_schema, _, _ in wanted], [dest_table for _, dest_table, _ in wanted],
               [source_table for _, _, source_table in wanted])
    owners = sql.Identifier(schema, "table_owners")
    cur.execute(sql.SQL(
        """INSERT INTO {} (dest_schema, dest_table, connector, source_table)
           SELECT w.dest_schema, w.dest_table, %s, w.source_table
           FROM unnest(%s::text[], %s::text[], %s::text[]) AS w(dest_schema, dest_table, source_table)
           ON CONFLICT (dest_schema, dest_table) DO NOTHING""").format(owners), (connector, *columns))
    others = cur.execute(sql.SQL(
        """SELECT o.dest_schema, o.dest_table, o.connector, w.source_table
           FROM unnest(%s::text[], %s::text[], %s::text[]) AS w(dest_schema, dest_table, source_table)
           JOIN {} AS o ON o.dest_schema = w.dest_schema AND o.dest_table = w.dest_table
           WHERE o.connector <> %s""").format(owners), (*columns, connector)).fetchall()
    if others:
        dest_schema, dest_table, other, source_table = others[0]
        raise TableOwnerError(
            f"the destination table {dest_schema}.{dest_table} is written by connector {other!r}; connector "
            f"{connector!r} would write it too (from {source_table}), and a destination table has one writer: give "
            "one of them its own destination_schema, or a table rule to another table",
            connector=connector, table=source_table)


@dataclass
class _RecordedColumn:
    source_table: str
    source_column: str
    source_type: str
    source_length: int | None
    source_scale: int | None
    autoincrement: bool
    type_map_type: str
    dest_schema: str
    dest_table: str
    dest_column: str
    dest_type: str


def reload_mapping(conn: psycopg.Connection, schema: str, connector: ConnectorConfig) -> ObjectMap:
    """Re-reads the connector's rules and brings the destination in line with them, in one transaction: a table
    or column whose mapped name changed is renamed, a column whose mapped type changed is altered (its values
    cast). Does nothing when nothing changed. Returns the rules as the next fetch cycle applies them.
    """
    columns_table = sql.Identifier(schema, "objmap_columns")
    with conn.transaction(), conn.cursor() as cur:
        object_map = ObjectMap(connector, read_rules(cur, schema, connector.name))
        rows = cur.execute(sql.SQL(
            """SELECT source_table, source_column, source_type, source_length, source_scale, autoincrement,
                      type_map_type, dest_schema, dest_table, dest_column, dest_type
               FROM {} WHERE connector = %s ORDER BY source_table, position FOR UPDATE""").format(columns_table),
            (connector.name,)).fetchall()
        by_table: dict[str, list[_RecordedColumn]] = {}
        for row in rows:
            by_table.setdefault(row[0], []).append(_RecordedColumn(*row))
        catalog = CatalogCache()
        catalog.prefetch(cur, [(recorded[0].dest_schema, recorded[0].dest_table) for recorded in by_table.values()])
        for source_table, recorded in by_table.items():
            for column, (dest_schema, dest_table, dest_column, dest_type) in _follow_rules(
                    cur, schema, object_map, source_table, recorded, catalog).items():
                cur.execute(sql.SQL(
                    """UPDATE {} SET dest_schema = %s, dest_table = %s, dest_column = %s, dest_type = %s
                       WHERE connector = %s AND source_table = %s AND source_column = %s""").format(columns_table),
                    (dest_schema, dest_table, dest_column, dest_type, connector.name, source_table, column))
    return object_map


def _follow_rules(cur: psycopg.Cursor, control_schema: str, object_map: ObjectMap, source_table: str,
                  recorded: list[_RecordedColumn], catalog: CatalogCache) -> dict[str, tuple[str, str, str, str]]:
    """Renames and retypes one table as the rules now say (the connector takes the new name as its writer);
    returns the columns whose record changed. `catalog`: the tables read once for every table (forgotten here
    where this changes them)."""
    connector = object_map.connector.name
    current = (recorded[0].dest_schema, recorded[0].dest_table)
    schema, table = object_map.table_name(source_table)
    existing = catalog.table(cur, *current)
    catalog.forget(*current)
    if (schema, table) != current:
        release_table(cur, control_schema, connector, source_table)
        claim_table(cur, control_schema, connector, schema, table, source_table)
    if (schema, table) != current and existing is not None:
        if destination_table(cur, schema, table) is not None:
            raise MappingRuleError(f"cannot rename {current[0]}.{current[1]} to {schema}.{table}: that table exists",
                                   connector=connector, table=source_table)
        for statement in rename_table_sql(current[0], current[1], table, new_schema=schema):
            cur.execute(statement)
        log.info("%s: renamed %s.%s to %s.%s (mapping rules of %s)", connector, *current, schema, table, source_table)
    wanted = {column.source_column: object_map.column_name(source_table, column.source_column) for column in recorded}
    names = list(wanted.values())
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise MappingRuleError(f"mapping rules give several columns the name(s) {', '.join(duplicates)}",
                               connector=connector, table=source_table)
    columns = dict(existing.columns) if existing is not None else {}
    changed: dict[str, tuple[str, str, str, str]] = {}
    for column in recorded:
        name = wanted[column.source_column]
        pg_type = object_map.column_type(source_table, column.source_column, column.source_type, column.autoincrement,
                                         column.source_length, column.source_scale) or column.type_map_type
        if name != column.dest_column and column.dest_column in columns:
            if name in columns:
                raise MappingRuleError(f"cannot rename column {column.dest_column!r} of {schema}.{table} to {name!r}: "
                                       f"that column exists", connector=connector, table=source_table)
            cur.execute(sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}").format(
                sql.Identifier(schema, table), sql.Identifier(column.dest_column), sql.Identifier(name)))
            columns[name] = columns.pop(column.dest_column)
            log.info("%s: renamed column %s of %s.%s to %s", connector, column.dest_column, schema, table, name)
        if canonical_pg_type(pg_type) != canonical_pg_type(column.dest_type) and name in columns:
            cur.execute(retype_column_sql(schema, table, name, canonical_pg_type(columns[name]), pg_type))
            log.info("%s: column %s of %s.%s is now %s", connector, name, schema, table, pg_type)
        if (schema, table, name, pg_type) != (column.dest_schema, column.dest_table, column.dest_column,
                                              column.dest_type):
            changed[column.source_column] = (schema, table, name, pg_type)
    return changed
