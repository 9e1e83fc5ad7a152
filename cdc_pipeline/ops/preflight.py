"""The preflight check of a connector: what its source and the destination lack before its first run, each finding
with the statement that fixes it (`cdc-pipeline check NAME`).

The source's checks are its source type's module's (`preflight` of each package's `checks` room:
`sources/<type>/checks.py`). The destination's are here: it can be reached, it is a primary that
takes writes, the session settings the pipeline pins (`config.SESSION_SETTINGS`) take effect, no default the
session leaves alone (read-only transactions, idle transaction timeouts) breaks a run, and the role may create the
control schema and the connector's destination schemas.

A connector's first sync runs the check before its engine starts (`require_ready`) and refuses to start on an
error; later runs do not check again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from cdc_pipeline import control, sources
from cdc_pipeline.bulk_load import bookkeeping
from cdc_pipeline.capture.runner import failure_hint
from cdc_pipeline.config import SESSION_SETTINGS, ConnectorConfig, DestinationConfig, destination_tables
from cdc_pipeline.errors import CdcError, PreflightError
from cdc_pipeline.sources.finding import ERROR, WARNING, Finding

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 10
# Destination defaults a batch's transaction may meet: it stays open, idle, while Spark's tasks stage its rows.
IDLE_TIMEOUTS = ("idle_in_transaction_session_timeout", "transaction_timeout")


@dataclass(frozen=True)
class Preflight:
    """The findings of one connector's check, and notes on what was not checked."""

    connector: str
    connector_type: str
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [finding for finding in self.findings if finding.is_error]

    def as_dict(self) -> dict[str, Any]:
        return {"connector": self.connector, "connector_type": self.connector_type,
                "findings": [finding.as_dict() for finding in self.findings], "notes": self.notes}


def check(connector: ConnectorConfig, destination: DestinationConfig) -> Preflight:
    """Checks the connector's source (when its source type has checks) and the destination; changes nothing."""
    report = Preflight(connector.name, connector.type)
    module = sources.module_for(connector.type)
    if module.preflight is not None:
        report.findings.extend(_source_findings(module, connector))
    else:
        report.notes.append(f"no preflight checks for {connector.type} sources")
    report.findings.extend(destination_findings(connector, destination))
    return report


def _source_findings(module: Any, connector: ConnectorConfig) -> list[Finding]:
    import pymysql

    try:
        return module.preflight(connector)
    except CdcError as exc:
        if not exc.message.startswith("cannot connect"):
            # SQL Server's and Oracle's checks say so when the source refused one of their queries.
            return [Finding(ERROR, "source", "check", exc.message,
                            "give the capture user the privileges the message names")]
        return [Finding(ERROR, "source", "connection", exc.message, failure_hint(exc.message)
                        or "check the connector's hostname, port, user, password, database and tls_mode")]
    except (psycopg.Error, pymysql.MySQLError) as exc:
        return [Finding(ERROR, "source", "check", f"the source refused a check's query: {_first_line(exc)}",
                        "give the capture user the privileges the message names")]


def destination_findings(connector: ConnectorConfig, destination: DestinationConfig) -> list[Finding]:
    """What the destination lacks for the connector: a connection, a primary that takes writes, the pinned session
    settings in effect, no read-only or idle-transaction default, and CREATE where the control schema and the
    destination schemas are to be created."""
    try:
        conn = destination.connect(connector.name, connect_timeout=CONNECT_TIMEOUT_SECONDS)
    except CdcError as exc:
        return [_error("connection", exc.message, "check the destination's dsn and that the server is up")]
    with conn, conn.cursor() as cur:
        cur.execute("SELECT current_user, current_database(), pg_is_in_recovery()")
        user, database, standby = cur.fetchone()
        if standby:
            return [_error("pg_is_in_recovery", f"the destination {database} is a standby, which takes no writes",
                           "point the destination's dsn at the primary")]
        findings = _session_findings(cur, user, database)
        findings += _schema_findings(cur, connector, destination, user, database)
    return findings


def _session_findings(cur: psycopg.Cursor, user: str, database: str) -> list[Finding]:
    """The pinned settings read back from a session the pipeline opens (a pooler that drops the `options`
    connection parameter leaves the database's or role's defaults), and the defaults the session does not pin."""
    findings = []
    for name, wanted in SESSION_SETTINGS.items():
        cur.execute("SELECT current_setting(%s)", (name,))
        actual = cur.fetchone()[0]
        if actual.lower() != wanted.lower():
            findings.append(_error(name, f"the pipeline's sessions ask for {name} = {wanted!r} when they connect and "
                                         f"run with {actual!r}: something between them and the server drops the "
                                         "`options` connection parameter",
                                   "connect the destination's dsn to the server itself, or let the pooler pass "
                                   "`options` on (PgBouncer: session pooling with `options` allowed)"))
    cur.execute("SELECT setting, source FROM pg_settings WHERE name = 'default_transaction_read_only'")
    value, source = cur.fetchone()
    if value == "on":
        findings.append(_error("default_transaction_read_only",
                               f"default_transaction_read_only is on ({source} default): every write fails",
                               _reset_statement("default_transaction_read_only", "off", source, user, database)))
    cur.execute("SELECT name, setting::bigint, source FROM pg_settings WHERE name = ANY(%s)", (list(IDLE_TIMEOUTS),))
    for name, milliseconds, source in cur.fetchall():
        if milliseconds > 0:
            findings.append(_warning(
                name, f"{name} is {milliseconds} ms ({source} default): a batch's transaction waits, idle, while "
                      "Spark's tasks stage its rows, and a longer wait ends it (the run fails)",
                _reset_statement(name, "0", source, user, database)))
    return findings


