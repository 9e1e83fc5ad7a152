"""What the pipeline reads from a SQL Server source without a JVM, through pymssql: the order of Debezium's streaming
offsets (re-delivered events), the change check, the preflight check and row counts.

Offsets. Debezium's SQL Server connector (3.5, `SqlServerOffsetContext.getOffset`) writes `commit_lsn` (the
transaction's commit LSN), `change_lsn` (the row's `__$seqval`) as `Lsn.toString` text ('0000002c:00000a38:0003',
lower-case hex; 'NULL' or null when unknown) and `event_serial_no` (the records emitted at that same position so
far: an update counts 2). On restart it skips what its stored offset covers by the same order
(`SqlServerStreamingChangeEventSource`: `TxLogPosition.compareTo`, then `event_serial_no`), and stops skipping within
a transaction once its rows' `__$seqval` go down (DBZ-2329, a multi-row update of a key): within a transaction, the
offsets' order is not always the stream's.

The change check. `sys.fn_cdc_get_max_lsn()` is the highest commit LSN in any change table of the database: when it is
not past the applied `commit_lsn`, nothing is new. When it is, each capture instance of a captured table is asked for
one row past the applied position (its change table's clustered index starts with `__$start_lsn`): only those are
the connector's changes (writes to other captured tables move the max LSN too). A capture instance whose oldest LSN
(`sys.fn_cdc_get_min_lsn`) is past the applied position, though it existed then, was cleaned up past it: the changes
between are gone (Debezium would read on from the change table's start, silently).
"""

from __future__ import annotations

import datetime
from typing import Any, Callable

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sources.change_check import (ChangeCheck, RangeCounts, count_key_ranges, driver_words,
                                                 inside_snapshot, read_source)
from cdc_pipeline.sources.finding import Finding, source_error, source_warning
from cdc_pipeline.sources.lost_position import LostPosition

CONNECT_TIMEOUT_SECONDS = 10
# Within a transaction, records do not always come in the order of their offsets (DBZ-2329).
ORDERED_WITHIN_TRANSACTION = False

MAX_LSN = "SELECT sys.fn_cdc_get_max_lsn()"
CAPTURE_INSTANCES = (
    "SELECT s.name, t.name, ct.capture_instance, sys.fn_cdc_get_min_lsn(ct.capture_instance), ct.create_date "
    "FROM cdc.change_tables ct JOIN sys.tables t ON t.object_id = ct.source_object_id "
    "JOIN sys.schemas s ON s.schema_id = t.schema_id ORDER BY s.name, t.name, ct.capture_instance")
LSN_TIME = "SELECT sys.fn_cdc_map_lsn_to_time(%s)"
USER_TABLES = ("SELECT s.name, t.name, t.is_tracked_by_cdc FROM sys.tables t JOIN sys.schemas s "
               "ON s.schema_id = t.schema_id WHERE t.is_ms_shipped = 0 ORDER BY s.name, t.name")
DATABASE_STATE = ("SELECT DB_NAME(), USER_NAME(), is_cdc_enabled, snapshot_isolation_state FROM sys.databases "
                  "WHERE name = DB_NAME()")
AGENT_STATUS = "SELECT status_desc FROM sys.dm_server_services WHERE servicename LIKE N'SQL Server Agent%'"
USER_ACCESS = "SELECT IS_ROLEMEMBER('db_owner'), HAS_PERMS_BY_NAME('cdc', 'SCHEMA', 'SELECT')"
PRIMARY_KEYS = ("SELECT s.name, t.name, c.name, ty.name FROM sys.indexes i JOIN sys.index_columns ic "
                "ON ic.object_id = i.object_id AND ic.index_id = i.index_id JOIN sys.columns c "
                "ON c.object_id = ic.object_id AND c.column_id = ic.column_id JOIN sys.types ty "
                "ON ty.user_type_id = c.user_type_id JOIN sys.tables t ON t.object_id = i.object_id "
                "JOIN sys.schemas s ON s.schema_id = t.schema_id WHERE i.is_primary_key = 1 "
                "ORDER BY s.name, t.name, ic.key_ordinal")
