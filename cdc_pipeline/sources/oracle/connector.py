"""How the pipeline meets an Oracle source: the Debezium connector's properties, the tables it replicates, and the
checks' own connection through python-oracledb in thin mode (no client libraries, no JVM), into the connector's
pluggable database, with Oracle's quoting of names."""

from __future__ import annotations

from typing import Any, Callable

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sources.change_check import driver_words, read_source
from cdc_pipeline.sources.quoting import qualified_double, quote_double
from cdc_pipeline.sources.debezium import topic_heartbeat_properties

CONNECTOR_CLASS = "io.debezium.connector.oracle.OracleConnector"
CONNECT_TIMEOUT_SECONDS = 10


def debezium_properties(connector: ConnectorConfig) -> dict[str, str]:
    """The connector properties of an Oracle source (the engine's own are the runner's).

    - `lob.enabled=true`: CLOB, NCLOB and BLOB values are captured (by default Debezium leaves LOB columns out of its
      events, and the destination would hold NULL); an UPDATE that does not change a LOB sends Debezium's placeholder
      for it, which the apply never writes (`convert.dml.unavailable_placeholder`).
    - `interval.handling.mode=string`: INTERVAL YEAR TO MONTH as ISO-8601 years and months
      (`OracleValueConverters.convertOracleIntervalYearMonth`); the default (`numeric`) turns a month into 30.4375
      days of microseconds (`MicroDuration.DAYS_PER_MONTH_AVG`), which PostgreSQL's interval would keep as days.
    - `time.precision.mode=microseconds`: DATE and TIMESTAMP(n) as microseconds (`MicroTimestamp`), all PostgreSQL
      keeps. The runner's `adaptive_time_microseconds` would send TIMESTAMP(7-9) as a `NanoTimestamp`, which cannot
      hold a value before 1677-09-21 or after 2262-04-11 (Debezium's `NanoTimestamp.toEpochNanos` fails the
      connector on one; Oracle's span 4712 BC..9999).
    The runner's shared properties keep numbers exact (`decimal.handling.mode=precise`: NUMBER as decimals,
    NUMBER without precision as `VariableScaleDecimal`).
    """
    props = {"connector.class": CONNECTOR_CLASS, "database.dbname": connector.database, "lob.enabled": "true",
             "interval.handling.mode": "string", "time.precision.mode": "microseconds"}
    props.update(topic_heartbeat_properties(connector))
    return props


def replicates(connector: ConnectorConfig, source_table: str) -> bool:
    """Every table an Oracle connector reports may be replicated: the connector's `tables` list is the only filter."""
    return True


def is_heartbeat_table(connector: ConnectorConfig, source_table: str) -> bool:
    """No table is the heartbeat's: Oracle's heartbeat is a record on the connector's heartbeat topic, written to
    no table."""
    return False


# An Oracle identifier in double quotes (as the dictionary spells it), embedded quotes doubled; OWNER.TABLE.
quote = quote_double
qualified = qualified_double


def connect(connector: ConnectorConfig) -> Any:
    """A python-oracledb connection (thin mode) to the connector's database service, for the checks' reads (never
    rows). A call that runs longer than `source_statement_timeout_seconds` fails."""
    import oracledb

    try:
        conn = oracledb.connect(user=connector.user, password=connector.password.reveal(), host=connector.hostname,
                                port=connector.port, service_name=connector.database,
                                tcp_connect_timeout=CONNECT_TIMEOUT_SECONDS)
    except oracledb.Error as exc:
        raise CdcError(f"cannot connect to the source {connector.hostname}:{connector.port}: "
                       f"{driver_words(exc, connector)}", connector=connector.name) from None
    conn.call_timeout = int(connector.source_statement_timeout_seconds * 1000)
    return conn


def read_server(connector: ConnectorConfig, reads: Callable[[Any], Any]) -> Any:
    """`reads(cursor)` on a connection to the connector's source, closed after; python-oracledb's errors as
    CdcError."""
    import oracledb

    return read_source(connector, connect, oracledb.Error, reads)


def pdb_name(connector: ConnectorConfig) -> str | None:
    """The connector's pluggable database (`database.pdb.name`), or None outside a container database."""
    return connector.debezium.get("database.pdb.name") or None


def enter_pdb(cur: Any, connector: ConnectorConfig) -> None:
    """Into the connector's pluggable database (`database.pdb.name`), where its tables are, as Debezium does."""
    pdb = pdb_name(connector)
    if pdb:
        cur.execute(f"ALTER SESSION SET CONTAINER = {quote(pdb.upper())}")
