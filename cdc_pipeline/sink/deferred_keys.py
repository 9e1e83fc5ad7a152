"""A loaded table's constraints across rows (unique keys, exclusion constraints, foreign keys) and its secondary
indexes, held back while the bulk snapshot's chunks and the stream that reconciles them disagree.

Each chunk of a load is read at its own moment, so until the stream has replayed every change up to the moment the
last chunk was read, the table holds rows of different moments: a unique value that moved from a row copied early
to a row copied late is there twice, and a constraint enforced then would fail every later chunk. The load records
these constraints and indexes here and drops them when it plans the table (`withhold`); they are made again
(`restore`) once the stream has passed the load's end (`cycle.ConnectorSession.reconcile_load`), when every row
shows the source as it was at one moment. Indexes are also cheaper to build once than to keep up row by row
(pg_dump restores them after the data for the same reason).
"""

from __future__ import annotations

import dataclasses
import logging

import psycopg
from psycopg import sql

from cdc_pipeline.convert.ddl import DdlChange, unique_constraint_sql
from cdc_pipeline.errors import CdcError

log = logging.getLogger(__name__)

CONSTRAINT = "constraint"
INDEX = "index"
# pg_constraint.contype: unique, exclusion and foreign key constraints hold across rows; a primary key stays (the
# chunks and the stream meet on it as upserts), and check and NOT NULL constraints hold within each row.
_ACROSS_ROWS = ("u", "x", "f")


def withhold(cur: psycopg.Cursor, schema: str, connector: str, dest_schema: str, dest_table: str) -> list[str]:
    """Records the table's constraints across rows and its indexes other than the primary key's, then drops them;
    returns their names. Ones recorded before (a load begun again) stay recorded."""
    target = sql.Identifier(dest_schema, dest_table)
    cur.execute(
        """SELECT con.conname, pg_get_constraintdef(con.oid) FROM pg_constraint con
           WHERE con.conrelid = to_regclass(%s) AND con.contype = ANY(%s) ORDER BY con.conname""",
        (target.as_string(cur), list(_ACROSS_ROWS)))
    constraints = cur.fetchall()
    cur.execute(
        """SELECT i.relname, pg_get_indexdef(x.indexrelid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
           WHERE x.indrelid = to_regclass(%s) AND NOT x.indisprimary
             AND NOT EXISTS (SELECT 1 FROM pg_constraint con WHERE con.conindid = x.indexrelid
                             AND con.conrelid = x.indrelid)
           ORDER BY i.relname""", (target.as_string(cur),))
    indexes = cur.fetchall()
    for name, definition in constraints:
        _record(cur, schema, connector, dest_schema, dest_table, name, CONSTRAINT,
                sql.SQL("CONSTRAINT {} {}").format(sql.Identifier(name), sql.SQL(definition)).as_string(cur))
        cur.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(target, sql.Identifier(name)))
    for name, definition in indexes:
        _record(cur, schema, connector, dest_schema, dest_table, name, INDEX, definition)
        cur.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(dest_schema, name)))
    names = [name for name, _ in (*constraints, *indexes)]
    if names:
        log.info("%s: %s.%s's %s wait for the bulk snapshot to be reconciled by the stream", connector, dest_schema,
                 dest_table, ", ".join(names))
    return names


def _record(cur: psycopg.Cursor, schema: str, connector: str, dest_schema: str, dest_table: str, name: str,
            kind: str, definition: str) -> None:
    # The definition is the destination's own rendering of it (pg_get_constraintdef, pg_get_indexdef), run again
    # as it is; no source name is formatted into it here.
    cur.execute(sql.SQL(
        """INSERT INTO {} (connector, dest_schema, dest_table, name, kind, definition) VALUES (%s, %s, %s, %s, %s, %s)
           ON CONFLICT (connector, dest_schema, dest_table, name) DO NOTHING""").format(
        sql.Identifier(schema, "deferred_constraints")), (connector, dest_schema, dest_table, name, kind, definition))


