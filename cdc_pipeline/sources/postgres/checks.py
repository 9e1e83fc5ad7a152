"""A PostgreSQL source's checks: the slot's state and the WAL it retains, the change check (the slot peeked, nothing
consumed), the lag behind the WAL, row counts, the preflight check of a source (logical decoding, the capture role,
slots, senders, the publication, the heartbeat table), and verify's SQL."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from psycopg import sql

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.sources.change_check import ChangeCheck, SourceLag
from cdc_pipeline.sources.finding import Finding, source_error, source_warning
from cdc_pipeline.sources.postgres.connector import SYSTEM_SCHEMAS, connect, qualified
from cdc_pipeline.sources.postgres.positions import lsn_text
from cdc_pipeline.sources.postgres.snapshot import SourceColumn, copy_text_sql
from cdc_pipeline.sources.table import ColumnText

# A slot that keeps more WAL than this is shown with a warning (a paused or stopped connector keeps it all).
RETAINED_WAL_WARNING_BYTES = 1 << 30


def slot_status(connector: ConnectorConfig) -> dict[str, Any] | None:
    """The connector's replication slot as the source sees it: the WAL it retains (bytes, from its restart LSN),
    whether a run holds it, and PostgreSQL's `wal_status` (`lost` once `max_slot_wal_keep_size` removed WAL it
    needed); None when the slot does not exist."""
    with connect(connector) as source:
        row = source.execute(
            "SELECT slot_name, active, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, wal_status, "
            "safe_wal_size FROM pg_replication_slots WHERE slot_name = %s", (connector.replication_slot,)).fetchone()
    if row is None:
        return None
    retained = int(row[2] or 0)
    status = {"slot": row[0], "active": bool(row[1]), "retained_wal_bytes": retained, "wal_status": row[3],
              "safe_wal_size": row[4]}
    if retained > RETAINED_WAL_WARNING_BYTES or row[3] in ("unreserved", "lost"):
        status["warning"] = (f"the slot retains {retained >> 20} MB of WAL on the source (wal_status {row[3]}): "
                             "resume or run the connector, or bound it with max_slot_wal_keep_size "
                             "(docs/triggers.md)")
    return status


def replication_lag(connector: ConnectorConfig, checked: Any, applied: dict[str, Any]) -> SourceLag | None:
    """How far the WAL goes past the connector's replication slot: `pg_wal_lsn_diff` of the current WAL position
    and the slot's confirmed position (what the connector has not confirmed as applied); None when the slot does
    not exist."""
    with connect(connector) as source:
        row = source.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, confirmed_flush_lsn::text, "
            "pg_current_wal_lsn()::text FROM pg_replication_slots WHERE slot_name = %s",
            (connector.replication_slot,)).fetchone()
    if row is None:
        return None
    return SourceLag(bytes=max(0, int(row[0] or 0)), position=f"slot {connector.replication_slot} at {row[1]}",
                     source_position=str(row[2]))


def row_counts(connector: ConnectorConfig, captured: Callable[[str], bool]) -> dict[str, int]:
    """The rows of each table of the source database that `captured` accepts (`schema.table`: rows)."""
    with connect(connector) as conn:
        rows = conn.execute("SELECT table_schema, table_name FROM information_schema.tables "
                            "WHERE table_type = 'BASE TABLE' AND NOT table_schema = ANY(%s)",
                            (list(SYSTEM_SCHEMAS),)).fetchall()
        return {f"{schema}.{table}": conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                    sql.Identifier(schema, table))).fetchone()[0]
                for schema, table in rows if captured(f"{schema}.{table}")}


# pgoutput's change messages (insert, update, delete, truncate); a peek may also return BEGIN, COMMIT and
# RELATION messages, which alone are no change.
_PGOUTPUT_CHANGES = (ord("I"), ord("U"), ord("D"), ord("T"))
SLOT_PEEK_MESSAGES = 512


@dataclass(frozen=True)
class SlotPeek:
    """What the connector's slot holds after the last change applied, seen without consuming it."""

    active: bool  # a run holds the slot: it cannot be peeked
    messages: int  # messages peeked, at most SLOT_PEEK_MESSAGES
    changes: int  # of which changes of the publication after the applied LSN
    unconfirmed_wal_bytes: int = 0  # WAL after the slot's confirmed position (what a run can let the source remove)
    # The WAL written before the peek was all flushed, so the peek decoded it (a commit under synchronous_commit=off
    # may wait up to wal_writer_delay): else a change committed just before may not have been seen.
    flushed: bool = True