_INTEGER_TYPES = frozenset({"tinyint", "smallint", "int", "bigint"})
GATING_ROLES = ("SELECT DISTINCT role_name FROM cdc.change_tables WHERE role_name IS NOT NULL "
                "AND IS_ROLEMEMBER(role_name) = 0")


def quote(identifier: str) -> str:
    """A SQL Server identifier in brackets, embedded closing brackets doubled."""
    return "[" + identifier.replace("]", "]]") + "]"


def qualified(schema: str, table: str) -> str:
    return quote(schema) + "." + quote(table)


def _unicode_literal(text: str) -> str:
    return "N'" + text.replace("'", "''") + "'"


def lsn_bytes(text: Any) -> bytes | None:
    """An LSN as Debezium writes it ('0000002c:00000a38:0003') as its 10 bytes, or None when it is unknown ('NULL')."""
    if text is None or text == "NULL":
        return None
    try:
        return bytes.fromhex(str(text).replace(":", ""))
    except ValueError:
        return None


def lsn_text(lsn: bytes) -> str:
    """10 LSN bytes as Debezium's `Lsn.toString` writes them."""
    digits = lsn.hex()
    return f"{digits[:8]}:{digits[8:16]}:{digits[16:]}"


def stream_order(offset: dict[str, Any] | None) -> tuple[bytes, str, tuple[bytes, int]] | None:
    """Where a streamed record's offset lies: (its transaction's order, its transaction, its place in it), as
    Debezium compares positions on restart (`TxLogPosition`: commit LSN, then change LSN; then `event_serial_no`).
    None for a snapshot's offset, or one that is not SQL Server's."""
    if not offset or offset.get("snapshot") not in (None, False, "false") or "commit_lsn" not in offset:
        return None
    commit = lsn_bytes(offset["commit_lsn"])
    if commit is None:
        return None
    change = lsn_bytes(offset.get("change_lsn")) or b""  # Debezium's NULL LSN sorts first
    return commit, commit.hex(), (change, int(offset.get("event_serial_no") or 0))


def connect(connector: ConnectorConfig) -> Any:
    """A pymssql connection to the connector's source database, in autocommit, for the checks' reads (never rows).
    A statement that runs longer than `source_statement_timeout_seconds` fails."""
    import pymssql

    try:
        return pymssql.connect(server=connector.hostname, port=str(connector.port), user=connector.user,
                               password=connector.password.reveal(), database=connector.database,
                               login_timeout=CONNECT_TIMEOUT_SECONDS,
                               timeout=max(1, round(connector.source_statement_timeout_seconds)),
                               appname=f"cdc-pipeline {connector.name}", autocommit=True)
    except pymssql.Error as exc:
        raise CdcError(f"cannot connect to the source {connector.hostname}:{connector.port}: "
                       f"{driver_words(exc, connector)}", connector=connector.name) from None


def _read(connector: ConnectorConfig, reads: Callable[[Any], Any]) -> Any:
    import pymssql

    return read_source(connector, connect, pymssql.Error, reads)


def check_position(offset: dict[str, Any] | None) -> tuple[bytes, bytes] | None:
    """Up to where an offset says every change was processed, for the change check: (commit LSN, change LSN in
    that transaction); a position without a change (a finished snapshot's, a poll that found none) covers its whole
    commit LSN. None inside a snapshot, or for an offset that is not SQL Server's."""
    if not offset or inside_snapshot(offset):
        return None
    commit = lsn_bytes(offset.get("commit_lsn"))
    if commit is None:
        return None
    return commit, lsn_bytes(offset.get("change_lsn")) or b"\xff" * len(commit)


