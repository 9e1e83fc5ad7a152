"""The checks that read a SQL Server source without a JVM, through pymssql: the change check, the preflight check,
row counts and verify's key-range counts.

The change check. `sys.fn_cdc_get_max_lsn()` is the highest commit LSN in any change table of the database: when it is
not past the applied `commit_lsn`, nothing is new. When it is, each capture instance of a captured table is asked for
one row past the applied position (its change table's clustered index starts with `__$start_lsn`): only those are
the connector's changes (writes to other captured tables move the max LSN too). A position the change tables'
cleanup passed (`positions.cleaned_up`) is said, and launches nothing.
"""

from __future__ import annotations

from typing import Any, Callable

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.sources.change_check import ChangeCheck, RangeCounts
from cdc_pipeline.sources.finding import Finding, source_error, source_warning
from cdc_pipeline.sources.sqlserver.connector import qualified, quote, read_server
from cdc_pipeline.sources.sqlserver.positions import capture_instances, check_position, cleaned_up, lsn_text
from cdc_pipeline.sources.table_counts import captured_tables, count_rows, count_rows_by_key_range

MAX_LSN = "SELECT sys.fn_cdc_get_max_lsn()"
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


def _unicode_literal(text: str) -> str:
    return "N'" + text.replace("'", "''") + "'"


def check_changes(connector: ConnectorConfig, checked: Any, applied: dict[str, Any],
                  captured: Callable[[str], bool]) -> ChangeCheck:
    """The change check: whether a change table of a captured table holds a row after the applied position (its
    `commit_lsn`, and within that transaction its `change_lsn`), or whether that position fell out of the change
    tables' retention."""
    position = check_position(applied)
    if position is None:
        return ChangeCheck(True, "no streamed position is applied yet")
    commit, change = position
    return read_server(connector, lambda cur: _check(cur, connector, commit, change, captured))


def _check(cur: Any, connector: ConnectorConfig, commit: bytes, change: bytes,
           captured: Callable[[str], bool]) -> ChangeCheck:
    cur.execute(MAX_LSN)
    max_lsn = cur.fetchone()[0]
    if max_lsn is None:
        return ChangeCheck(False, f"CDC is not enabled on database {connector.database}, or no table is captured "
                                  "(sys.fn_cdc_get_max_lsn() is NULL): `cdc-pipeline check` names the fix",
                           known=False)
    applied = lsn_text(commit)
    instances = capture_instances(cur, captured)
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


def _retention_loss(cur: Any, connector: ConnectorConfig, commit: bytes, instances: list[tuple]) -> str | None:
    lost = cleaned_up(cur, commit, instances)
    if not lost:
        return None
    return (f"the applied position {lsn_text(commit)} fell out of the change tables' retention: the cleanup job "
            f"removed the changes of {', '.join(lost)} after it (their oldest LSN is later). Those changes are gone: "
            f"take a new snapshot (`cdc-pipeline restart {connector.name} always`)")


def preflight(connector: ConnectorConfig) -> list[Finding]:
    """What the source lacks for Debezium's SQL Server connector: CDC on the database and on each captured table,
    SQL Server Agent running (its capture job fills the change tables), the capture user in db_owner or with
    SELECT on the `cdc` schema and in each capture instance's gating role, SELECT on the captured tables, and
    snapshot isolation allowed when the connector's `snapshot.isolation.mode` is `snapshot`. Each finding carries
    the statement that fixes it. Raises CdcError when the source cannot be reached."""
    return read_server(connector, lambda cur: _preflight(cur, connector))


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
        # pymssql has no identifier composition: the names are bracketed by quote.
        return count_rows(cur, captured_tables(cur, USER_TABLES, captured),
                          lambda schema, table: "SELECT COUNT_BIG(*) FROM " + qualified(schema, table))

    return read_server(connector, count)


def key_range_counts(connector: ConnectorConfig, captured: Callable[[str], bool],
                     chunk_rows: int) -> dict[str, RangeCounts]:
    """For `verify`: the rows of each captured table per range of its key (a primary key of one integer column;
    other tables as one range), about `chunk_rows` rows a range (`schema.table`: counts)."""
    def count(cur: Any) -> dict[str, RangeCounts]:
        tables = captured_tables(cur, USER_TABLES, captured)
        return count_rows_by_key_range(cur, tables, PRIMARY_KEYS, lambda type_name: type_name in _INTEGER_TYPES,
                                       chunk_rows, _range_statements)

    return read_server(connector, count)


def _range_statements(schema: str, table: str, key: str | None) -> Callable[[int, int], tuple[str, str]]:
    source = qualified(schema, table)
    if key is None:
        return lambda base, width: (f"SELECT NULL, NULL, COUNT_BIG(*) FROM {source}", "")
    value = f"CAST({quote(key)} AS bigint)"
    return lambda base, width: (
        f"SELECT MIN({value}), MAX({value}), COUNT_BIG(*) FROM {source}",
        f"SELECT b, COUNT_BIG(*) FROM (SELECT ({value} - {int(base)}) / {int(width)} AS b FROM {source}) AS x "
        "GROUP BY b")