def peek_slot(connector: ConnectorConfig, applied_lsn: int) -> SlotPeek | None:
    """Peeks the connector's slot (`pg_logical_slot_peek_binary_changes`, nothing consumed) for changes of its
    publication after `applied_lsn`; None when the slot does not exist. The slot is confirmed up to the last change
    Debezium processed, not past its transaction's commit, so the transaction applied last is decoded again."""
    slot = connector.replication_slot
    with connect(connector) as source:
        row = source.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
        if row is None:
            return None
        if row[0]:
            return SlotPeek(active=True, messages=0, changes=0)
        flushed = source.execute("SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()").fetchone()[0]
        # A change message names its table's oid in bytes 2-5; the heartbeat table's changes are no work.
        peeked = source.execute(
            "SELECT count(*), count(*) FILTER (WHERE get_byte(data, 0) = ANY(%s) AND lsn > %s::pg_lsn "
            "AND substring(data FROM 2 FOR 4) IS DISTINCT FROM int4send(to_regclass(%s)::oid::int4)) "
            "FROM pg_logical_slot_peek_binary_changes(%s, NULL, %s, 'proto_version', '1', 'publication_names', %s)",
            (list(_PGOUTPUT_CHANGES), lsn_text(applied_lsn), qualified(*connector.split_table(connector.heartbeat_table)),
             slot, SLOT_PEEK_MESSAGES, slot)).fetchone()
        unconfirmed = source.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint FROM pg_replication_slots "
            "WHERE slot_name = %s", (slot,)).fetchone()
    return SlotPeek(active=False, messages=int(peeked[0]), changes=int(peeked[1]),
                    unconfirmed_wal_bytes=int(unconfirmed[0] or 0) if unconfirmed else 0, flushed=bool(flushed))


def check_changes(connector: ConnectorConfig, checked: Any, applied: dict[str, Any],
                  captured: Callable[[str], bool]) -> ChangeCheck:
    """The change check: whether the connector's slot holds a change of its publication after the last one
    `applied` (peeked, nothing consumed), or more WAL after its confirmed position than `retained_wal_run_mb` (a run
    confirms the slot past it). Decoding reads the WAL flushed: with `synchronous_commit=off` a change shows within
    `wal_writer_delay`."""
    slot = connector.replication_slot
    peeked = peek_slot(connector, int(applied.get("lsn") or 0))
    if peeked is None:
        return ChangeCheck(True, f"replication slot {slot} does not exist yet")
    if peeked.active:
        return ChangeCheck(False, f"replication slot {slot} is in use", known=False)
    if peeked.changes or peeked.messages >= SLOT_PEEK_MESSAGES:
        return ChangeCheck(True, f"replication slot {slot} holds changes of publication {slot}")
    unconfirmed_mb = peeked.unconfirmed_wal_bytes >> 20
    if unconfirmed_mb >= connector.retained_wal_run_mb:
        # Only other tables were written: a run confirms the slot past their WAL (the heartbeat), and the source
        # may remove it.
        return ChangeCheck(True, f"replication slot {slot} holds {unconfirmed_mb} MB of unconfirmed WAL "
                                 f"(retained_wal_run_mb {connector.retained_wal_run_mb})")
    if not peeked.flushed:
        return ChangeCheck(False, f"replication slot {slot} holds no change of the WAL flushed; WAL written since is "
                                  "not flushed yet (synchronous_commit=off)", known=False)
    return ChangeCheck(False, f"replication slot {slot} holds no change ({unconfirmed_mb} MB of unconfirmed WAL)",
                       reached_end=True)