def check_changes(connector: ConnectorConfig, checked: Any, applied: dict[str, Any],
                  captured: Callable[[str], bool]) -> ChangeCheck:
    """The change check: whether a change table of a captured table holds a row after the applied position (its
    `commit_lsn`, and within that transaction its `change_lsn`), or whether that position fell out of the change
    tables' retention."""
    position = check_position(applied)
    if position is None:
        return ChangeCheck(True, "no streamed position is applied yet")
    commit, change = position
    return _read(connector, lambda cur: _check(cur, connector, commit, change, captured))


def _check(cur: Any, connector: ConnectorConfig, commit: bytes, change: bytes,
           captured: Callable[[str], bool]) -> ChangeCheck:
    cur.execute(MAX_LSN)
    max_lsn = cur.fetchone()[0]
    if max_lsn is None:
        return ChangeCheck(False, f"CDC is not enabled on database {connector.database}, or no table is captured "
                                  "(sys.fn_cdc_get_max_lsn() is NULL): `cdc-pipeline check` names the fix",
                           known=False)
    applied = lsn_text(commit)
    instances = _capture_instances(cur, captured)
    lost = _retention_loss(cur, connector, commit, instances)
    if lost:
        return ChangeCheck(False, lost, known=False)
    if bytes(max_lsn) <= commit:
        return ChangeCheck(False, f"no change since the applied position {applied} (max LSN {lsn_text(max_lsn)})",
                           reached_end=True)
    for schema, table, instance, _, _ in instances:
        cur.execute(f"SELECT TOP 1 1 FROM cdc.{quote(instance + '_CT')} WHERE __$start_lsn > %s "
                    "OR (__$start_lsn = %s AND __$seqval > %s)", (commit, commit, change))
        if cur.fetchone() is not None:
            return ChangeCheck(True, f"capture instance {instance} of {schema}.{table} holds changes after "
                                     f"{applied}")
    return ChangeCheck(False, f"no change of the connector's tables since {applied} (max LSN {lsn_text(max_lsn)}: "
                              "changes of other tables)", reached_end=True)


def lost_position(connector: ConnectorConfig, offset: dict[str, Any],
                  captured: Callable[[str], bool]) -> LostPosition | None:
    """What the change tables no longer hold of `offset`, or None: the cleanup job removed changes of a captured
    table after it. Debezium's connector would read on from the change table's oldest row and skip them without a
    word, so a run refuses to start instead."""
    position = check_position(offset)
    if position is None:
        return None
    commit = position[0]
    lost = _read(connector, lambda cur: _cleaned_up(cur, commit, _capture_instances(cur, captured)))
    if not lost:
        return None
    return LostPosition(f"LSN {lsn_text(commit)}", f"it fell out of the change tables' retention: the cleanup job "
                                                   f"removed the changes of {', '.join(lost)} after it (their oldest "
                                                   "LSN is later)")


def _capture_instances(cur: Any, captured: Callable[[str], bool]) -> list[tuple]:
    cur.execute(CAPTURE_INSTANCES)
    return [row for row in cur.fetchall() if captured(f"{row[0]}.{row[1]}")]


def _retention_loss(cur: Any, connector: ConnectorConfig, commit: bytes, instances: list[tuple]) -> str | None:
    lost = _cleaned_up(cur, commit, instances)
    if not lost:
        return None
    return (f"the applied position {lsn_text(commit)} fell out of the change tables' retention: the cleanup job "
            f"removed the changes of {', '.join(lost)} after it (their oldest LSN is later). Those changes are gone: "
            f"take a new snapshot (`cdc-pipeline restart {connector.name} always`)")


