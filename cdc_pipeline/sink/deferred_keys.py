"""A loaded table's primary key, its constraints across rows (unique keys, exclusion constraints, foreign keys) and
its secondary indexes, held back while the bulk snapshot copies its rows, and while the chunks and the stream that
reconciles them disagree.

Each chunk of a load is read at its own moment, so until the stream has replayed every change up to the moment the
last chunk was read, the table holds rows of different moments: a unique value that moved from a row copied early
to a row copied late is there twice, and a constraint enforced then would fail every later chunk. The load records
these constraints and indexes here and drops them when it plans the table (`withhold`); they are made again
(`restore`) once the stream has passed the load's end (`cycle.ConnectorSession.reconcile_load`), when every row
shows the source as it was at one moment. The primary key holds whatever the moment (the chunks are cut by it and
never overlap), and the stream's upserts need it: it is withheld too (`withhold_primary_key`) and made as soon as
the table's last chunk is copied, before the load is finished and any change of the stream applied. So are the
source table's secondary (non-unique) indexes (`plan_source_indexes`): they hold for rows of any moments. Indexes
are cheaper to build once than to keep up row by row (pg_dump restores them after the data for the same reason),
and several are built at once (`key_builds`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Iterable, Sequence

import psycopg
from psycopg import sql

from cdc_pipeline.config import DestinationConfig
from cdc_pipeline.convert.ddl import DdlChange, unique_constraint_sql
from cdc_pipeline.sink.key_builds import CONSTRAINT, INDEX, PRIMARY_KEY, SOURCE_INDEX, Builds, Withheld
from cdc_pipeline.sources.source_index import SourceIndex

log = logging.getLogger(__name__)

# pg_constraint.contype: unique, exclusion and foreign key constraints hold across rows; a primary key is made before
# the stream (`withhold_primary_key`), and check and NOT NULL constraints hold within each row.
_ACROSS_ROWS = ("u", "x", "f")
AFTER_ROWS = (PRIMARY_KEY, SOURCE_INDEX)
"""The kinds made as soon as their table's rows are copied, before the load is finished."""


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


def withhold_primary_key(cur: psycopg.Cursor, schema: str, connector: str, dest_schema: str,
                         dest_table: str) -> str | None:
    """Records the table's primary key and drops it; returns its name. A table with none keeps nothing, and one
    whose primary key a foreign key of another table still references keeps it (a loaded table's foreign keys are
    withheld first). One recorded before (a load begun again) stays recorded."""
    target = sql.Identifier(dest_schema, dest_table)
    row = cur.execute(
        """SELECT con.conname, pg_get_constraintdef(con.oid) FROM pg_constraint con
           WHERE con.conrelid = to_regclass(%s) AND con.contype = 'p'
             AND NOT EXISTS (SELECT 1 FROM pg_constraint f WHERE f.confrelid = con.conrelid AND f.contype = 'f')""",
        (target.as_string(cur),)).fetchone()
    if row is None:
        return None
    name, definition = row
    _record(cur, schema, connector, dest_schema, dest_table, name, PRIMARY_KEY,
            sql.SQL("CONSTRAINT {} {}").format(sql.Identifier(name), sql.SQL(definition)).as_string(cur))
    cur.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(target, sql.Identifier(name)))
    log.info("%s: %s.%s's primary key %s is made once its rows are copied", connector, dest_schema, dest_table, name)
    return name


