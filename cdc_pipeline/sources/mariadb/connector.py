"""A MariaDB/MySQL source's connector: the Debezium connector's properties (its class, server id, TLS trust store,
binlog keep-alive and value handling), which tables it replicates and which databases it covers, and connecting
(PyMySQL for the driver's planning queries, the JDBC URL Spark's readers use: TLS, timeouts)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import quote as url_quote

from cdc_pipeline.config import ConnectorConfig, pattern_regex
from cdc_pipeline.errors import CdcError, RunnerError
from cdc_pipeline.sources.debezium import topic_heartbeat_properties
from cdc_pipeline.sources.quoting import qualified_mysql, quote_mysql

CONNECT_TIMEOUT_SECONDS = 10
# Debezium's MariaDB and MySQL connectors, whose tasks tell the runner whether records they polled are still on
# their way to it (`TaskPolls` in the runner's Java module): the stream's idle end waits for them.
CONNECTOR_CLASSES = {"mariadb": "io.cdcpipeline.runner.MariaDbRunnerConnector",
                     "mysql": "io.cdcpipeline.runner.MySqlRunnerConnector"}
# Debezium's default. The binlog client's keep-alive thread counts a reader that has read nothing for this long as a
# lost connection, and a reader held by back-pressure (the pipeline applying a group) reads nothing: at 5 s, a pause
# of 10 s made it tear the connection down and re-read the source's transaction from its start, over and over.
KEEP_ALIVE_INTERVAL_MS = 60_000


JDBC_DRIVER = "org.mariadb.jdbc.Driver"


def debezium_properties(connector: ConnectorConfig) -> dict[str, str]:
    """The connector properties of a MariaDB or MySQL source (the engine's own are the runner's)."""
    return {
        "connector.class": CONNECTOR_CLASSES[connector.type],
        "database.server.id": _server_id(connector.name),
        # A list of regular expressions, each matched against a whole database name: `databases` (shell-style
        # patterns) in Debezium's regular expressions, or `database` as it is spelled.
        "database.include.list": ",".join(pattern_regex(pattern) for pattern in connector.database_patterns),
        **_binlog_tls(connector),
        "connect.timeout.ms": "10000",
        # The binlog client's keep-alive thread reconnects a lost binlog connection (a source restart) at its next
        # check, one to two intervals after the loss (`source_lost_timeout_seconds` waits longer).
        "connect.keep.alive.interval.ms": str(KEEP_ALIVE_INTERVAL_MS),
        # BIGINT UNSIGNED up to 18446744073709551615 as an exact decimal, not a wrapped-around long.
        "bigint.unsigned.handling.mode": "precise",
        # The MariaDB JDBC driver reads YEAR as a date by default and fails the snapshot on YEAR 0000.
        "driver.yearIsDateType": "false",
        # The server has already made two-digit years four-digit; Debezium's adjuster would turn a DATE or
        # DATETIME in year 69 into 2069.
        "enable.time.adjuster": "false",
        # The source type tells MariaDB/MySQL's TIMESTAMP, whose epoch value can only be a zero date, from others.
        "column.propagate.source.type": ".*",
        # Debezium's heartbeat carries the reader's position while it reads other databases' events, which no record
        # of the connector's own does: the runner commits a batch of heartbeats itself, so a run that ends on its
        # budget on a busy server leaves the next one further on.
        **topic_heartbeat_properties(connector),
    }


# Debezium's names of the TLS modes (`tls_mode`) of its binlog connectors.
_BINLOG_TLS_MODES = {
    "mariadb": {"disable": "disable", "require": "trust", "verify-ca": "verify-ca", "verify-full": "verify-full"},
    "mysql": {"disable": "disabled", "require": "required", "verify-ca": "verify_ca", "verify-full": "verify_identity"},
}
TRUSTSTORE_PASSWORD = "cdc-pipeline"  # the trust store holds public certificates only


def _binlog_tls(connector: ConnectorConfig) -> dict[str, str]:
    """The TLS properties of a MariaDB/MySQL connector: its mode, and for a verifying mode a trust store made of
    `tls_ca_file` (the binlog client reads a Java key store, not PEM)."""
    props = {"database.ssl.mode": _BINLOG_TLS_MODES[connector.type][connector.tls_mode]}
    if connector.tls_mode.startswith("verify") and connector.tls_ca_file:
        props["database.ssl.truststore"] = str(truststore(Path(connector.tls_ca_file)))
        props["database.ssl.truststore.password"] = TRUSTSTORE_PASSWORD
    return props


def truststore(ca_file: Path) -> Path:
    """A PKCS#12 trust store holding the PEM certificate(s) of `ca_file`, made by the JDK's keytool once per
    content (under ~/.cache/cdc-pipeline/truststores)."""
    content = ca_file.read_bytes()
    directory = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cdc-pipeline" / "truststores"
    store = directory / f"{hashlib.sha256(content).hexdigest()[:24]}.p12"
    if store.exists():
        return store
    directory.mkdir(parents=True, exist_ok=True)
    partial = store.with_suffix(f".{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    keytool = Path(os.environ["JAVA_HOME"]) / "bin" / "keytool" if os.environ.get("JAVA_HOME") else Path("keytool")
    result = subprocess.run([str(keytool), "-importcert", "-noprompt", "-alias", "source-ca", "-file", str(ca_file),
                             "-keystore", str(partial), "-storetype", "PKCS12", "-storepass", TRUSTSTORE_PASSWORD],
                            capture_output=True, text=True)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RunnerError(f"cannot make a trust store of {ca_file}: {(result.stdout + result.stderr).strip()}")
    partial.rename(store)
    return store


def _server_id(name: str) -> str:
    # Binlog clients need a server id unique among the source's replicas; derive a stable one from the name.
    return str(5_400 + zlib.crc32(name.encode()) % 1_000_000)


def replicates(connector: ConnectorConfig, source_table: str) -> bool:
    """Whether a table (`db.table`) is one the connector may replicate: one of its databases (the binlog, and so
    Debezium's schema history, holds every database of the server). The server's own schemas are never one."""
    container, _ = connector.split_table(source_table)
    if connector.database is not None:
        return container == connector.database
    return container.lower() not in SYSTEM_SCHEMAS and connector.captures_database(container)


# The server's own schemas, which no pattern of `databases` matches.
SYSTEM_SCHEMAS = frozenset({"information_schema", "mysql", "performance_schema", "sys"})


def databases_of(cur: Any, connector: ConnectorConfig) -> list[str]:
    """The source databases of the connector that the server has now, by name (its `database`, or the server's
    databases that `databases` matches)."""
    if connector.database is not None:
        return [connector.database]
    cur.execute("SELECT schema_name FROM information_schema.schemata ORDER BY schema_name")
    return [str(name) for (name,) in cur.fetchall()
            if str(name).lower() not in SYSTEM_SCHEMAS and connector.captures_database(str(name))]


quote = quote_mysql
qualified = qualified_mysql


def connect(connector: ConnectorConfig) -> Any:
    """A PyMySQL connection to the connector's source database (the driver's planning queries, never rows); of a
    connector of several `databases`, to the server with no default database (every query names its database).

    In autocommit: a query holds its tables' metadata locks only while it runs, so a schema change on the source
    (which waits for them, and makes every later query wait behind it) is never held up by an idle transaction.
    """
    import pymysql

    # A statement that runs longer, or a server that stops answering, fails the read (no TCP keepalive option).
    statement_timeout = max(1, round(connector.source_statement_timeout_seconds))
    lock_timeout = max(1, round(connector.source_lock_timeout_seconds))
    try:
        return pymysql.connect(host=connector.hostname, port=connector.port, user=connector.user,
                               password=connector.password.reveal(), database=connector.database,
                               connect_timeout=CONNECT_TIMEOUT_SECONDS, charset="utf8mb4", autocommit=True,
                               read_timeout=statement_timeout, write_timeout=statement_timeout,
                               init_command=f"SET SESSION lock_wait_timeout = {lock_timeout}",
                               **_tls_options(connector))
    except pymysql.MySQLError as exc:
        raise CdcError(f"cannot connect to the source {connector.hostname}:{connector.port}: {exc}",
                       connector=connector.name) from exc


def _tls_options(connector: ConnectorConfig) -> dict[str, Any]:
    """PyMySQL's TLS options for the connector's `tls_mode` (require: encrypted, the certificate unchecked; PyMySQL
    refuses a server without TLS then)."""
    if connector.tls_mode == "disable":
        return {"ssl_disabled": True}  # PyMySQL would otherwise take TLS whenever the server offers it
    if connector.tls_mode == "require":
        return {"ssl": {"check_hostname": False}}
    return {"ssl_ca": connector.tls_ca_file, "ssl_verify_cert": True,
            "ssl_verify_identity": connector.tls_mode == "verify-full"}


def jdbc_url(connector: ConnectorConfig) -> str:
    """The JDBC URL Spark's readers use: MariaDB's driver (it reads MySQL servers too) under the `jdbc:mysql:` scheme,
    so that Spark applies its MySQL dialect (backquoted column names: it double-quotes them for a URL it does not
    know, which MariaDB reads as strings)."""
    url = (f"jdbc:mysql://{connector.hostname}:{connector.port}/{connector.database or ''}?permitMysqlScheme"
           f"&tcpKeepAlive=true&socketTimeout={int(connector.source_statement_timeout_seconds * 1000)}"
           f"&sessionVariables=lock_wait_timeout={max(1, round(connector.source_lock_timeout_seconds))}")
    if connector.tls_mode == "disable":
        return url
    # MariaDB Connector/J's names: trust (encrypted, unchecked), verify-ca, verify-full; the CA as a PEM file.
    url += "&sslMode=" + ("trust" if connector.tls_mode == "require" else connector.tls_mode)
    if connector.tls_ca_file:
        url += "&serverSslCert=" + url_quote(connector.tls_ca_file, safe="/")
    return url


def is_heartbeat_table(connector: ConnectorConfig, source_table: str) -> bool:
    """No table: Debezium's MariaDB/MySQL heartbeat is a record of the heartbeat topic only."""
    return False