def _cleaned_up(cur: Any, commit: bytes, instances: list[tuple]) -> list[str]:
    """The capture instances whose oldest LSN is past `commit` though they existed at it (created before its
    commit time): the cleanup job removed changes after it. The commit's time is unknown once
    `cdc.lsn_time_mapping` was cleaned past it too: then every instance whose oldest LSN is later counts."""
    later = [row for row in instances if row[3] is not None and bytes(row[3]) > commit]
    if not later:
        return []
    cur.execute(LSN_TIME, (commit,))
    row = cur.fetchone()
    committed_at: datetime.datetime | None = row[0] if row else None
    return [instance for _, _, instance, _, created in later
            if committed_at is None or created is None or created <= committed_at]


def preflight(connector: ConnectorConfig) -> list[Finding]:
    """What the source lacks for Debezium's SQL Server connector: CDC on the database and on each captured table,
    SQL Server Agent running (its capture job fills the change tables), the capture user in db_owner or with
    SELECT on the `cdc` schema and in each capture instance's gating role, SELECT on the captured tables, and
    snapshot isolation allowed when the connector's `snapshot.isolation.mode` is `snapshot`. Each finding carries
    the statement that fixes it. Raises CdcError when the source cannot be reached."""
    return _read(connector, lambda cur: _preflight(cur, connector))


def _preflight(cur: Any, connector: ConnectorConfig) -> list[Finding]:
    cur.execute(DATABASE_STATE)
    database, user, cdc_enabled, snapshot_isolation = cur.fetchone()
    use = f"USE {quote(database)}; "
    if not cdc_enabled:
        # The rest needs the cdc schema, which enabling CDC creates.
        return [source_error("is_cdc_enabled", f"CDC is not enabled on database {database}",
                             f"{use}EXEC sys.sp_cdc_enable_db; (as a member of sysadmin)")]
    findings = _table_findings(cur, connector, use)
    findings += _agent_findings(cur)
    findings += _access_findings(cur, database, user, use)
    if connector.debezium.get("snapshot.isolation.mode", "").lower() == "snapshot" and snapshot_isolation != 1:
        findings.append(source_error(
            "snapshot_isolation_state", f"snapshot isolation is not allowed on database {database}, and the "
                                        "connector's snapshot.isolation.mode is snapshot",
            f"ALTER DATABASE {quote(database)} SET ALLOW_SNAPSHOT_ISOLATION ON;"))
    return findings


def _table_findings(cur: Any, connector: ConnectorConfig, use: str) -> list[Finding]:
    cur.execute(USER_TABLES)
    tables = {f"{schema}.{table}": bool(tracked) for schema, table, tracked in cur.fetchall()}
    findings = []
    missing = [table for table in connector.tables if table not in tables]
    if missing:
        findings.append(source_error("tables", f"the connector's tables {', '.join(missing)} do not exist in "
                                               f"database {connector.database}",
                                     "correct the connector's `tables` (schema.table, as the source spells them)"))
    if not connector.tables and not any(tables.values()):
        findings.append(source_error("is_tracked_by_cdc", f"no table of database {connector.database} has CDC "
                                                          "enabled: the connector captures nothing",
                                     f"{use}EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', "
                                     "@source_name = N'<table>', @role_name = NULL; (for each table to capture)"))
    untracked = [table for table in connector.tables if table in tables and not tables[table]]
    if untracked:
        statements = " ".join(
            f"EXEC sys.sp_cdc_enable_table @source_schema = {_unicode_literal(schema)}, "
            f"@source_name = {_unicode_literal(name)}, @role_name = NULL;"
            for schema, name in (connector.split_table(table) for table in untracked))
        findings.append(source_error("is_tracked_by_cdc", f"CDC is not enabled on {', '.join(untracked)}",
                                     use + statements))
    return findings


