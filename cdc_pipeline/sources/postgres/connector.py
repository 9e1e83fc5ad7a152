"""A PostgreSQL source's connector: the Debezium connector's properties (pgoutput, the connector's slot and
publication, the heartbeat), which tables it replicates, and connecting (psycopg for the driver's planning queries,
the JDBC URL Spark's readers use: TLS, timeouts, no idle limit)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote as url_quote, quote_plus, urlencode

from psycopg import sql

from cdc_pipeline.config import ConnectorConfig, KEEPALIVES
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sources.debezium import HEARTBEAT_TOPICS_PROPERTY, heartbeat_interval_ms
from cdc_pipeline.sources.quoting import qualified_double, quote_double

CONNECT_TIMEOUT_SECONDS = 10
CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"


JDBC_DRIVER = "org.postgresql.Driver"

# The source's limits on a session left idle, in a transaction or outside one (PostgreSQL 14 on), and on a
# transaction's length (17 on), which a database or role may set: lifted for the load's own sessions, which wait on
# the copy (a reader between two fetches while Spark writes, the session holding the parts' exported snapshot until
# every part imported it). Through pg_settings, since a server older than a setting refuses its name; the
# connector's statement_timeout still bounds every statement.
LIFT_IDLE_LIMITS = ("SELECT pg_catalog.set_config(name, '0', false) FROM pg_catalog.pg_settings WHERE name IN "
                    "('idle_in_transaction_session_timeout', 'idle_session_timeout', 'transaction_timeout')")


SYSTEM_SCHEMAS = ("pg_catalog", "information_schema", "pg_toast")


def debezium_properties(connector: ConnectorConfig) -> dict[str, str]:
    """The connector properties of a PostgreSQL source (the engine's own are the runner's)."""
    props = {
        "connector.class": CONNECTOR_CLASS,
        "database.dbname": connector.database,
        "database.sslmode": connector.tls_mode,
        "plugin.name": "pgoutput",
        "slot.name": connector.replication_slot,
        "publication.name": connector.replication_slot,
        "publication.autocreate.mode": "filtered",
        # PostgreSQL emits no DDL events: destination tables are derived from the value schemas, which need
        # each column's source type, length and scale to reproduce it.
        "column.propagate.source.type": ".*",
        # Intervals as ISO-8601 text keep months and days apart (the numeric form folds them into microseconds).
        "interval.handling.mode": "string",
        # Debezium's JDBC session sits idle between its queries (the heartbeat's, the schema's): no idle limit of
        # the source's ends it (one statement: Debezium splits the property at semicolons).
        "database.initial.statements": LIFT_IDLE_LIMITS,
    }
    if connector.tls_ca_file:
        props["database.sslrootcert"] = connector.tls_ca_file
    if connector.tables:
        # The heartbeat table is captured (so in the publication, which Debezium keeps to its include list), its
        # rows never applied (`replicates`).
        watched = (*connector.tables, connector.heartbeat_table)
        schemas = dict.fromkeys(connector.split_table(table)[0] for table in watched)
        props["schema.include.list"] = ",".join(re.escape(schema) for schema in schemas if schema)
        props["table.include.list"] = ",".join(re.escape(table) for table in watched)
    props["heartbeat.interval.ms"] = heartbeat_interval_ms(connector)
    props["heartbeat.action.query"] = heartbeat_query(connector)
    # The runner commits a batch of heartbeats itself when nothing waits before it (its own property).
    props[HEARTBEAT_TOPICS_PROPERTY] = f"{connector.name}.{connector.heartbeat_table}"
    return props


def replicates(connector: ConnectorConfig, source_table: str) -> bool:
    """Whether a table (`schema.table`) is one the connector may replicate: any but its heartbeat table, which
    Debezium's heartbeat writes so that the slot is confirmed (it is no data)."""
    return source_table != connector.heartbeat_table


def heartbeat_query(connector: ConnectorConfig) -> str:
    """The statement Debezium's heartbeat runs on the source: it writes the connector's row of the heartbeat table,
    a change of the publication that the engine receives after any WAL of other tables, so that committing its
    offset confirms the slot past that WAL."""
    return sql.SQL("INSERT INTO {} (slot_name, beat_at) VALUES ({}, now()) "
                   "ON CONFLICT (slot_name) DO UPDATE SET beat_at = EXCLUDED.beat_at").format(
        sql.Identifier(*connector.split_table(connector.heartbeat_table)),
        sql.Literal(connector.replication_slot)).as_string()


quote = quote_double
qualified = qualified_double


def connect(connector: ConnectorConfig) -> Any:
    """A psycopg connection to the connector's source database for the planning queries (never rows), in
    autocommit so that no idle transaction holds back the source's vacuum or a schema change."""
    import psycopg

    try:
        conn = psycopg.connect(host=connector.hostname, port=connector.port, user=connector.user,
                               password=connector.password.reveal(), dbname=connector.database,
                               connect_timeout=CONNECT_TIMEOUT_SECONDS, autocommit=True,
                               application_name=f"cdc-pipeline {connector.name}", **tls_parameters(connector),
                               options=session_options(connector), **KEEPALIVES)
        try:
            # A load holds its planning session, and the one exporting its parts' snapshot, idle while it copies.
            conn.execute(LIFT_IDLE_LIMITS)
        except BaseException:
            conn.close()
            raise
        return conn
    except psycopg.Error as exc:
        # psycopg's messages name the host and the server's words, never the password.
        raise CdcError(f"cannot connect to the source {connector.hostname}:{connector.port}: "
                       f"{str(exc).strip().splitlines()[0]}", connector=connector.name) from None


def tls_parameters(connector: ConnectorConfig) -> dict[str, str]:
    """The connector's `tls_mode` and `tls_ca_file` as libpq's and pgjdbc's parameters (both take the same)."""
    parameters = {"sslmode": connector.tls_mode}
    if connector.tls_ca_file:
        parameters["sslrootcert"] = connector.tls_ca_file
    return parameters


def session_options(connector: ConnectorConfig) -> str:
    """The source sessions' lock and statement timeouts, as the `options` parameter libpq and pgjdbc take."""
    return (f"-c lock_timeout={int(connector.source_lock_timeout_seconds * 1000)}ms "
            f"-c statement_timeout={int(connector.source_statement_timeout_seconds * 1000)}ms")


def jdbc_url(connector: ConnectorConfig) -> str:
    """The JDBC URL Spark's readers use (its PostgreSQL dialect: double-quoted names, a cursor per read), with the
    connector's TLS, its source timeouts and TCP keepalives."""
    parameters = {**tls_parameters(connector), "options": session_options(connector), "tcpKeepAlive": "true"}
    return (f"jdbc:postgresql://{connector.hostname}:{connector.port}/{quote_plus(connector.database)}?"
            + urlencode(parameters, quote_via=url_quote))