def preflight(connector: ConnectorConfig) -> list[Finding]:
    """What the source lacks for the connector to run: `wal_level = logical`, a capture role with REPLICATION (or a
    superuser), a free replication slot unless the connector's own exists, a free WAL sender, the publication (or
    the right to create it as Debezium's `publication.autocreate.mode` does: `_publication_findings`), the
    heartbeat table (or CREATE on its schema) and SELECT on the captured tables; a warning
    when `max_slot_wal_keep_size` leaves the slot's WAL unbounded. Each finding carries the statement that fixes it.
    Raises CdcError when the source cannot be reached."""
    with connect(connector) as source, source.cursor() as cur:
        cur.execute("SELECT current_user, rolsuper, rolreplication, current_setting('wal_level'), "
                    "current_setting('max_replication_slots')::int, current_setting('max_wal_senders')::int, "
                    "current_setting('max_slot_wal_keep_size', true), "
                    "has_database_privilege(current_database(), 'CREATE') "
                    "FROM pg_roles WHERE rolname = current_user")
        user, superuser, replication, wal_level, max_slots, max_senders, keep_size, create_db = cur.fetchone()
        role = sql.Identifier(user).as_string()
        findings = []
        if wal_level != "logical":
            findings.append(source_error(
                "wal_level", f"wal_level is {wal_level}, and logical decoding needs logical",
                "ALTER SYSTEM SET wal_level = logical; then restart the server"))
        if not (superuser or replication):
            findings.append(source_error(
                "replication", f"the capture role {user} has neither REPLICATION nor superuser",
                f"ALTER ROLE {role} WITH REPLICATION; (and a `replication` line for it in pg_hba.conf if the server "
                "restricts replication connections)"))
        findings += _slot_findings(cur, connector, max_slots, max_senders)
        if keep_size in ("-1", None):
            findings.append(source_warning(
                "max_slot_wal_keep_size", "max_slot_wal_keep_size is -1: a paused or stopped connector's slot "
                                          "keeps WAL without bound, until the source's disk is full",
                "ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; SELECT pg_reload_conf(); (a size the source's "
                "disk holds; a slot that falls further behind is lost and the connector needs a new snapshot)"))
        tables = _captured_tables(cur, connector)
        findings += _publication_findings(cur, connector, role, superuser, create_db, tables)
        findings += _heartbeat_findings(cur, connector, role)
        unreadable = [table for table, readable, _ in tables if not readable]
        if unreadable:
            findings.append(source_error(
                "privileges", f"the capture role {user} cannot SELECT {_listed(unreadable)}, which the snapshot reads",
                f"GRANT SELECT ON {', '.join(_quoted(table, connector) for table in unreadable)} TO {role};"))
    return findings


