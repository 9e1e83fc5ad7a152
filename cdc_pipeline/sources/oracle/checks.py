"""The checks that read an Oracle source without a JVM, through python-oracledb in thin mode (no client libraries):
the change check, the preflight check, row counts and verify's key-range counts.

The change check. An SCN moves with any activity of the database (its own background work too), so the current SCN
alone never tells that nothing is new. The check mines the redo between the applied position and the current SCN
with LogMiner (the capture user holds its privileges: the preflight checks them), for a change of a captured table
committed after the applied one, within a bound on the redo's size; more redo than that asks for a run, which reads
it. The applied position must still be in the redo logs the database keeps (online and archived): when it is older
than the oldest, the connector cannot resume.
"""

from __future__ import annotations

from typing import Any, Callable

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.sources.change_check import ChangeCheck, RangeCounts
from cdc_pipeline.sources.finding import Finding, source_error, source_warning
from cdc_pipeline.sources.oracle.connector import enter_pdb, pdb_name, qualified, quote, read_server
from cdc_pipeline.sources.oracle.positions import check_position
from cdc_pipeline.sources.table_counts import captured_tables, count_rows, count_rows_by_key_range

CHECK_SECONDS = 20.0  # a change check's LogMiner session, at most
CHECK_REDO_BYTES = 256 << 20  # more archived redo than this since the applied position: a run reads it, not a check
CHECK_ROWS = 100_000

CURRENT_SCN = "SELECT current_scn FROM v$database"
OLDEST_LOG_SCN = ("SELECT MIN(first_change#) FROM (SELECT first_change# FROM v$log UNION ALL SELECT first_change# "
                  "FROM v$archived_log WHERE status = 'A' AND deleted = 'NO' AND name IS NOT NULL)")
REDO_LOGS = ("SELECT a.name, a.thread#, a.sequence#, a.blocks * a.block_size, 1 FROM v$archived_log a "
             "WHERE a.status = 'A' AND a.deleted = 'NO' AND a.name IS NOT NULL AND a.next_change# > :start_scn "
             "UNION ALL SELECT f.member, l.thread#, l.sequence#, l.bytes, 0 FROM v$log l JOIN v$logfile f "
             "ON f.group# = l.group# WHERE l.next_change# > :start_scn AND (f.status IS NULL OR f.status <> 'INVALID') "
             "ORDER BY 2, 3, 5 DESC")
ADD_LOGFILE = "BEGIN DBMS_LOGMNR.ADD_LOGFILE(LOGFILENAME => :name, OPTIONS => :options); END;"
START_LOGMNR = ("BEGIN DBMS_LOGMNR.START_LOGMNR(STARTSCN => :start_scn, ENDSCN => :end_scn, "
                "OPTIONS => DBMS_LOGMNR.DICT_FROM_ONLINE_CATALOG); END;")
END_LOGMNR = "BEGIN DBMS_LOGMNR.END_LOGMNR; END;"
# Commits up to the applied one, and changes (insert, delete, update, DDL) of tables outside Oracle's own schemas.
MINED_CHANGES = ("SELECT scn, xid, operation_code, seg_owner, table_name, src_con_name FROM v$logmnr_contents "
                 "WHERE scn >= :start_scn AND ((operation_code = 7 AND scn <= :committed_scn) "
                 "OR (operation_code IN (1, 2, 3, 5) AND seg_owner NOT IN "
                 "(SELECT username FROM all_users WHERE oracle_maintained = 'Y'))) AND ROWNUM <= :row_limit")
DATABASE_STATE = ("SELECT log_mode, supplemental_log_data_min, supplemental_log_data_all, cdb, "
                  "SYS_CONTEXT('USERENV', 'SESSION_USER') FROM v$database")
SESSION_PRIVILEGES = "SELECT privilege FROM session_privs"
LOGMNR_EXECUTE = "SELECT COUNT(*) FROM all_procedures WHERE owner = 'SYS' AND object_name = 'DBMS_LOGMNR'"
USER_TABLES = ("SELECT owner, table_name FROM all_tables WHERE owner NOT IN "
               "(SELECT username FROM all_users WHERE oracle_maintained = 'Y') AND nested = 'NO' "
               "AND temporary = 'N' ORDER BY owner, table_name")