def _agent_findings(cur: Any) -> list[Finding]:
    import pymssql

    try:
        cur.execute(AGENT_STATUS)
        row = cur.fetchone()
    except pymssql.Error:
        return [source_warning("sql_server_agent", "whether SQL Server Agent runs cannot be told: the capture user "
                                                   "may not read sys.dm_server_services",
                               "check that SQL Server Agent runs, or GRANT VIEW SERVER STATE to the capture user's "
                               "login for this check")]
    if row is None or row[0] != "Running":
        status = "is not listed" if row is None else f"is {row[0]}"
        return [source_error("sql_server_agent", f"SQL Server Agent {status}: its capture job fills the change "
                                                 "tables, and nothing is captured while it is stopped",
                             "start SQL Server Agent (Windows: `net start SQLSERVERAGENT`; Linux: "
                             "`mssql-conf set sqlagent.enabled true` and restart mssql-server)")]
    return []


def _access_findings(cur: Any, database: str, user: str, use: str) -> list[Finding]:
    cur.execute(USER_ACCESS)
    owner, cdc_select = cur.fetchone()
    if owner == 1:
        return []
    if cdc_select != 1:
        # cdc.change_tables, which names the gating roles, is in that schema too.
        return [source_error("privileges", f"the capture user {user} is neither in db_owner nor has SELECT on schema "
                                           "cdc, where the change tables are",
                             f"{use}GRANT SELECT ON SCHEMA::cdc TO {quote(user)};")]
    findings = []
    cur.execute(GATING_ROLES)
    roles = [row[0] for row in cur.fetchall()]
    if roles:
        findings.append(source_error("privileges", f"the capture user {user} is not in the gating roles "
                                                   f"{', '.join(roles)} of the capture instances",
                                     use + " ".join(f"ALTER ROLE {quote(role)} ADD MEMBER {quote(user)};"
                                                    for role in roles)))
    return findings


def row_counts(connector: ConnectorConfig, captured: Callable[[str], bool]) -> dict[str, int]:
    """The rows of each table of the source database that `captured` accepts (`schema.table`: rows)."""
    def count(cur: Any) -> dict[str, int]:
        cur.execute(USER_TABLES)
        tables = [(schema, table) for schema, table, _ in cur.fetchall() if captured(f"{schema}.{table}")]
        counts = {}
        for schema, table in tables:
            # pymssql has no identifier composition: the names are bracketed by quote.
            cur.execute("SELECT COUNT_BIG(*) FROM " + qualified(schema, table))
            counts[f"{schema}.{table}"] = int(cur.fetchone()[0])
        return counts

    return _read(connector, count)


def key_range_counts(connector: ConnectorConfig, captured: Callable[[str], bool],
                     chunk_rows: int) -> dict[str, RangeCounts]:
    """For `verify`: the rows of each captured table per range of its key (a primary key of one integer column;
    other tables as one range), about `chunk_rows` rows a range (`schema.table`: counts)."""
    def count(cur: Any) -> dict[str, RangeCounts]:
        cur.execute(USER_TABLES)
        tables = [(schema, table) for schema, table, _ in cur.fetchall() if captured(f"{schema}.{table}")]
        cur.execute(PRIMARY_KEYS)
        keys: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for schema, table, column, type_name in cur.fetchall():
            keys.setdefault((schema, table), []).append((column, type_name))
        counts = {}
        for schema, table in tables:
            columns = keys.get((schema, table), [])
            key = columns[0][0] if len(columns) == 1 and columns[0][1] in _INTEGER_TYPES else None
            counts[f"{schema}.{table}"] = count_key_ranges(cur, key, chunk_rows, _range_statements(schema, table, key))
        return counts

    return _read(connector, count)


def _range_statements(schema: str, table: str, key: str | None) -> Callable[[int, int], tuple[str, str]]:
    source = qualified(schema, table)
    if key is None:
        return lambda base, width: (f"SELECT NULL, NULL, COUNT_BIG(*) FROM {source}", "")
    value = f"CAST({quote(key)} AS bigint)"
    return lambda base, width: (
        f"SELECT MIN({value}), MAX({value}), COUNT_BIG(*) FROM {source}",
        f"SELECT b, COUNT_BIG(*) FROM (SELECT ({value} - {int(base)}) / {int(width)} AS b FROM {source}) AS x "
        "GROUP BY b")