def _slot_findings(cur: Any, connector: ConnectorConfig, max_slots: int, max_senders: int) -> list[Finding]:
    """A slot for the connector (its own, in this database, or a free one) and a WAL sender to stream from it."""
    slot = connector.replication_slot
    cur.execute("SELECT database, plugin FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    own = cur.fetchone()
    findings = []
    if own is not None and (own[0] != connector.database or own[1] != "pgoutput"):
        findings.append(source_error(
            "replication slot", f"a slot named {slot} exists for database {own[0]} with plugin {own[1]}, and the "
                                f"connector needs one of database {connector.database} with pgoutput",
            f"SELECT pg_drop_replication_slot({sql.Literal(slot).as_string()}); (if nothing else uses it)"))
    if own is None:
        cur.execute("SELECT count(*) FROM pg_replication_slots")
        used = int(cur.fetchone()[0])
        if used >= max_slots:
            findings.append(source_error(
                "max_replication_slots", f"max_replication_slots is {max_slots} and {used} slots exist: the "
                                         f"connector cannot create its slot {slot}",
                f"ALTER SYSTEM SET max_replication_slots = {used + 1}; then restart the server (or drop a slot "
                "nothing uses: SELECT pg_drop_replication_slot('name');)"))
    cur.execute("SELECT count(*) FROM pg_stat_replication")
    senders = int(cur.fetchone()[0])
    if senders >= max_senders:
        findings.append(source_error(
            "max_wal_senders", f"max_wal_senders is {max_senders} and {senders} are in use: the connector's "
                               "stream gets none",
            f"ALTER SYSTEM SET max_wal_senders = {senders + 1}; then restart the server"))
    return findings


def _captured_tables(cur: Any, connector: ConnectorConfig) -> list[tuple[str, bool, bool]]:
    """The connector's tables that exist on the source (`schema.table`), each with whether the capture role may
    SELECT it and whether it owns it."""
    wanted = set(connector.tables)
    cur.execute("SELECT n.nspname || '.' || c.relname, has_table_privilege(c.oid, 'SELECT'), "
                "pg_has_role(c.relowner, 'USAGE') "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relkind IN ('r', 'p') AND n.nspname <> ALL(%s) AND n.nspname NOT LIKE 'pg\\_temp\\_%%' "
                "ORDER BY 1", (list(SYSTEM_SCHEMAS),))
    return [(name, readable, owned) for name, readable, owned in cur.fetchall()
            if (not wanted or name in wanted) and name != connector.heartbeat_table]


def _publication_findings(cur: Any, connector: ConnectorConfig, role: str, superuser: bool, create_db: bool,
                          tables: list[tuple[str, bool, bool]]) -> list[Finding]:
    """The connector's publication (named as its slot), by Debezium's `publication.autocreate.mode`: `filtered` (the
    pipeline's) creates it FOR TABLE when the connector starts, which needs CREATE on the database and owning the
    tables, and sets its table list again on later starts, which needs owning it; `all_tables` creates it FOR ALL
    TABLES, which needs a superuser; `disabled` needs it to exist."""
    name = connector.replication_slot
    mode = connector.debezium.get("publication.autocreate.mode", "filtered")
    cur.execute("SELECT pg_has_role(pubowner, 'USAGE') FROM pg_publication WHERE pubname = %s", (name,))
    row = cur.fetchone()
    publication = sql.Identifier(name).as_string()
    listed = [table for table, _, _ in tables] + [connector.heartbeat_table]
    create = (f"CREATE PUBLICATION {publication} FOR TABLE "
              f"{', '.join(_quoted(table, connector) for table in listed)};")
    if row is None and mode == "disabled":
        return [source_error("publication", f"the publication {name} does not exist, and Debezium does not create it "
                                            "(publication.autocreate.mode is disabled)",
                             f"as the tables' owner or a superuser: {create}")]
    if superuser or mode not in ("filtered", "all_tables"):
        return []
    if row is not None:
        if row[0] or mode != "filtered":
            return []
        return [source_warning(
            "publication", f"the publication {name} exists and the capture role does not own it: Debezium sets its "
                           "table list when the connector starts, which only its owner may",
            f"ALTER PUBLICATION {publication} OWNER TO {role};")]
    if mode == "all_tables":
        return [source_error("publication", f"the publication {name} does not exist, and only a superuser may create "
                                            "it FOR ALL TABLES (publication.autocreate.mode is all_tables)",
                             f"as a superuser: CREATE PUBLICATION {publication} FOR ALL TABLES;")]
    findings = []
    if not create_db:
        findings.append(source_error(
            "publication", f"the publication {name} does not exist and the capture role may not create it "
                           f"(no CREATE on database {connector.database})",
            f"GRANT CREATE ON DATABASE {sql.Identifier(connector.database).as_string()} TO {role};"))
    foreign = [table for table, _, owned in tables if not owned]
    if foreign:
        findings.append(source_error(
            "publication", f"the publication {name} does not exist and the capture role may not add "
                           f"{_listed(foreign)} to it (a publication's tables must be the role's own)",
            f"as their owner or a superuser: {create} ALTER PUBLICATION {publication} OWNER TO {role};"))
    return findings


def _heartbeat_findings(cur: Any, connector: ConnectorConfig, role: str) -> list[Finding]:
    """The heartbeat table (`ensure_heartbeat_table` creates it), which the capture role writes."""
    schema, table = connector.split_table(connector.heartbeat_table)
    cur.execute("SELECT to_regclass(%s) IS NOT NULL, has_schema_privilege(%s, 'CREATE') "
                "FROM pg_namespace WHERE nspname = %s", (qualified(schema, table), schema, schema))
    row = cur.fetchone()
    target = sql.Identifier(schema, table).as_string()
    if row is not None and row[0]:
        cur.execute("SELECT has_table_privilege(%s, 'INSERT, UPDATE')", (qualified(schema, table),))
        if cur.fetchone()[0]:
            return []
        return [source_error("heartbeat table", f"the capture role may not write the heartbeat table "
                                                f"{connector.heartbeat_table}",
                             f"GRANT SELECT, INSERT, UPDATE ON {target} TO {role};")]
    if row is not None and row[1]:
        return []
    return [source_error(
        "heartbeat table", f"the heartbeat table {connector.heartbeat_table} does not exist and the capture role may "
                           f"not create it in schema {schema}",
        f"CREATE TABLE {target} (slot_name text PRIMARY KEY, beat_at timestamptz NOT NULL); "
        f"GRANT SELECT, INSERT, UPDATE ON {target} TO {role};")]


def _listed(tables: list[str], shown: int = 5) -> str:
    more = f" and {len(tables) - shown} more" if len(tables) > shown else ""
    return ", ".join(tables[:shown]) + more


def _quoted(table: str, connector: ConnectorConfig) -> str:
    return sql.Identifier(*connector.split_table(table)).as_string()


def verify_text(column: SourceColumn, pg_type: str, value: Any) -> ColumnText:
    """How verify compares the column (`value`: the destination column, as psycopg SQL): the source renders the COPY
    text field the bulk snapshot writes (`copy_text_sql`), the destination its own text output of the value, under
    the same session settings (`verify_session`)."""
    return ColumnText(copy_text_sql(column, pg_type), sql.SQL("{}::text").format(value))


def row_hash_sql(line: str) -> str:
    """A row's hash for verify: the first 60 bits of the MD5 of its line (UTF-8), as an integer."""
    return f"('x' || substr(md5({line}), 1, 15))::bit(60)::bigint"


# The text output verify's renderings depend on, the same in the source's session and the destination's.
VERIFY_SESSION = ("SET bytea_output = 'hex'", "SET IntervalStyle = 'postgres'", "SET extra_float_digits = 3",
                  "SET TimeZone = 'UTC'", "SET DateStyle = 'ISO, YMD'")


def verify_session(cur: Any) -> None:
    """Pins the session's text output for verify's renderings (also run in the destination's session)."""
    for statement in VERIFY_SESSION:
        cur.execute(statement)


def estimated_rows(cur: Any, source_tables: Sequence[str]) -> list[tuple[str, Any]]:
    """Each table's rows (`schema.table`, rows) as pg_class.reltuples estimates them, in one query."""
    cur.execute("SELECT n.nspname || '.' || c.relname, c.reltuples::bigint FROM pg_catalog.pg_class c "
                "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relkind IN ('r', 'p') AND n.nspname || '.' || c.relname = ANY(%s)",
                (list(source_tables),))
    return cur.fetchall()