def plan_source_indexes(cur: psycopg.Cursor, schema: str, connector: str, dest_schema: str, dest_table: str,
                        indexes: Sequence[tuple[str, SourceIndex]], build_now: bool) -> list[str]:
    """Records the source table's secondary indexes (each one's destination name, and the index with its columns'
    destination names) to be made once the table's rows are copied (SOURCE_INDEX), or makes them now (`build_now`:
    a small table's, before its rows). One whose name the destination's schema already has (or a record of the
    connector's) is left alone; one on a column the destination table lacks is left out and logged. Returns the
    names recorded or made."""
    if not indexes:
        return []
    target = sql.Identifier(dest_schema, dest_table)
    columns = {row[0] for row in cur.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
        (target.as_string(cur),)).fetchall()}
    names = [name for name, _ in indexes]
    taken = {row[0] for row in cur.execute(sql.SQL(
        """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = %s AND c.relname = ANY(%s)
           UNION SELECT name FROM {} WHERE connector = %s AND dest_schema = %s AND name = ANY(%s)""").format(
        sql.Identifier(schema, "deferred_constraints")),
        (dest_schema, names, connector, dest_schema, names)).fetchall()}
    planned = []
    for name, index in indexes:
        lacking = [column.name for column in index.columns if column.name not in columns]
        if lacking:
            log.warning("%s: the source's index %s of %s is not built on %s.%s: it lacks the column %s", connector,
                        index.name, index.table, dest_schema, dest_table, ", ".join(lacking))
            continue
        if name in taken:
            continue
        statement = source_index_sql(name, dest_schema, dest_table, index)
        if build_now:
            cur.execute(statement)
        else:
            _record(cur, schema, connector, dest_schema, dest_table, name, SOURCE_INDEX, statement.as_string(cur))
        planned.append(name)
    if planned:
        log.info("%s: %s.%s gets the source's indexes %s %s", connector, dest_schema, dest_table, ", ".join(planned),
                 "before its rows" if build_now else "once its rows are copied")
    return planned


def source_index_sql(name: str, dest_schema: str, dest_table: str, index: SourceIndex) -> sql.Composed:
    """The CREATE INDEX statement of a source's secondary index named `name` on the destination table (the
    index's columns by their destination names)."""
    columns = [sql.SQL("{}{}{}").format(
        sql.Identifier(column.name), sql.SQL(" DESC" if column.descending else ""),
        sql.SQL("" if column.nulls_first is None else " NULLS FIRST" if column.nulls_first else " NULLS LAST"))
        for column in index.columns]
    return sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} USING {} ({})").format(
        sql.Identifier(name), sql.Identifier(dest_schema, dest_table), sql.Identifier(index.method),
        sql.SQL(", ").join(columns))


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


def waiting(conn: psycopg.Connection, schema: str, connector: str, kind: str | Sequence[str] | None = None,
            tables: Iterable[tuple[str, str]] | None = None) -> list[Withheld]:
    """The connector's constraints and indexes waiting to be made (of this `kind` or these kinds only, of these
    destination `tables` (schema, name) only)."""
    listed = None if tables is None else list(tables)
    kinds = None if kind is None else [kind] if isinstance(kind, str) else list(kind)
    rows = conn.execute(sql.SQL(
        """SELECT dest_schema, dest_table, name, kind, definition FROM {} WHERE connector = %(connector)s
             AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s))
             AND (%(names)s::text[] IS NULL
                  OR (dest_schema, dest_table) IN (SELECT * FROM unnest(%(schemas)s::text[], %(names)s::text[])))
           ORDER BY dest_schema, dest_table, kind, name""").format(sql.Identifier(schema, "deferred_constraints")),
        {"connector": connector, "kinds": kinds, "schemas": None if listed is None else [nsp for nsp, _ in listed],
         "names": None if listed is None else [name for _, name in listed]}).fetchall()
    return [Withheld(*row) for row in rows]


def restore(conn: psycopg.Connection, destination: DestinationConfig, connector: str, position: object = None,
            on_seconds: Callable[[float], None] | None = None) -> list[str]:
    """Makes every waiting constraint and index of the connector again, several at once (`key_builds.Builds`, each
    in its own transaction); returns their names. `on_seconds` hears how long they took.

    Fails naming each table and constraint the rows break, with the destination's reason (the source then holds
    rows that break it too, or the destination's rows differ from the source's); those stay recorded, the others
    are made."""
    withheld = waiting(conn, destination.control_schema, connector)
    if not withheld:
        return []
    builds = Builds(destination, connector, position)
    try:
        builds.submit(withheld)
        made = builds.wait()
    finally:
        builds.close()
        if on_seconds is not None:
            on_seconds(builds.seconds)
    log.info("%s: the stream has reconciled the bulk snapshot: made %s again in %.1f s (index phase, %d "
             "connections)", connector, ", ".join(made) or "nothing", builds.seconds,
             min(builds.connections, len(withheld)))
    return made