PRIMARY_KEYS = ("SELECT cc.owner, cc.table_name, cc.column_name, tc.data_type, tc.data_scale FROM all_constraints c "
                "JOIN all_cons_columns cc ON cc.owner = c.owner AND cc.constraint_name = c.constraint_name "
                "JOIN all_tab_columns tc ON tc.owner = cc.owner AND tc.table_name = cc.table_name "
                "AND tc.column_name = cc.column_name WHERE c.constraint_type = 'P' "
                "ORDER BY cc.owner, cc.table_name, cc.position")
ALL_COLUMN_LOGGING = "SELECT owner, table_name FROM all_log_groups WHERE log_group_type = 'ALL COLUMN LOGGING'"
# LogMiner's privileges as Debezium's Oracle documentation lists them (the system ones session_privs shows, roles
# included), and the V$ views it reads (granted as their V_$ base views).
SYSTEM_PRIVILEGES = ("CREATE SESSION", "LOGMINING", "SELECT ANY TRANSACTION", "FLASHBACK ANY TABLE",
                     "SELECT ANY TABLE", "LOCK ANY TABLE")
LOGMINER_VIEWS = ("V$LOG", "V$LOG_HISTORY", "V$LOGFILE", "V$ARCHIVED_LOG", "V$ARCHIVE_DEST_STATUS",
                  "V$LOGMNR_LOGS", "V$LOGMNR_CONTENTS", "V$LOGMNR_PARAMETERS", "V$TRANSACTION", "V$MYSTAT",
                  "V$STATNAME")
_DML_AND_DDL = (1, 2, 3, 5)
_COMMIT = 7


def check_changes(connector: ConnectorConfig, checked: Any, applied: dict[str, Any],
                  captured: Callable[[str], bool]) -> ChangeCheck:
    """The change check: whether the redo since the applied position holds a change of a captured table that the
    connector has not applied (one of a transaction not committed by the applied commit), mined by LogMiner; or
    whether that position is older than every redo log the database keeps."""
    position = check_position(applied)
    if position is None:
        return ChangeCheck(True, "no streamed position is applied yet")
    committed, resume = position
    pdb = pdb_name(connector)
    return read_server(connector, lambda cur: _check(cur, connector, resume, committed,
                                                     lambda table, container: captured(table)
                                                     and (pdb is None or container == pdb.upper())))


def _check(cur: Any, connector: ConnectorConfig, resume: int, committed: int,
           captured: Callable[[str, str | None], bool]) -> ChangeCheck:
    cur.execute(CURRENT_SCN)
    current = int(cur.fetchone()[0])
    cur.execute(OLDEST_LOG_SCN)
    oldest = cur.fetchone()[0]
    if oldest is None or resume < int(oldest):
        return ChangeCheck(False, f"the applied position (SCN {resume}) is older than every redo log the database "
                                  f"keeps (the oldest starts at SCN {oldest}): LogMiner cannot read the changes "
                                  "after it, and the connector cannot resume. Restore the archived logs from SCN "
                                  f"{resume} on, or take a new snapshot (`cdc-pipeline restart {connector.name} "
                                  "always`)", known=False)
    cur.execute(REDO_LOGS, start_scn=resume)
    logs: dict[tuple[int, int], tuple[str, int]] = {}
    for name, thread, sequence, size, archived in cur.fetchall():
        # The archived copy first; an online log's size is its file's, not the redo written in it so far (the few
        # online logs are always mined).
        logs.setdefault((int(thread), int(sequence)), (name, int(size or 0) if archived else 0))
    redo = sum(size for _, size in logs.values())
    if redo > CHECK_REDO_BYTES:
        return ChangeCheck(True, f"{redo >> 20} MB of archived redo since SCN {resume}, more than a check mines "
                                 f"({CHECK_REDO_BYTES >> 20} MB): a run reads it")
    return _mine(cur, [name for name, _ in logs.values()], resume, committed, current, captured)