def _reset_statement(name: str, value: str, source: str, user: str, database: str) -> str:
    """The statement that takes back a default where pg_settings says it was set."""
    setting = sql.Identifier(name).as_string()
    role, db = sql.Identifier(user).as_string(), sql.Identifier(database).as_string()
    if source == "database":
        return f"ALTER DATABASE {db} RESET {setting};"
    if source == "user":
        return f"ALTER ROLE {role} RESET {setting};"
    if source == "database user":
        return f"ALTER ROLE {role} IN DATABASE {db} RESET {setting};"
    return f"ALTER SYSTEM SET {setting} = {value}; SELECT pg_reload_conf();"


def _schema_findings(cur: psycopg.Cursor, connector: ConnectorConfig, destination: DestinationConfig, user: str,
                     database: str) -> list[Finding]:
    """CREATE on the control schema and on the connector's destination schemas, or on the database for those that
    do not exist yet (a PostgreSQL source's schemas are its own, unknown here: CREATE on the database is asked)."""
    cur.execute("SELECT has_database_privilege(current_database(), 'CREATE')")
    create_database = cur.fetchone()[0]
    role, db = sql.Identifier(user).as_string(), sql.Identifier(database).as_string()
    schemas, _ = destination_tables(connector)
    findings = []
    for schema in [destination.control_schema, *sorted(schemas or ())]:
        cur.execute("SELECT has_schema_privilege(oid, 'CREATE') AND has_schema_privilege(oid, 'USAGE') "
                    "FROM pg_namespace WHERE nspname = %s", (schema,))
        row = cur.fetchone()
        what = "the control schema" if schema == destination.control_schema else "the destination schema"
        if row is None and not create_database:
            findings.append(_error("privileges", f"{what} {schema} does not exist and the role {user} may not "
                                                 f"create it (no CREATE on database {database})",
                                   f"GRANT CREATE ON DATABASE {db} TO {role};"))
        elif row is not None and not row[0]:
            findings.append(_error("privileges", f"the role {user} lacks USAGE or CREATE on {what} {schema}",
                                   f"GRANT USAGE, CREATE ON SCHEMA {sql.Identifier(schema).as_string()} TO {role};"))
    if schemas is None and not create_database:
        findings.append(_warning("privileges", f"the role {user} may not create schemas (no CREATE on database "
                                               f"{database}): the destination schemas named after the source's must "
                                               "exist, with CREATE on them for it",
                                 f"GRANT CREATE ON DATABASE {db} TO {role};"))
    return findings


def has_run(conn: psycopg.Connection, schema: str, connector: str) -> bool:
    """Whether the connector has a position in the control schema: a Debezium offset, an applied position or a bulk
    snapshot begun. Read without creating the control schema."""
    def exists(table: str) -> bool:
        return conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                            (sql.Identifier(schema, table).as_string(conn),)).fetchone()[0]

    if not exists("debezium_offsets") or not exists("applied_positions"):
        return False
    return (control.has_offset(conn, schema, connector)
            or control.read_applied_offset(conn, schema, connector) is not None
            or (exists("bulk_loads") and bookkeeping.has_load(conn, schema, connector)))


def require_ready(connector: ConnectorConfig, destination: DestinationConfig) -> None:
    """Before a connector's first run (no position in the control schema): runs the check, logs its warnings and
    raises PreflightError naming each error's setting and fix (recorded as the connector's failure, as a failed
    run's error is). Does nothing for a connector that has run."""
    with destination.connect(connector.name, connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
        if has_run(conn, destination.control_schema, connector.name):
            return
    report = check(connector, destination)
    for finding in report.findings:
        if not finding.is_error:
            log.warning("%s: %s %s: %s (fix: %s)", connector.name, finding.where, finding.setting, finding.problem,
                        finding.fix)
    if report.errors:
        error = PreflightError(
            "the first run cannot start: " + "; ".join(f"{finding.where} {finding.setting}: {finding.problem} "
                                                       f"(fix: {finding.fix})" for finding in report.errors)
            + f"; `cdc-pipeline check {connector.name}` lists every finding", connector=connector.name)
        _record_refusal(connector, destination, error)
        raise error


def _record_refusal(connector: ConnectorConfig, destination: DestinationConfig, error: PreflightError) -> None:
    """Records the refused first run as the connector's failure (stopped, its last error naming the settings), as a
    failed run is recorded, when the destination takes it."""
    try:
        with destination.connect(connector.name, connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
            control.ensure_control_schema(conn, destination.control_schema)
            control.record_failure(conn, destination.control_schema, connector, str(error))
    except (psycopg.Error, CdcError) as exc:
        log.warning("%s: the refused first run cannot be recorded in the destination: %s", connector.name, exc)


def format_report(report: Preflight) -> str:
    """The check's findings as the CLI prints them."""
    lines = [f"connector {report.connector} ({report.connector_type}):"]
    for finding in report.findings:
        lines.append(f"  {finding.level:<7} {finding.where} {finding.setting}: {finding.problem}")
        lines.append(f"          fix: {finding.fix}")
    lines += [f"  note: {note}" for note in report.notes]
    errors, warnings = len(report.errors), len(report.findings) - len(report.errors)
    lines.append(f"  {errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"
                 + (": ready for a first run" if not errors else ": fix the errors before the first run"))
    return "\n".join(lines)


def _error(setting: str, problem: str, fix: str) -> Finding:
    return Finding(ERROR, "destination", setting, problem, fix)


def _warning(setting: str, problem: str, fix: str) -> Finding:
    return Finding(WARNING, "destination", setting, problem, fix)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
