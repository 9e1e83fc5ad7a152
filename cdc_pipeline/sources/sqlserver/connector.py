"""How the pipeline meets a SQL Server source: the Debezium connector's properties, the tables it replicates, and the
checks' own connection through pymssql (no JVM), with SQL Server's quoting of names."""

from __future__ import annotations

from typing import Any, Callable

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sources.change_check import driver_words, read_source
from cdc_pipeline.sources.debezium import topic_heartbeat_properties

CONNECTOR_CLASS = "io.debezium.connector.sqlserver.SqlServerConnector"
CONNECT_TIMEOUT_SECONDS = 10


def debezium_properties(connector: ConnectorConfig) -> dict[str, str]:
    """The connector properties of a SQL Server source (the engine's own are the runner's); TLS through
    `debezium:` properties.

    - `time.precision.mode=microseconds`: every time and timestamp as microseconds (`MicroTime`, `MicroTimestamp`),
      all PostgreSQL keeps. The runner's `adaptive_time_microseconds` would send datetime2(7) as a `NanoTimestamp`,
      a 64-bit count of nanoseconds that cannot hold a value before 1677-09-21 or after 2262-04-11: Debezium's
      `NanoTimestamp.toEpochNanos` fails the connector on one (datetime2 spans 0001..9999).
    The runner's other shared properties keep values exact: `decimal.handling.mode=precise` (money, decimal(38,s)),
    `binary.handling.mode=bytes`."""
    props = {"connector.class": CONNECTOR_CLASS, "database.names": connector.database, "database.encrypt": "false",
             "time.precision.mode": "microseconds"}
    props.update(topic_heartbeat_properties(connector))
    return props


def replicates(connector: ConnectorConfig, source_table: str) -> bool:
    """Every table a SQL Server connector reports may be replicated: Debezium reads only the change tables of the
    connector's database (`database.names`)."""
    return True


def is_heartbeat_table(connector: ConnectorConfig, source_table: str) -> bool:
    """No table is the heartbeat's: SQL Server's heartbeat is a record on the connector's heartbeat topic, written to
    no table."""
    return False


def quote(identifier: str) -> str:
    """A SQL Server identifier in brackets, embedded closing brackets doubled."""
    return "[" + identifier.replace("]", "]]") + "]"


def qualified(schema: str, table: str) -> str:
    return quote(schema) + "." + quote(table)


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


def read_server(connector: ConnectorConfig, reads: Callable[[Any], Any]) -> Any:
    """`reads(cursor)` on a connection to the connector's source, closed after; pymssql's errors as CdcError."""
    import pymssql

    return read_source(connector, connect, pymssql.Error, reads)