def held(cur: psycopg.Cursor, schema: str, connector: str, dest_schema: str, dest_table: str) -> set[str]:
    """The names of the table's constraints and indexes waiting to be made again."""
    cur.execute(sql.SQL("SELECT name FROM {} WHERE connector = %s AND dest_schema = %s AND dest_table = %s").format(
        sql.Identifier(schema, "deferred_constraints")), (connector, dest_schema, dest_table))
    return {row[0] for row in cur.fetchall()}


def follow_ddl(cur: psycopg.Cursor, schema: str, connector: str, change: DdlChange) -> DdlChange:
    """A schema change the stream applies to a table whose constraints wait: the unique keys it adds wait too, the
    ones it drops are forgotten, a dropped table forgets its own and a renamed one keeps them. Returns the change
    to apply (without the keys that wait)."""
    table = sql.Identifier(schema, "deferred_constraints")
    if change.kind == "drop":
        cur.execute(sql.SQL("DELETE FROM {} WHERE connector = %s AND dest_schema = %s AND dest_table = %s").format(
            table), (connector, change.schema, change.name))
        return change
    if change.renamed_from is not None:
        cur.execute(sql.SQL("UPDATE {} SET dest_schema = %s, dest_table = %s WHERE connector = %s AND dest_schema = %s "
                            "AND dest_table = %s").format(table),
                    (change.schema, change.name, connector, *change.renamed_from))
    waiting = held(cur, schema, connector, change.schema, change.name)
    if change.kind != "alter" or change.table is None or not waiting:
        return change
    for name in change.unique_dropped:
        if name in waiting:
            cur.execute(sql.SQL("DELETE FROM {} WHERE connector = %s AND dest_schema = %s AND dest_table = %s "
                                "AND name = %s").format(table), (connector, change.schema, change.name, name))
    for name, columns in change.table.unique_keys:
        _record(cur, schema, connector, change.schema, change.name, name, CONSTRAINT,
                unique_constraint_sql(name, columns).as_string(cur))
    return dataclasses.replace(change, table=dataclasses.replace(change.table, unique_keys=()), unique_added=())


def restore(conn: psycopg.Connection, schema: str, connector: str, position: object = None) -> list[str]:
    """Makes every waiting constraint and index of the connector again, in one transaction; returns their names.

    Fails naming the table, the constraint and the destination's reason when the rows break one (the source then
    holds rows that break it too, or the destination's rows differ from the source's)."""
    table = sql.Identifier(schema, "deferred_constraints")
    made = []
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT dest_schema, dest_table, name, kind, definition FROM {} WHERE connector = %s "
                            "ORDER BY dest_schema, dest_table, kind, name FOR UPDATE").format(table), (connector,))
        for dest_schema, dest_table, name, kind, definition in cur.fetchall():
            target = sql.Identifier(dest_schema, dest_table)
            exists = cur.execute("SELECT to_regclass(%s) IS NOT NULL", (target.as_string(cur),)).fetchone()[0]
            if exists:
                statement = (sql.SQL(definition) if kind == INDEX
                             else sql.SQL("ALTER TABLE {} ADD {}").format(target, sql.SQL(definition)))
                try:
                    with conn.transaction():
                        cur.execute(statement)
                except (psycopg.errors.DuplicateObject, psycopg.errors.DuplicateTable):
                    pass  # made already (by hand, or by a schema change of the stream)
                except psycopg.Error as exc:
                    raise CdcError(f"cannot make {kind} {name} of {dest_schema}.{dest_table} again after the bulk "
                                   f"snapshot: {str(exc).strip()}", connector=connector,
                                   table=f"{dest_schema}.{dest_table}", position=position) from exc
                made.append(f"{dest_schema}.{dest_table}.{name}")
        cur.execute(sql.SQL("DELETE FROM {} WHERE connector = %s").format(table), (connector,))
    if made:
        log.info("%s: the stream has reconciled the bulk snapshot: made %s again", connector, ", ".join(made))
    return made
