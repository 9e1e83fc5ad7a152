"""A MariaDB/MySQL source's checks: the change check (a scan of the binlog for the connector's tables and databases),
the lag behind the binlog, row counts, the preflight check of a source (its binlog settings and the capture user's
privileges), and verify's SQL (each column rendered as the bulk snapshot's COPY text, a row's hash)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from time import monotonic
from typing import Any, Callable, Sequence

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sources.change_check import ChangeCheck, SourceLag
from cdc_pipeline.sources.finding import Finding, source_error, source_warning
from cdc_pipeline.sources.mariadb.connector import connect, databases_of
from cdc_pipeline.sources.mariadb.ddl import names_database
from cdc_pipeline.sources.mariadb.positions import TRANSACTION_STARTS, binlog_position, file_order
from cdc_pipeline.sources.mariadb.snapshot import SourceColumn, copy_text_sql, tables_of, utf8_literal
from cdc_pipeline.sources.mariadb.types import GEOMETRY_TYPES
from cdc_pipeline.sources.quoting import quote_mysql
from cdc_pipeline.sources.table import ColumnText

_TABLE_MAP = re.compile(r"table_id: \d+ \((.*)\)$")


_TRANSACTION_QUERIES = ("BEGIN", "COMMIT", "ROLLBACK", "XA ", "SAVEPOINT", "SET ")


# A check reads the binlog a page of events at a time (SHOW BINLOG EVENTS gives about 180,000 events a second
# here, a page in some 60 ms), for at most CHECK_SECONDS: a server writing other databases' events at 20,000 a
# second is read to its end at a 15 s check interval.
BINLOG_PAGE_EVENTS = 10_000
CHECK_SECONDS = 5.0


@dataclass(frozen=True)
class BinlogScan:
    """What a read of the binlog found: `found`, why the first event that concerns the connector does (None when
    none came); `reached`, the position read up to (where the next read starts); `at_end`, whether every event
    before the end it was given was read; `events`, how many were."""

    found: str | None
    reached: dict[str, Any]
    at_end: bool
    events: int
    # Where the transaction of the change `found` begins, or (a read out of time) the last transaction boundary it
    # read up to: every event before it was read, and none concerned the connector. None: no boundary was passed.
    clear_to: dict[str, Any] | None = None


def scan_binlog(cur: Any, start: dict[str, Any], end: dict[str, Any], captured: Callable[[str], bool],
                schema_change: Callable[[str], bool], seconds: float) -> BinlogScan:
    """Reads the binlog's events from `start` up to `end` (`SHOW BINLOG EVENTS`, a page of BINLOG_PAGE_EVENTS at
    a time, until `seconds` have passed) for one that concerns the connector: a row event's table map of a table
    `captured(name)` accepts, or a statement other than a transaction's own that `schema_change` accepts (DDL run
    in, or naming, one of the connector's databases).
    Events written after `end` are not read: a later check reads them. A read out of time stops inside a transaction
    as often as not; `clear_to` is then where the last transaction it read began or ended, a position an engine can
    start from (`resume_offset`)."""
    cur.execute("SHOW BINARY LOGS")
    files = [str(row[0]) for row in cur.fetchall()]
    file, pos = str(start["file"]), int(start["pos"])
    if file not in files:
        return BinlogScan(f"binlog file {file} no longer exists", start, False, 0)
    end_file, end_pos = str(end["file"]), int(end["pos"])
    if file_order(file, pos) >= file_order(end_file, end_pos):
        at_end = (file, pos) == (end_file, end_pos)
        return BinlogScan(None if at_end else f"binlog position {file}:{pos} is past the binlog's end "
                                              f"{end_file}:{end_pos} (was the binlog reset?)", start, at_end, 0)
    deadline = monotonic() + seconds
    scanned = 0
    boundary: dict[str, Any] | None = None  # where the last transaction read began (its GTID event) or ended
    for name in files[files.index(file):]:
        if name != file:
            file, pos = name, 4
        stop_pos = end_pos if name == end_file else None
        while True:
            cur.execute("SHOW BINLOG EVENTS IN %s FROM %s LIMIT %s", (name, pos, BINLOG_PAGE_EVENTS))
            events = cur.fetchall()
            for _log, event_pos, kind, _server, next_pos, info in events:
                if stop_pos is not None and int(event_pos) >= stop_pos:
                    return BinlogScan(None, {"file": end_file, "pos": end_pos}, True, scanned)
                scanned += 1
                if kind in TRANSACTION_STARTS:
                    boundary = {"file": name, "pos": int(event_pos)}
                if kind == "Table_map":
                    match = _TABLE_MAP.search(str(info))
                    if match is None or captured(match.group(1)):
                        return BinlogScan(f"a change of {match.group(1) if match else 'a table'} at "
                                          f"{name}:{event_pos}", {"file": name, "pos": int(event_pos)}, False, scanned,
                                          boundary)
                elif kind == "Query":
                    info = str(info or "")
                    if not info.upper().startswith(_TRANSACTION_QUERIES) and schema_change(info):
                        return BinlogScan(f"a schema change at {name}:{event_pos}",
                                          {"file": name, "pos": int(event_pos)}, False, scanned, boundary)
                pos = int(next_pos)
                if kind == "Xid" or kind == "Query" and str(info or "").upper().startswith("COMMIT"):
                    boundary = {"file": name, "pos": pos}
            if len(events) < BINLOG_PAGE_EVENTS:
                break  # the file's last event was read
            if monotonic() >= deadline:
                return BinlogScan(None, {"file": name, "pos": pos}, False, scanned, boundary)
        if name == end_file:
            break
    return BinlogScan(None, {"file": end_file, "pos": end_pos}, True, scanned)


def _between_transactions(offset: dict[str, Any] | None) -> bool:
    """Whether an engine offset lies between transactions (no events or rows of one to skip: a heartbeat's between
    two, or where a run's engine started), so that every change before it was applied."""
    return bool(offset) and "file" in offset and "pos" in offset and not offset.get("event") \
        and not offset.get("row") and "snapshot" not in offset and "snapshot_completed" not in offset


def check_changes(connector: ConnectorConfig, checked: Any, applied: dict[str, Any],
                  captured: Callable[[str], bool]) -> ChangeCheck:
    """The change check: whether the binlog holds, after `checked` (the binlog position a run that ended idle, or
    an earlier check, recorded: every change before it was applied; or `applied`, the engine's offset, when it is
    later and between transactions), a row event of a table `captured` accepts or
    a schema change of the connector's database. It reads up to where the binlog ended when it began, for at most
    CHECK_SECONDS; the position it read up to over other tables' and databases' events only is recorded, so that
    writes elsewhere on the server launch nothing, and so that a run's engine starts there (`resume_offset`): at
    the binlog's end, at the start of the transaction of the change it found, or at the last transaction boundary
    it read before its time ran out (inside a transaction longer than a page of events, where it stopped). A check
    that did not reach the end in its time says there are changes: a run reads the rest, and records where it
    ended idle."""
    if not checked:
        return ChangeCheck(True, "no source position is recorded as applied yet (the last run did not end idle)")
    start = checked if isinstance(checked, dict) else json.loads(checked)
    if _between_transactions(applied) and file_order(str(applied["file"]), int(applied["pos"])) \
            > file_order(str(start["file"]), int(start["pos"])):
        # The engine's stored offset, moved on by its heartbeats through other databases' events.
        start = {"file": str(applied["file"]), "pos": int(applied["pos"])}
    with connect(connector) as source, source.cursor() as cur:
        end = binlog_position(cur)
        if end == {"file": str(start["file"]), "pos": int(start["pos"])}:
            return ChangeCheck(False, f"no binlog event since {start['file']}:{start['pos']}", reached_end=True)
        scan = scan_binlog(cur, start, end, captured, lambda statement: names_database(connector, statement),
                           CHECK_SECONDS)
    # A transaction's start (or end) when the read passed one: a run's engine may start there (`resume_offset`).
    recorded = scan.reached if scan.at_end else scan.clear_to if scan.found else scan.clear_to or scan.reached
    moved = recorded if recorded is not None and recorded != start else None
    if scan.found:
        return ChangeCheck(True, scan.found, checked=moved)
    reached = f"{scan.reached['file']}:{scan.reached['pos']}"
    if not scan.at_end:
        return ChangeCheck(True, f"the binlog was not read to its end {end['file']}:{end['pos']} within "
                                 f"{CHECK_SECONDS:g} s ({scan.events} events of other tables and databases read, up "
                                 f"to {reached}): a run reads the rest", checked=moved)
    return ChangeCheck(False, f"no change of the connector's tables up to {reached}", checked=moved, reached_end=True)


LAG_EVENTS_LIMIT = 10_000


def replication_lag(connector: ConnectorConfig, checked: Any, applied: dict[str, Any]) -> SourceLag | None:
    """How far the binlog goes past the connector: bytes, and events up to LAG_EVENTS_LIMIT, from the later of
    `checked` (the position a run that ended idle, or a change check, read up to) and the last `applied` event's
    offset (`file`, `pos`: where its transaction starts). None when neither is known."""
    starts = [position for position in (json.loads(checked) if isinstance(checked, str) else checked, applied)
              if position and "file" in position and "pos" in position]
    if not starts:
        return None
    start = max(({"file": str(p["file"]), "pos": int(p["pos"])} for p in starts),
                key=lambda p: file_order(p["file"], p["pos"]))
    import pymysql

    try:
        return _binlog_lag(connector, start)
    except pymysql.MySQLError as exc:
        raise CdcError(f"cannot read the binlog past {start['file']}:{start['pos']}: {exc}",
                       connector=connector.name) from exc


def _binlog_lag(connector: ConnectorConfig, start: dict[str, Any]) -> SourceLag:
    with connect(connector) as source, source.cursor() as cur:
        end = binlog_position(cur)
        cur.execute("SHOW BINARY LOGS")
        sizes = {str(row[0]): int(row[1]) for row in cur.fetchall()}
        names = list(sizes)
        if start["file"] not in sizes:
            # The binlog the connector stopped in was purged: everything still on the server is ahead of it.
            behind = sum(sizes.values())
            following = names
            first_pos = 4
        else:
            following = names[names.index(start["file"]):names.index(end["file"]) + 1] if end["file"] in sizes \
                else names[names.index(start["file"]):]
            behind = end["pos"] - start["pos"] if start["file"] == end["file"] else \
                sizes[start["file"]] - start["pos"] + sum(sizes[name] for name in following[1:-1]) + end["pos"]
            first_pos = start["pos"]
        events = 0
        for name in following:
            if events > LAG_EVENTS_LIMIT or behind <= 0:
                break
            cur.execute("SHOW BINLOG EVENTS IN %s FROM %s LIMIT %s",
                        (name, first_pos if name == start["file"] else 4, LAG_EVENTS_LIMIT + 1 - events))
            events += len(cur.fetchall())
    return SourceLag(bytes=max(0, behind), position=f"{start['file']}:{start['pos']}",
                     source_position=f"{end['file']}:{end['pos']}", events=min(events, LAG_EVENTS_LIMIT),
                     events_capped=events > LAG_EVENTS_LIMIT)


def row_counts(connector: ConnectorConfig, captured: Callable[[str], bool]) -> dict[str, int]:
    """The rows of each table of the connector's databases that `captured` accepts (`db.table`: rows)."""
    with connect(connector) as conn, conn.cursor() as cur:
        tables = [table.name for table in tables_of(cur, connector)]
        counts = {}
        for source_table in filter(captured, tables):
            database, table = connector.split_table(source_table)
            # pymysql has no identifier composition like psycopg.sql: the names are backquoted by quote_mysql.
            cur.execute("SELECT COUNT(*) FROM " + quote_mysql(database) + "." + quote_mysql(table))
            counts[source_table] = int(cur.fetchone()[0])
    return counts


# The binlog settings Debezium's connector needs, with the value each must have.
REQUIRED_BINLOG_SETTINGS = {"binlog_format": "ROW", "binlog_row_image": "FULL"}
# The global privileges Debezium's MariaDB/MySQL connector needs (its snapshot's FLUSH TABLES and SHOW DATABASES, the
# binlog client's), which the bulk snapshot's consistent reads and the change check's SHOW BINLOG EVENTS need too,
# each with the names information_schema.USER_PRIVILEGES may give it: MariaDB 10.5 and later name REPLICATION CLIENT
# "BINLOG MONITOR" (REPLICATION CLIENT is an alias it still takes in GRANT).
CAPTURE_PRIVILEGES = {
    "SELECT": ("SELECT",),
    "RELOAD": ("RELOAD",),
    "SHOW DATABASES": ("SHOW DATABASES",),
    "REPLICATION SLAVE": ("REPLICATION SLAVE",),
    "REPLICATION CLIENT": ("REPLICATION CLIENT", "BINLOG MONITOR"),
}


def preflight(connector: ConnectorConfig) -> list[Finding]:
    """What the source lacks for the connector to run: the binary log on, in ROW format with FULL row images, GTID
    mode when the connector's `debezium` properties filter GTIDs (MySQL), and the capture user's privileges (global
    ones as Debezium's documentation lists them; SELECT on each database is enough for the reads), and for `databases`
    that some database matches them. Each finding
    carries the statement that fixes it. Raises CdcError when the source cannot be reached."""
    with connect(connector) as source, source.cursor() as cur:
        cur.execute("SELECT @@GLOBAL.log_bin, @@GLOBAL.binlog_format, @@GLOBAL.binlog_row_image, CURRENT_USER()")
        log_bin, binlog_format, row_image, account = cur.fetchone()
        findings = _binlog_findings(bool(int(log_bin)), {"binlog_format": binlog_format, "binlog_row_image": row_image})
        if connector.type == "mysql" and any(key.startswith("gtid.") for key in connector.debezium):
            cur.execute("SELECT @@GLOBAL.gtid_mode")
            findings += _gtid_findings(str(cur.fetchone()[0]))
        findings += _privilege_findings(cur, connector, account)
        if connector.databases and not databases_of(cur, connector):
            findings.append(source_warning(
                "databases", f"no database of the server that the capture user sees matches "
                             f"{connector.databases_text}: the connector replicates those created later",
                "create the databases, or grant the capture user SELECT on them"))
    return findings


def _binlog_findings(log_bin: bool, settings: dict[str, str]) -> list[Finding]:
    if not log_bin:
        return [source_error("log_bin", "the server writes no binary log (log_bin is OFF), which Debezium reads",
                             "add `log_bin = mysql-bin` (and a `server_id` unique among the servers) under [mysqld] in "
                             "the server's my.cnf, then restart the server: log_bin cannot be set at runtime")]
    findings = []
    for name, wanted in REQUIRED_BINLOG_SETTINGS.items():
        if str(settings[name]).upper() != wanted:
            findings.append(source_error(
                name, f"{name} is {settings[name]}, and Debezium needs {wanted}",
                f"SET GLOBAL {name} = '{wanted}'; and `{name} = {wanted}` under [mysqld] in my.cnf, so that a "
                "restart keeps it (sessions open before SET GLOBAL keep the old value until they reconnect)"))
    return findings


def _gtid_findings(gtid_mode: str) -> list[Finding]:
    if gtid_mode.upper() == "ON":
        return []
    return [source_error("gtid_mode", f"gtid_mode is {gtid_mode}, and the connector's debezium properties filter "
                                      "GTIDs (gtid.source.*)",
                         "SET GLOBAL enforce_gtid_consistency = ON; then SET GLOBAL gtid_mode = OFF_PERMISSIVE, "
                         "ON_PERMISSIVE and ON, one step at a time; and `gtid_mode = ON`, "
                         "`enforce_gtid_consistency = ON` under [mysqld] in my.cnf")]


def _privilege_findings(cur: Any, connector: ConnectorConfig, account: str) -> list[Finding]:
    """The capture user's missing privileges. Privileges granted through a role are not seen (a finding then names
    one the user has)."""
    user, _, host = account.rpartition("@")
    grantee = f"'{user}'@'{host}'"
    cur.execute("SELECT PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES WHERE GRANTEE = %s", (grantee,))
    held = {str(row[0]).upper() for row in cur.fetchall()}
    if "SELECT" not in held:
        # SELECT on each of the connector's databases will do (a schema privilege's name may be a LIKE pattern).
        unreadable = []
        for database in databases_of(cur, connector):
            cur.execute("SELECT 1 FROM information_schema.SCHEMA_PRIVILEGES WHERE GRANTEE = %s "
                        "AND PRIVILEGE_TYPE = 'SELECT' AND %s LIKE TABLE_SCHEMA", (grantee, database))
            if cur.fetchone() is None:
                unreadable.append(database)
        if not unreadable:
            held.add("SELECT")
    missing = [name for name, aliases in CAPTURE_PRIVILEGES.items() if not held.intersection(aliases)]
    to_user = f"TO {_account_literal(user)}@{_account_literal(host)}"
    findings = []
    if missing:
        findings.append(source_error(
            "privileges", f"the capture user {user}@{host} lacks {', '.join(missing)}",
            f"GRANT {', '.join(missing)} ON *.* {to_user};"))
    if "LOCK TABLES" not in held:
        findings.append(source_warning(
            "privileges", f"the capture user {user}@{host} lacks LOCK TABLES, which Debezium's snapshot uses where "
                          "the server refuses it a global read lock (managed servers)",
            f"GRANT LOCK TABLES ON *.* {to_user};"))
    return findings


def _account_literal(text: str) -> str:
    """A user or host name as a quoted string of MariaDB/MySQL's GRANT."""
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


_FRACTION = re.compile(r"\((\d)\)")


def _fraction_digits(column: SourceColumn) -> int:
    match = _FRACTION.search(column.column_type)
    return int(match.group(1)) if match else 0


def verify_text(column: SourceColumn, pg_type: str, value: Any) -> ColumnText:
    """How verify compares the column (`value`: the destination column, as psycopg SQL): the source renders the COPY
    text field the bulk snapshot writes (`copy_text_sql`), the destination renders its value back to that text.
    TIMESTAMP compares as UTC microseconds on both sides; geometry, a SET written as an array and a jsonb document
    (its spacing and key order are normalized) are left out."""
    from psycopg import sql

    kind = column.data_type
    if kind in GEOMETRY_TYPES:
        return ColumnText(left_out="geometry: MariaDB's and PostGIS's renderings differ")
    if kind == "set" and pg_type.endswith("[]"):
        return ColumnText(left_out="a SET written as an array")
    if pg_type == "jsonb":
        return ColumnText(left_out="jsonb normalizes a document's spacing and key order")
    if kind in ("float", "double"):
        return ColumnText(left_out="floating point: MariaDB and PostgreSQL write its digits differently")
    if kind == "timestamp":
        name = quote_mysql(column.name)
        micros = (f"IF(UNIX_TIMESTAMP({name}) = 0, NULL, "
                  f"CAST(CAST(UNIX_TIMESTAMP({name}) * 1000000 AS SIGNED) AS CHAR))")
        return ColumnText(f"COALESCE({micros}, {utf8_literal(92, 78)})",
                          sql.SQL("round(extract(epoch FROM {}) * 1000000)::bigint::text").format(value),
                          how="as UTC microseconds")
    source = copy_text_sql(column, pg_type)
    if source is None:
        return ColumnText(left_out=f"{kind} is rendered by Spark only")
    digits = _fraction_digits(column)
    if kind in ("date", "datetime"):
        # A date with a zero month or day (a zero date too) is written as NULL, as the stream writes it.
        name = quote_mysql(column.name)
        source = f"IF(MONTH({name}) = 0 OR DAYOFMONTH({name}) = 0, {utf8_literal(92, 78)}, {source})"
    if pg_type == "boolean":
        return ColumnText(source, sql.SQL("CASE WHEN {0} THEN '1' WHEN NOT {0} THEN '0' END").format(value))
    if kind == "datetime" and pg_type.startswith("timestamp"):
        text = sql.SQL("to_char({}, 'YYYY-MM-DD HH24:MI:SS')").format(value)
        if digits:
            text = sql.SQL("{} || '.' || left(to_char({}, 'US'), {})").format(text, value, sql.Literal(digits))
        return ColumnText(source, text)
    if kind == "time" and pg_type == "interval":
        micros = sql.SQL("abs(round(extract(epoch FROM {}) * 1000000)::bigint)").format(value)
        parts = [sql.SQL("CASE WHEN {} < interval '0' THEN '-' ELSE '' END").format(value),
                 sql.SQL("CASE WHEN {0} < 36000000000 THEN '0' ELSE '' END || ({0} / 3600000000::bigint)::text").format(
                     micros), sql.SQL("':'"),
                 sql.SQL("lpad(({} / 60000000 % 60)::text, 2, '0')").format(micros), sql.SQL("':'"),
                 sql.SQL("lpad(({} / 1000000 % 60)::text, 2, '0')").format(micros)]
        if digits:
            parts += [sql.SQL("'.'"), sql.SQL("left(lpad(({} % 1000000)::text, 6, '0'), {})").format(
                micros, sql.Literal(digits))]
        return ColumnText(source, sql.SQL("CASE WHEN {} IS NOT NULL THEN {} END").format(
            value, sql.SQL(" || ").join(parts)))
    if pg_type == "bytea":
        return ColumnText(source, sql.SQL("'\\x' || encode({}, 'hex')").format(value))
    return ColumnText(source, sql.SQL("{}::text").format(value))


def row_hash_sql(line: str) -> str:
    """A row's hash for verify: the first 60 bits of the MD5 of its line (UTF-8), as an unsigned integer."""
    return f"CAST(CONV(SUBSTR(MD5({line}), 1, 15), 16, 10) AS UNSIGNED)"


def verify_session(cur: Any) -> None:
    """Verify's source session: nothing its renderings depend on (TIMESTAMP is read in UTC by UNIX_TIMESTAMP)."""


def estimated_rows(cur: Any, source_tables: Sequence[str]) -> list[tuple[str, Any]]:
    """Each table's rows (`db.table`, rows) as information_schema.TABLES.TABLE_ROWS estimates them, for the tables'
    databases in one query."""
    names = sorted({table.split(".", 1)[0] for table in source_tables})
    cur.execute("SELECT CONCAT(TABLE_SCHEMA, '.', TABLE_NAME), TABLE_ROWS FROM information_schema.TABLES "
                "WHERE TABLE_TYPE = 'BASE TABLE' AND TABLE_SCHEMA IN (" + ", ".join(["%s"] * len(names)) + ")",
                names)
    return cur.fetchall()