def _mine(cur: Any, files: list[str], resume: int, committed: int, current: int,
          captured: Callable[[str, str | None], bool]) -> ChangeCheck:
    """LogMiner over `files` from `resume` to `current`: a change of a table `captured` accepts (its name, and the
    container it is in: mined in the root of a container database, the redo holds every PDB's) committed after
    `committed`, or in a transaction open then."""
    import oracledb

    if not files:
        return ChangeCheck(True, f"no redo log holds SCN {resume} on: a run reads from there")
    cur.connection.call_timeout = int(CHECK_SECONDS * 1000)
    for index, name in enumerate(files):
        cur.execute(ADD_LOGFILE, name=name, options=1 if index == 0 else 3)  # DBMS_LOGMNR.NEW, then ADDFILE
    cur.execute(START_LOGMNR, start_scn=resume, end_scn=current)
    try:
        cur.execute(MINED_CHANGES, start_scn=resume, committed_scn=committed, row_limit=CHECK_ROWS)
        rows = cur.fetchall()
    finally:
        try:
            cur.execute(END_LOGMNR)
        except oracledb.Error:
            pass  # the session ends with the connection, and its LogMiner session with it
    open_transactions: dict[Any, str] = {}
    committed_transactions = set()
    for scn, xid, operation, owner, table, container in rows:
        if operation == _COMMIT:
            committed_transactions.add(xid)
            continue
        source_table = f"{owner}.{table}"
        if operation not in _DML_AND_DDL or not captured(source_table, container):
            continue
        if int(scn) > committed:
            return ChangeCheck(True, f"{source_table} changed at SCN {scn}, after the applied commit (SCN "
                                     f"{committed})")
        open_transactions.setdefault(xid, source_table)
    unapplied = [table for xid, table in open_transactions.items() if xid not in committed_transactions]
    if unapplied:
        return ChangeCheck(True, f"a transaction open at the applied commit (SCN {committed}) changed {unapplied[0]}")
    if len(rows) >= CHECK_ROWS:
        return ChangeCheck(True, f"more than {CHECK_ROWS} changes and commits since SCN {resume}: a run reads them")
    return ChangeCheck(False, f"no change of the connector's tables between SCN {resume} and {current}",
                       reached_end=True)


def preflight(connector: ConnectorConfig) -> list[Finding]:
    """What the source lacks for Debezium's Oracle connector (LogMiner): ARCHIVELOG mode, minimal supplemental
    logging on the database and ALL COLUMNS logging on each captured table (or on the database), LogMiner's
    privileges (LOGMINING, SELECT ANY TRANSACTION, EXECUTE on DBMS_LOGMNR, the V$ views) and, in a container
    database, a common user (C##). Each finding carries the statement that fixes it. Raises CdcError when the source
    cannot be reached."""
    return read_server(connector, lambda cur: _preflight(cur, connector))


def _preflight(cur: Any, connector: ConnectorConfig) -> list[Finding]:
    cur.execute(DATABASE_STATE)
    log_mode, minimal, all_columns, cdb, user = cur.fetchone()
    findings = []
    if log_mode != "ARCHIVELOG":
        findings.append(source_error(
            "log_mode", f"the database is in {log_mode} mode: LogMiner reads redo logs the database archives",
            "as SYSDBA: SHUTDOWN IMMEDIATE; STARTUP MOUNT; ALTER DATABASE ARCHIVELOG; ALTER DATABASE OPEN; "
            "(and a db_recovery_file_dest large enough for the archived logs)"))
    if minimal not in ("YES", "IMPLICIT"):
        findings.append(source_error("supplemental_log_data_min", "minimal supplemental logging is off: the redo "
                                                                  "lacks what LogMiner needs to rebuild a change",
                                     "ALTER DATABASE ADD SUPPLEMENTAL LOG DATA;"))
    if cdb == "YES" and not user.startswith("C##"):
        findings.append(source_error("user", f"the database is a container database and {user} is a local user: "
                                             "LogMiner runs in the root container, with a common user",
                                     'CREATE USER C##DBZUSER IDENTIFIED BY "..." CONTAINER=ALL; then grant it the '
                                     "privileges with CONTAINER=ALL, and make it the connector's user"))
    findings += _privilege_findings(cur, user, cdb == "YES")
    enter_pdb(cur, connector)
    if all_columns != "YES":
        findings += _table_logging_findings(cur, connector)
    return findings


