"""A connector's cumulative numbers, as operators read them: counts by kind of change, batches, times, snapshot
progress and replication lag, from the `stats` and `snapshot_progress` tables (written with each batch); and
their reset.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from cdc_pipeline import control
from cdc_pipeline.config import ConnectorConfig

# What `cdc-pipeline stats` shows, in order, with the label of its text form.
FIELDS = (
    ("total_events", "total events"), ("batches", "batches"), ("average_batch_size", "average batch size"),
    ("ddls", "ddls"), ("dmls", "dmls"), ("creates", "creates"), ("updates", "updates"), ("deletes", "deletes"),
    ("truncates", "truncates"), ("transactions", "transactions"), ("bad_events", "bad events"),
    ("redelivered", "re-delivered (skipped)"), ("other_events", "other events"), ("zero_dates", "zero dates"),
    ("snapshot_tables", "snapshot tables"), ("snapshot_rows", "snapshot rows"),
    ("snapshot_began_at", "snapshot began"), ("snapshot_ended_at", "snapshot ended"),
    ("first_source_ts", "first source ts"), ("last_source_ts", "last source ts"),
    ("first_debezium_ts", "first Debezium ts"), ("last_debezium_ts", "last Debezium ts"),
    ("first_applied_at", "first applied"), ("last_applied_at", "last applied"),
    ("lag_seconds", "replication lag (s)"), ("reset_at", "counting since reset at"),
)


def read_stats(conn: psycopg.Connection, schema: str, connector: str | None = None) -> list[dict[str, Any]]:
    """Each connector's numbers (one dict per connector with a stats row), with the derived ones: dmls (snapshot
    rows, creates, updates, deletes), average batch size, snapshot tables and the replication lag (seconds from
    the source's commit of the last applied change to its apply)."""
    query = sql.SQL(
        """SELECT st.connector, st.events AS total_events, st.batches,
                  round(st.events::numeric / nullif(st.batches, 0), 1)::float8 AS average_batch_size,
                  st.ddls, st.snapshot_rows + st.inserts + st.updates + st.deletes AS dmls, st.inserts AS creates,
                  st.updates, st.deletes, st.truncates, st.transactions, st.bad_events, st.redelivered,
                  st.other_events, st.zero_dates,
                  (SELECT count(*) FROM {progress} p WHERE p.connector = st.connector AND p.source_table <> ''
                     AND p.snapshot_rows > 0) AS snapshot_tables,
                  st.snapshot_rows, st.snapshot_began_at, st.snapshot_ended_at, st.first_source_ts,
                  st.last_source_ts, st.first_debezium_ts, st.last_debezium_ts, st.first_applied_at,
                  st.last_applied_at,
                  round(extract(epoch FROM st.last_applied_at - st.last_source_ts)::numeric, 3)::float8 AS lag_seconds,
                  st.reset_at
           FROM {stats} st
           WHERE %(connector)s::text IS NULL OR st.connector = %(connector)s
           ORDER BY st.connector""").format(
        stats=sql.Identifier(schema, "stats"), progress=sql.Identifier(schema, "snapshot_progress"))
    with conn.cursor(row_factory=dict_row) as cur:
        return list(cur.execute(query, {"connector": connector}))


def read_table_stats(conn: psycopg.Connection, schema: str, connector: ConnectorConfig,
                     by_database: bool = False) -> list[dict[str, Any]]:
    """The connector's changes applied per source table (`table_stats`), or added up per source database (the
    tables' containers: a MariaDB/MySQL database, a PostgreSQL schema), with the last time each got one."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = list(cur.execute(sql.SQL(
            "SELECT source_table, {counters}, last_applied_at FROM {table} WHERE connector = %s "
            "ORDER BY source_table").format(
            counters=sql.SQL(", ").join(sql.Identifier(name) for name in control.TABLE_STAT_COUNTERS),
            table=sql.Identifier(schema, "table_stats")), (connector.name,)))
    if not by_database:
        return rows
    databases: dict[str, dict[str, Any]] = {}
    for row in rows:
        database = connector.split_table(row["source_table"])[0]
        total = databases.setdefault(database, {"database": database, "tables": 0, **dict.fromkeys(
            control.TABLE_STAT_COUNTERS, 0), "last_applied_at": row["last_applied_at"]})
        total["tables"] += 1
        for name in control.TABLE_STAT_COUNTERS:
            total[name] += row[name]
        total["last_applied_at"] = max(total["last_applied_at"], row["last_applied_at"])
    return list(databases.values())


def reset_stats(conn: psycopg.Connection, schema: str, connector: str) -> bool:
    """Zeroes the connector's counts and times (the snapshot's per-table counts too, not its bookkeeping of which
    tables a running snapshot replaced); returns whether it had any."""
    stats = sql.Identifier(schema, "stats")
    counters = ("batches", *control.BatchCounts.COUNTERS)
    times = ("first_source_ts", "last_source_ts", "first_debezium_ts", "last_debezium_ts", "first_applied_at",
             "last_applied_at", "snapshot_began_at", "snapshot_ended_at")
    with conn.transaction():
        updated = conn.execute(sql.SQL("UPDATE {} SET {}, {}, reset_at = now() WHERE connector = %s").format(
            stats, sql.SQL(", ").join(sql.SQL("{} = 0").format(sql.Identifier(name)) for name in counters),
            sql.SQL(", ").join(sql.SQL("{} = NULL").format(sql.Identifier(name)) for name in times)),
            (connector,)).rowcount
        conn.execute(sql.SQL("UPDATE {} SET events = 0, ddls = 0, snapshot_rows = 0, other_events = 0 "
                             "WHERE connector = %s").format(sql.Identifier(schema, "snapshot_progress")),
                     (connector,))
        conn.execute(sql.SQL("DELETE FROM {} WHERE connector = %s").format(sql.Identifier(schema, "table_stats")),
                     (connector,))
    return updated > 0