def _privilege_findings(cur: Any, user: str, cdb: bool) -> list[Finding]:
    import oracledb

    container = " CONTAINER=ALL" if cdb else ""
    cur.execute(SESSION_PRIVILEGES)
    held = {row[0] for row in cur.fetchall()}
    required = SYSTEM_PRIVILEGES + (("SET CONTAINER",) if cdb else ())
    missing = [privilege for privilege in required if privilege not in held]
    findings = []
    if missing:
        findings.append(source_error("privileges", f"the capture user {user} lacks {', '.join(missing)}",
                                     f"GRANT {', '.join(missing)} TO {quote(user)}{container};"))
    cur.execute(LOGMNR_EXECUTE)
    if not cur.fetchone()[0]:
        findings.append(source_error("privileges", f"the capture user {user} may not execute DBMS_LOGMNR",
                                     f"GRANT EXECUTE ON DBMS_LOGMNR TO {quote(user)}{container}; (as SYS)"))
    unreadable = []
    for view in LOGMINER_VIEWS:
        try:
            cur.execute(f"SELECT COUNT(*) FROM {view} WHERE 1 = 0")
            cur.fetchone()
        except oracledb.DatabaseError:
            unreadable.append(view)
    if unreadable:
        findings.append(source_error(
            "privileges", f"the capture user {user} cannot read {', '.join(unreadable)}",
            " ".join(f"GRANT SELECT ON {view.replace('V$', 'V_$')} TO {quote(user)}{container};"
                     for view in unreadable) + " (as SYS)"))
    return findings


def _table_logging_findings(cur: Any, connector: ConnectorConfig) -> list[Finding]:
    cur.execute(USER_TABLES)
    tables = [f"{owner}.{table}" for owner, table in cur.fetchall()]
    cur.execute(ALL_COLUMN_LOGGING)
    logged = {f"{owner}.{table}" for owner, table in cur.fetchall()}
    findings = []
    missing = [table for table in connector.tables if table not in tables]
    if missing:
        findings.append(source_error("tables", f"the connector's tables {', '.join(missing)} do not exist"
                                               + (f" in {pdb_name(connector)}" if pdb_name(connector) else ""),
                                     "correct the connector's `tables` (OWNER.TABLE, as the dictionary spells them)"))
    captured = [table for table in tables if table in connector.tables] if connector.tables else tables
    unlogged = [table for table in captured if table not in logged]
    if unlogged:
        statements = " ".join(f"ALTER TABLE {qualified(*connector.split_table(table))} ADD SUPPLEMENTAL LOG DATA "
                              "(ALL) COLUMNS;" for table in unlogged)
        finding = source_error if connector.tables else source_warning
        findings.append(finding("supplemental_log_data_all",
                                f"{', '.join(unlogged)} {'has' if len(unlogged) == 1 else 'have'} no ALL COLUMNS "
                                "supplemental logging: an update's event would lack the columns it did not change",
                                statements))
    return findings


def row_counts(connector: ConnectorConfig, captured: Callable[[str], bool]) -> dict[str, int]:
    """The rows of each table (outside Oracle's own schemas) that `captured` accepts (`OWNER.TABLE`: rows)."""
    def count(cur: Any) -> dict[str, int]:
        enter_pdb(cur, connector)
        # python-oracledb binds values, not names: the names are double-quoted by quote.
        return count_rows(cur, captured_tables(cur, USER_TABLES, captured),
                          lambda owner, table: "SELECT COUNT(*) FROM " + qualified(owner, table))

    return read_server(connector, count)


def key_range_counts(connector: ConnectorConfig, captured: Callable[[str], bool],
                     chunk_rows: int) -> dict[str, RangeCounts]:
    """For `verify`: the rows of each captured table per range of its key (a primary key of one NUMBER column of
    scale 0; other tables as one range), about `chunk_rows` rows a range (`OWNER.TABLE`: counts)."""
    def count(cur: Any) -> dict[str, RangeCounts]:
        enter_pdb(cur, connector)
        tables = captured_tables(cur, USER_TABLES, captured)
        return count_rows_by_key_range(cur, tables, PRIMARY_KEYS,
                                       lambda data_type, scale: data_type == "NUMBER" and scale == 0,
                                       chunk_rows, _range_statements)

    return read_server(connector, count)


def _range_statements(owner: str, table: str, key: str | None) -> Callable[[int, int], tuple[str, str]]:
    source = qualified(owner, table)
    if key is None:
        return lambda base, width: (f"SELECT NULL, NULL, COUNT(*) FROM {source}", "")
    value = quote(key)
    return lambda base, width: (
        f"SELECT MIN({value}), MAX({value}), COUNT(*) FROM {source}",
        f"SELECT b, COUNT(*) FROM (SELECT FLOOR(({value} - {int(base)}) / {int(width)}) AS b FROM {source}) "
        "GROUP BY b")
