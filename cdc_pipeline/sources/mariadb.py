"""What the pipeline knows of MariaDB and MySQL sources: the Debezium connector's properties (its class, server id,
TLS trust store, binlog keep-alive and value handling), connecting, quoting, the binlog (positions, the change
check's scan), and reading tables for the bulk snapshot (their columns and keys, chunk boundaries, the SQL that
renders each column as text, and the binlog position of a consistent snapshot), and the preflight check of a source (its binlog settings and the
capture user's privileges).

A bulk read renders every column in the source as text in a form the destination's COPY reads back exactly (numbers
and dates as MariaDB writes them, binaries and geometry as hex, TIMESTAMP as UTC microseconds), so no value passes
through a JDBC type that could round it; Spark then makes the COPY lines (`column_text`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import zlib
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from time import monotonic
from typing import Any, Callable, Sequence
from urllib.parse import quote as url_quote

from pyspark.sql import Column
from pyspark.sql import functions as F

from cdc_pipeline.config import ConnectorConfig, pattern_regex
from cdc_pipeline.copy_text import (ESCAPES, FIELD_BYTEA, FIELD_DATE, FIELD_PLAIN, FIELD_TEXT, NULL_TEXT, copy_escape,
                                    ewkb_hex)
from cdc_pipeline.errors import CdcError, RunnerError
from cdc_pipeline.sources.change_check import ChangeCheck, SourceLag
from cdc_pipeline.sources.finding import Finding, source_error, source_warning
from cdc_pipeline.sources.lost_position import LostPosition
from cdc_pipeline.sources.debezium import HEARTBEAT_TOPICS_PROPERTY
from cdc_pipeline.sources.source_index import IndexColumn, SourceIndex
from cdc_pipeline.sources.table import ColumnText, SourceTable
from cdc_pipeline.sources.type_choice import TypeChoice, column_number
from cdc_pipeline.sources.offset_shape import FLAG, INT, TEXT, OffsetShape

CONNECT_TIMEOUT_SECONDS = 10
CONNECTOR_CLASSES = {"mariadb": "io.debezium.connector.mariadb.MariaDbConnector",
                     "mysql": "io.debezium.connector.mysql.MySqlConnector"}
# Debezium's default. The binlog client's keep-alive thread counts a reader that has read nothing for this long as a
# lost connection, and a reader held by back-pressure (the pipeline applying a group) reads nothing: at 5 s, a pause
# of 10 s made it tear the connection down and re-read the source's transaction from its start, over and over.
KEEP_ALIVE_INTERVAL_MS = 60_000
OFFSET_SHAPE = OffsetShape(
    required={"file": TEXT, "pos": INT},
    optional={"row": INT, "event": INT, "gtids": TEXT, "ts_sec": INT, "server_id": INT, "snapshot": FLAG,
              "snapshot_completed": FLAG, "transaction_id": TEXT},
    example='{"file": "mariadb-bin.000003", "pos": 4512, "row": 0, "event": 1}',
)
JDBC_DRIVER = "org.mariadb.jdbc.Driver"
# A chunk read under its own consistent snapshot (a table without a key is one chunk): its first row carries the
# binlog position of that snapshot, which MariaDB gives exactly (`binlog_snapshot_file` / `_position`).
SESSION_INIT = None  # the readers' sessions need no setting
CONSISTENT_SNAPSHOT = "START TRANSACTION WITH CONSISTENT SNAPSHOT"
DDL_EVENTS = True  # the schema snapshot and the stream carry each table's DDL

_STRING_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "json"})
_PADDED_TYPES = frozenset({"char", "enum", "set"})
_BINARY_TYPES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
GEOMETRY_TYPES = frozenset({"geometry", "point", "linestring", "polygon", "multipoint", "multilinestring",
                             "multipolygon", "geometrycollection"})
_BIT_LENGTH = re.compile(r"bit\((\d+)\)")


# The source types' columns to PostgreSQL's, by type name (convert/typemap.py reads them).
MYSQL_TYPE_MAP: dict[str, str] = {
    # BOOL is TINYINT(1): it holds -128..127, and a snapshot reads it as tinyint(1) (SHOW CREATE TABLE), so a
    # table created while streaming gets the type its snapshot would give it.
    "BOOL": "smallint",
    "BOOLEAN": "smallint",
    "TINYINT": "smallint",
    "TINYINT UNSIGNED": "smallint",
    "SMALLINT": "smallint",
    "SMALLINT UNSIGNED": "integer",
    "MEDIUMINT": "integer",
    "MEDIUMINT UNSIGNED": "integer",
    "INT": "integer",
    "INT UNSIGNED": "bigint",
    "INTEGER": "integer",
    "INTEGER UNSIGNED": "bigint",
    "BIGINT": "bigint",
    "BIGINT UNSIGNED": "numeric(20,0)",
    "DECIMAL": "numeric(p,s)",
    "NUMERIC": "numeric(p,s)",
    "FLOAT": "real",
    "DOUBLE": "double precision",
    "REAL": "double precision",
    "BIT": "bit(n)",
    "CHAR": "character(n)",
    "VARCHAR": "character varying(n)",
    "TINYTEXT": "text",
    "TEXT": "text",
    "MEDIUMTEXT": "text",
    "LONGTEXT": "text",
    "BINARY": "bytea",
    "VARBINARY": "bytea",
    "TINYBLOB": "bytea",
    "BLOB": "bytea",
    "MEDIUMBLOB": "bytea",
    "LONGBLOB": "bytea",
    "DATE": "date",
    "TIME": "interval",
    "DATETIME": "timestamp(fsp) without time zone",
    "TIMESTAMP": "timestamp(fsp) with time zone",
    "YEAR": "integer",
    "JSON": "jsonb",
    "ENUM": "text",
    "SET": "text",
    "GEOMETRY": "bytea",
    "POINT": "bytea",
    "LINESTRING": "bytea",
    "POLYGON": "bytea",
    "MULTIPOINT": "bytea",
    "MULTILINESTRING": "bytea",
    "MULTIPOLYGON": "bytea",
    "GEOMETRYCOLLECTION": "bytea",
}

# MariaDB's JSON is LONGTEXT with a json_valid CHECK; a snapshot reports it as LONGTEXT, so mapping the
# JSON name to text keeps one destination type whenever the table was captured, and keeps the text verbatim.
MARIADB_TYPE_MAP: dict[str, str] = {**MYSQL_TYPE_MAP, "JSON": "text"}

MYSQL_TYPE_ALIASES: dict[str, str] = {
    "INT1": "TINYINT",
    "INT2": "SMALLINT",
    "INT3": "MEDIUMINT",
    "MIDDLEINT": "MEDIUMINT",
    "INT4": "INT",
    "INT8": "BIGINT",
    "DEC": "DECIMAL",
    "FIXED": "DECIMAL",
    "FLOAT4": "FLOAT",
    "FLOAT8": "DOUBLE",
    "DOUBLE PRECISION": "DOUBLE",
    "CHARACTER": "CHAR",
    "NCHAR": "CHAR",
    "NATIONAL CHAR": "CHAR",
    "NATIONAL CHARACTER": "CHAR",
    "NVARCHAR": "VARCHAR",
    "CHARACTER VARYING": "VARCHAR",
    "CHAR VARYING": "VARCHAR",
    "NATIONAL VARCHAR": "VARCHAR",
    "LONG": "MEDIUMTEXT",
    "LONG VARCHAR": "MEDIUMTEXT",
    "LONG VARBINARY": "MEDIUMBLOB",
    "SERIAL": "BIGINT UNSIGNED",
}

# The rules the maps above do not show, as the docs print them beside each map.
TYPE_MAP_NOTES: dict[str, list[tuple[str, str]]] = {
    "mariadb": [
        ("BIT(1)", "boolean"),
        ("TINYINT(1)", "smallint (it holds -128..127, so not boolean)"),
        ("DECIMAL without precision", "numeric"),
        ("LONGTEXT with a json_valid CHECK (MariaDB JSON)", "text (verbatim; jsonb would reorder keys)"),
        ("TIME", "interval (MariaDB TIME spans -838:59:59..838:59:59)"),
        ("DATETIME / TIMESTAMP without fsp", "timestamp(0) ..."),
        ("anything else", "text (logged as a warning)"),
    ],
    "mysql": [
        ("BIT(1)", "boolean"),
        ("TINYINT(1)", "smallint (it holds -128..127, so not boolean)"),
        ("DECIMAL without precision", "numeric"),
        ("TIME", "interval (MySQL TIME spans -838:59:59..838:59:59)"),
        ("DATETIME / TIMESTAMP without fsp", "timestamp(0) ..."),
        ("anything else", "text (logged as a warning)"),
    ],
}


TYPE_MAPS: dict[str, dict[str, str]] = {"mariadb": MARIADB_TYPE_MAP, "mysql": MYSQL_TYPE_MAP}
# A NOT NULL column added without a DEFAULT gives the rows already there its type's implicit default (0, '', the
# first ENUM value...), which the destination column takes while it is added (`ColumnDef.implicit_default_sql`).
IMPLICIT_DEFAULTS = True


def column_type(source_type: str, column: dict[str, Any], connector_type: str) -> TypeChoice | None:
    """The destination type of a MariaDB/MySQL column of `source_type` (Debezium's typeName), by the connector type's
    map; None when the map does not know it. `column` is the Debezium column description, read for its length,
    scale and typeExpression: unsigned integers widen to the next type that holds their range."""
    type_map = TYPE_MAPS[connector_type]
    words = source_type.split("(", 1)[0].upper().split()
    expression_words = re.findall(r"[A-Z]+", str(column.get("typeExpression") or "").upper())
    unsigned = any(word in ("UNSIGNED", "ZEROFILL") for word in words + expression_words)
    base = " ".join(word for word in words if word not in ("UNSIGNED", "SIGNED", "ZEROFILL"))
    base = MYSQL_TYPE_ALIASES.get(base, base)
    if base.endswith(" UNSIGNED"):
        base, unsigned = base.removesuffix(" UNSIGNED"), True
    length = column_number(column.get("length"))
    if base == "BIT" and (length is None or length == 1):
        return TypeChoice("boolean")
    if base == "FLOAT" and length is not None and length > 24 and column.get("scale") is None:
        return TypeChoice("double precision")
    template = type_map.get(f"{base} UNSIGNED" if unsigned else base) or type_map.get(base)
    if template is None:
        return None
    if template == "character(n)" and length is None:
        return TypeChoice("character(1)")
    return TypeChoice(template, _fractional_digits(length))


def _fractional_digits(length: int | None) -> int:
    """Debezium gives DATETIME(3) a length of 3; a display width (19 + 1 + digits) is also understood."""
    if length is None or length < 0:
        return 0
    if length <= 6:
        return length
    if length >= 19:
        return min(max(length - 20, 0), 6)
    return 6


def always_nullable(source_type: str) -> bool:
    """Whether a column of `source_type` stays nullable whatever its definition: a TIMESTAMP, which may hold the zero
    date, replicated as NULL."""
    return source_type.split("(", 1)[0].strip().upper() == "TIMESTAMP"


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
        "heartbeat.interval.ms": str(max(1, round(connector.heartbeat_interval_seconds * 1000))),
        HEARTBEAT_TOPICS_PROPERTY: f"{connector.debezium.get('topic.heartbeat.prefix', '__debezium-heartbeat')}."
                                   f"{connector.name}",
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


def source_partition(connector: str, database: str) -> dict[str, str]:
    """Debezium's source partition of the connector's offsets: the connector's name (its topic prefix)."""
    return {"server": connector}


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


def names_database(connector: ConnectorConfig, statement: str) -> bool:
    """Whether a statement of the binlog (`use `db`; ALTER TABLE ...`) may concern one of the connector's databases:
    it holds the name of its `database`, or a word or quoted name `databases` matches."""
    if connector.database is not None:
        return connector.database in statement
    return any(connector.captures_database(quoted.replace("``", "`") or word)
               for quoted, word in _STATEMENT_NAMES.findall(statement))


_STATEMENT_NAMES = re.compile(r"`((?:[^`]|``)+)`|([\w$]+)")


def quote_mysql(identifier: str) -> str:
    """A MariaDB/MySQL identifier in backquotes, embedded backquotes doubled."""
    return "`" + identifier.replace("`", "``") + "`"


quote = quote_mysql


def qualified(database: str, table: str) -> str:
    return quote_mysql(database) + "." + quote_mysql(table)


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


@dataclass(frozen=True)
class SourceColumn:
    """A source column as information_schema describes it."""

    name: str
    data_type: str
    column_type: str
    nullable: bool

    @property
    def bit_length(self) -> int:
        match = _BIT_LENGTH.match(self.column_type)
        return int(match.group(1)) if match else 1


def tables_of(cur: Any, connector: ConnectorConfig) -> list[SourceTable]:
    """The base tables of the connector's databases (the include list filters them); of `databases`, read in one
    query for all the server's databases."""
    if connector.database is not None:
        return list_tables(cur, connector.database)
    cur.execute("SELECT table_schema, table_name, COALESCE(table_rows, 0), COALESCE(avg_row_length, 0) "
                "FROM information_schema.tables WHERE table_type = 'BASE TABLE' ORDER BY table_schema, table_name")
    return [SourceTable(f"{database}.{name}", int(rows), int(size)) for database, name, rows, size in cur.fetchall()
            if str(database).lower() not in SYSTEM_SCHEMAS and connector.captures_database(str(database))]


def list_tables(cur: Any, database: str, table: str | None = None) -> list[SourceTable]:
    """The database's base tables (or the one named `table`), with InnoDB's estimate of their rows and average row
    size."""
    cur.execute("SELECT table_name, COALESCE(table_rows, 0), COALESCE(avg_row_length, 0) FROM information_schema.tables "
                "WHERE table_schema = %s AND table_type = 'BASE TABLE' AND (%s IS NULL OR table_name = %s) "
                "ORDER BY table_name", (database, table, table))
    return [SourceTable(f"{database}.{name}", int(rows), int(size)) for name, rows, size in cur.fetchall()]


def create_statements(cur: Any, database: str, tables: Sequence[str]) -> list[str]:
    """Each table's CREATE TABLE as the server writes it (`SHOW CREATE TABLE`), for a parse as the stream's DDL."""
    statements = []
    for table in tables:
        cur.execute("SHOW CREATE TABLE " + qualified(database, table))
        statements.append(str(cur.fetchone()[1]))
    return statements


def list_columns(cur: Any, database: str, table: str) -> list[SourceColumn]:
    cur.execute("SELECT column_name, LOWER(data_type), LOWER(column_type), is_nullable = 'YES' "
                "FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                "ORDER BY ordinal_position", (database, table))
    return [SourceColumn(name, data_type, column_type, bool(nullable))
            for name, data_type, column_type, nullable in cur.fetchall()]


def chunk_key(cur: Any, database: str, table: str) -> list[str]:
    """The columns chunks are split by: the primary key, else the first unique key of NOT NULL columns; [] when the
    table has neither (it is read as one chunk)."""
    return table_definitions(cur, database, [table]).get(table, ([], []))[1]


def table_definitions(cur: Any, database: str,
                      tables: Sequence[str]) -> dict[str, tuple[list[SourceColumn], list[str]]]:
    """Each named table's columns (as `list_columns` reads them) and chunk key (as `chunk_key` chooses it), read in
    two queries for all of them; a table the source does not have is left out."""
    if not tables:
        return {}
    names = tuple(tables)
    cur.execute("SELECT table_name, column_name, LOWER(data_type), LOWER(column_type), is_nullable = 'YES' "
                "FROM information_schema.columns WHERE table_schema = %s AND table_name IN %s "
                "ORDER BY table_name, ordinal_position", (database, names))
    columns: dict[str, list[SourceColumn]] = {}
    for table, name, data_type, column_type, nullable in cur.fetchall():
        columns.setdefault(table, []).append(SourceColumn(name, data_type, column_type, bool(nullable)))
    cur.execute("SELECT table_name, index_name, column_name FROM information_schema.statistics "
                "WHERE table_schema = %s AND table_name IN %s AND non_unique = 0 "
                "ORDER BY table_name, index_name <> 'PRIMARY', index_name, seq_in_index", (database, names))
    keys: dict[str, dict[str, list[str]]] = {}
    for table, index, column in cur.fetchall():
        keys.setdefault(table, {}).setdefault(index, []).append(column)
    definitions = {}
    for table, table_columns in columns.items():
        not_null = {column.name for column in table_columns if not column.nullable}
        key = next((key for key in keys.get(table, {}).values() if not_null.issuperset(key)), [])
        definitions[table] = (table_columns, key)
    return definitions


_INDEX_METHODS = {"BTREE": "btree", "HASH": "btree"}
"""information_schema.STATISTICS.INDEX_TYPE of a secondary index PostgreSQL rebuilds, and the access method it
gets there (a HASH index of a MEMORY table serves equality, which a B-tree serves too, and ordering)."""


def secondary_indexes(cur: Any, database: str, tables: Sequence[str]) -> list[SourceIndex]:
    """The non-unique indexes of the named tables, in one query. A prefix (`SUB_PART`) indexes the whole column
    on PostgreSQL; FULLTEXT and SPATIAL indexes, and expression parts (MySQL's functional key parts), are
    `skipped`."""
    if not tables:
        return []
    cur.execute("SELECT table_name, index_name, column_name, collation = 'D', UPPER(index_type) "
                "FROM information_schema.statistics WHERE table_schema = %s AND table_name IN %s AND non_unique = 1 "
                "ORDER BY table_name, index_name, seq_in_index", (database, tuple(tables)))
    parts: dict[tuple[str, str], list[tuple[str | None, bool, str]]] = {}
    for table, index, column, descending, index_type in cur.fetchall():
        parts.setdefault((table, index), []).append((column, bool(descending), index_type))
    indexes = []
    for (table, index), columns in parts.items():
        index_type = columns[0][2]
        method = _INDEX_METHODS.get(index_type, "")
        skipped = None
        if not method:
            skipped = f"a {index_type} index"
        elif any(column is None for column, _, _ in columns):
            skipped = "an expression in its key"
        indexes.append(SourceIndex(table, index, method, tuple(
            IndexColumn(column or "", descending) for column, descending, _ in columns), skipped))
    return indexes


def key_value(value: Any) -> Any:
    """A key value as JSON keeps it (for the chunk's stored bounds): bytes as {"hex": ...}, the rest as text or a
    number."""
    if isinstance(value, (bytes, bytearray)):
        return {"hex": bytes(value).hex()}
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, (Decimal, float, datetime, date, time, timedelta)):
        return str(value)
    return value


def literal(value: Any) -> str:
    """A stored key value as a MariaDB literal (the chunk predicates are SQL text Spark sends as it is)."""
    if isinstance(value, dict):
        return "X'" + str(value["hex"]) + "'"
    if isinstance(value, int):
        return str(value)
    text = str(value).replace("\\", "\\\\").replace("'", "''").replace("\0", "\\0")
    return "'" + text + "'"


def _from(columns: Sequence[str], bound: Sequence[Any], strict: bool) -> str:
    """Rows whose key is after `bound` (or at it, unless strict), lexicographically over the key's columns."""
    terms = []
    for i, column in enumerate(columns):
        equal = [f"{quote_mysql(c)} = {literal(v)}" for c, v in zip(columns[:i], bound[:i])]
        last = i == len(columns) - 1
        operator = (">" if strict else ">=") if last else ">"
        terms.append("(" + " AND ".join([*equal, f"{quote_mysql(column)} {operator} {literal(bound[i])}"]) + ")")
    return "(" + " OR ".join(terms) + ")"


def chunk_predicate(columns: Sequence[str], lower: Sequence[Any] | None, upper: Sequence[Any] | None) -> str:
    """The WHERE text of the chunk [lower, upper) over the key columns (None: unbounded)."""
    parts = []
    if lower is not None:
        parts.append(_from(columns, lower, strict=False))
    if upper is not None:
        parts.append("NOT " + _from(columns, upper, strict=False))
    return " AND ".join(parts) or "1 = 1"


def next_chunk_start(cur: Any, database: str, table: str, key: Sequence[str], lower: Sequence[Any] | None,
                     rows: int) -> list[Any] | None:
    """The key `rows` rows after `lower` in key order (an index range scan): where the next chunk starts; None when
    fewer rows remain (the chunk from `lower` is the last)."""
    where = "" if lower is None else " WHERE " + _from(key, lower, strict=False)
    order = ", ".join(map(quote_mysql, key))
    # PyMySQL has no identifier composition like psycopg.sql: names are backquoted by quote_mysql, values are
    # literals of the source's own key values (`literal`).
    query = f"SELECT {order} FROM {qualified(database, table)}{where} ORDER BY {order} LIMIT 1 OFFSET {int(rows)}"
    cur.execute(query)
    row = cur.fetchone()
    return None if row is None else [key_value(value) for value in row]


def select_text(column: SourceColumn, pg_type: str) -> str:
    """The SQL that renders the column as text for `column_text` (NULL stays NULL)."""
    name = quote_mysql(column.name)
    if column.data_type in _PADDED_TYPES:
        # Spark pads what JDBC calls CHAR(n) (ENUM and SET too) to n characters; as VARCHAR it reads the value.
        return f"CAST({name} AS CHAR)"
    if column.data_type in _STRING_TYPES:
        return name
    if column.data_type in _BINARY_TYPES:
        return f"HEX({name})"
    if column.data_type == "bit":
        return f"BIN({name})"
    if column.data_type == "timestamp":
        # UNIX_TIMESTAMP reads TIMESTAMP's stored UTC value whatever the session's time zone; 0 is a zero date.
        return f"CAST(UNIX_TIMESTAMP({name}) * 1000000 AS CHAR)"
    if column.data_type in GEOMETRY_TYPES:
        if pg_type == "point":
            return f"CONCAT('(', ST_X({name}), ',', ST_Y({name}), ')')"
        return f"CONCAT(ST_SRID({name}), ';', HEX(ST_AsWKB({name})))"
    return f"CAST({name} AS CHAR)"


def _utf8(*codes: int) -> str:
    """A string of these characters (below 128) in SQL that does not depend on the server's escape settings (sql_mode
    NO_BACKSLASH_ESCAPES) and has the collation the converted values have: a hex literal with the utf8mb4
    introducer, a constant (`CHAR(... USING utf8mb4)` was evaluated again for every row: a quarter of the server's
    CPU in a bulk load of rows of two text columns)."""
    assert all(0 <= code < 128 for code in codes)
    return "_utf8mb4 X'" + "".join(f"{code:02x}" for code in codes) + "'"


def copy_field_sql(column: SourceColumn, pg_type: str) -> tuple[str, int] | None:
    """The SQL that selects the column for the bulk snapshot's writer and how the writer makes it a COPY text field
    (`copy_text.FIELD_*`: escaped, a zero date as NULL, or as it is), or None where only Spark renders it (a SET as
    an array, a TIMESTAMP, a geometry other than a point). The server sends text values in the connection's
    character set, utf8mb4, whatever the column's."""
    value = select_text(column, pg_type)
    kind = column.data_type
    if kind == "set" and pg_type.endswith("[]") or kind == "timestamp" or (kind in GEOMETRY_TYPES
                                                                           and pg_type != "point"):
        return None
    if kind in _STRING_TYPES:
        return value, FIELD_TEXT
    if kind in _BINARY_TYPES:
        # The bytes, not HEX(): a hex string twice the value's size would be NULL past max_allowed_packet.
        return quote_mysql(column.name), FIELD_BYTEA
    if kind == "bit" and column.bit_length > 1:
        return f"LPAD({value}, {column.bit_length}, '0')", FIELD_PLAIN
    if kind in ("date", "datetime"):
        return value, FIELD_DATE
    return value, FIELD_PLAIN


def copy_text_sql(column: SourceColumn, pg_type: str) -> str | None:
    """The SQL that renders the column's whole COPY text field (escaped, `\\N` for NULL) in the source, as the
    bulk snapshot's writer does from `copy_field_sql`'s value and as `column_text` does from `select_text`'s, or None
    where only Spark renders it. Verify compares the destination's rows with these."""
    field = copy_field_sql(column, pg_type)
    if field is None:
        return None
    text, how = field
    if how == FIELD_TEXT:
        text = f"REPLACE(CONVERT({text} USING utf8mb4), {_utf8(0)}, '')"
        for char, escape in ESCAPES:  # as `copy_escape` replaces them
            text = f"REPLACE({text}, {_utf8(ord(char))}, {_utf8(*map(ord, escape))})"
    elif how == FIELD_DATE:
        text = f"IF({text} LIKE '0000-00-00%', NULL, {text})"
    elif how == FIELD_BYTEA:
        text = f"CONCAT({_utf8(92, 92, 120)}, LOWER(HEX({text})))"
    return f"COALESCE({text}, {_utf8(92, 78)})"


def copy_line_sql(fields: Sequence[str]) -> str:
    """One COPY text line from fields `copy_text_sql` rendered (tab-separated)."""
    return f"CONCAT({f', {_utf8(9)}, '.join(fields)})"


def column_text(value: Column, column: SourceColumn, pg_type: str) -> Column:
    """The COPY text of a value `select_text` rendered, for a destination column of type `pg_type` (`\\N` for
    NULL): Spark's part of the conversion, the same rules as the stream's (dml.py) for what Debezium sends."""
    kind = column.data_type
    if kind == "set" and pg_type.endswith("[]"):
        # A SET's members (no member holds a comma) as an array literal, for an array column (of an enum, say).
        members = F.transform(F.split(value, ","), lambda member: F.concat(
            F.lit('"'), F.regexp_replace(member, r'(["\\])', r"\\$1"), F.lit('"')))
        text = copy_escape(F.when(value == "", F.lit("{}")).otherwise(
            F.concat(F.lit("{"), F.array_join(members, ","), F.lit("}"))))
    elif kind in _STRING_TYPES:
        text = copy_escape(value)
    elif kind in _BINARY_TYPES:
        text = F.concat(F.lit("\\\\x"), F.lower(value))
    elif kind == "bit":
        text = F.lpad(value, column.bit_length, "0") if column.bit_length > 1 else value
    elif kind in ("date", "datetime"):
        text = F.when(~value.startswith("0000-00-00"), value)
    elif kind == "timestamp":
        micros = value.cast("decimal(30,6)").cast("long")
        instant = F.concat(F.date_format(F.timestamp_micros(micros), "yyyy-MM-dd HH:mm:ss.SSSSSS"), F.lit("+00"))
        text = F.when(micros != 0, instant)  # 0: a zero date, written as NULL (see `zero_dates`)
    elif kind in GEOMETRY_TYPES and pg_type != "point":
        srid, wkb = F.split_part(value, F.lit(";"), F.lit(1)), F.split_part(value, F.lit(";"), F.lit(2))
        if pg_type == "bytea":
            text = F.concat(F.lit("\\\\x"), ewkb_hex(F.lower(wkb), srid.cast("long")))
        else:
            text = F.concat(F.when(srid != "0", F.concat(F.lit("SRID="), srid, F.lit(";"))).otherwise(F.lit("")), wkb)
        text = F.when(value.isNotNull(), text)
    else:
        text = value
    return F.coalesce(text, F.lit(NULL_TEXT))


def zero_dates(values: dict[str, Column], columns: Sequence[SourceColumn]) -> Column:
    """How many zero dates of a row are written as NULL and counted as such: those of NOT NULL TIMESTAMP columns,
    as on the stream's path (Debezium reads a nullable one as NULL already, a NOT NULL one as the epoch)."""
    zeros = [F.when(values[column.name].cast("decimal(30,6)") == 0, 1).otherwise(0) for column in columns
             if column.data_type == "timestamp" and not column.nullable]
    total = F.lit(0)
    for zero in zeros:
        total = total + zero
    return total.cast("int")


def snapshot_position_select(position_alias: str, aliases: Sequence[str]) -> str:
    """The first row of a chunk read under a consistent snapshot: the snapshot's binlog position as JSON, then one
    NULL per data column (named as the data columns are)."""
    nulls = "".join(f", NULL AS {alias}" for alias in aliases)
    return ("SELECT JSON_OBJECT('file', MAX(IF(variable_name = 'BINLOG_SNAPSHOT_FILE', variable_value, NULL)), "
            "'pos', MAX(IF(variable_name = 'BINLOG_SNAPSHOT_POSITION', variable_value, NULL))) AS " + position_alias
            + nulls + " FROM information_schema.session_status WHERE variable_name LIKE 'BINLOG\\_SNAPSHOT\\_%'")


def require_snapshot_position(cur: Any, connector: ConnectorConfig, source_table: str) -> None:
    """Refuses to load a keyless table from a server that cannot tell the binlog position of a consistent
    snapshot: MariaDB gives it as the session's `binlog_snapshot_file` / `binlog_snapshot_position`
    (`snapshot_position_select`); MySQL has no such status (nor `information_schema.session_status`), and its own
    ways (a global read lock held while the snapshot starts and `performance_schema.log_status` is read) are not
    built. The stream's position check needs it to replay neither too much nor too little into a keyless table."""
    cur.execute("SHOW SESSION STATUS LIKE 'binlog\\_snapshot\\_file'")
    if cur.fetchall():
        return
    raise CdcError(
        f"the bulk snapshot reads a table without a primary or unique NOT NULL key ({source_table}) under one "
        "consistent snapshot and needs that snapshot's binlog position, which this server does not give "
        "(MariaDB's binlog_snapshot_file; MySQL has none): give the table a primary key, or copy the rows with "
        "Debezium's snapshot (snapshot_engine: debezium)", connector=connector.name, table=source_table)


def before_snapshot(offset: dict[str, Any] | None, position: dict[str, Any]) -> bool:
    """Whether a streamed event (its Debezium offset) belongs to a transaction committed before the snapshot whose
    binlog position is `position`: its transaction starts (`pos`, where Debezium restarts it) before that
    position, in the same or an earlier binlog file."""
    if not offset or "snapshot" in offset or "file" not in offset or "pos" not in offset:
        return False
    return _file_order(str(offset["file"]), int(offset["pos"])) < _file_order(str(position["file"]),
                                                                                 int(position["pos"]))


def stream_passed(offset: dict[str, Any] | None, position: dict[str, Any]) -> bool:
    """Whether a streamed event (its Debezium offset), or a position the source was read at, is at or past the
    binlog position `position`: every transaction written before that position came earlier in the stream."""
    return offset is not None and "snapshot" not in offset and position_reached(offset, position)


def position_reached(offset: dict[str, Any] | None, position: dict[str, Any]) -> bool:
    """Whether an event's Debezium offset, a snapshot's included, is at or past the binlog position `position`."""
    if not offset or "file" not in offset or "pos" not in offset:
        return False
    return _file_order(str(offset["file"]), int(offset["pos"])) >= _file_order(str(position["file"]),
                                                                                  int(position["pos"]))


def load_end_position(cur: Any) -> dict[str, Any]:
    """Where the source is now, as `stream_passed` compares it: its binlog position."""
    return binlog_position(cur)


def _file_order(file_name: str, pos: int) -> tuple[int, str, int]:
    """A binlog position's sort key: the file's number (a name without one, such as the empty name a binlog reader
    started from a GTID position has before the server's first rotate event, sorts before every numbered file)."""
    suffix = file_name.rsplit(".", 1)[-1]
    return (int(suffix), "", pos) if suffix.isdigit() else (-1, file_name, pos)


def parse_position(text: str | None) -> dict[str, Any] | None:
    return None if text is None else json.loads(text)


def binlog_position(cur: Any) -> dict[str, Any]:
    """The source's current binlog file and position (where its next event will be written)."""
    try:
        cur.execute("SHOW MASTER STATUS")
    except Exception:  # MySQL 8.4 renamed it
        cur.execute("SHOW BINARY LOG STATUS")
    row = cur.fetchone()
    if row is None:
        raise CdcError("the source writes no binary log (log_bin is off)")
    return {"file": str(row[0]), "pos": int(row[1])}


_TABLE_MAP = re.compile(r"table_id: \d+ \((.*)\)$")
# The event that begins each transaction, and each statement outside one (MariaDB writes a GTID event before every
# event group; MySQL 5.7 and later a GTID event, or an anonymous one when GTIDs are off).
_TRANSACTION_STARTS = ("Gtid", "Anonymous_Gtid")
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
    if _file_order(file, pos) >= _file_order(end_file, end_pos):
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
                if kind in _TRANSACTION_STARTS:
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


def check_position(offset: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """Where a streaming offset lies, so that the change check is given the engine's stored offset when it is later
    than the last applied event's (`pending.checked_offset`): Debezium's heartbeat moves it on through other
    databases' events, and a run's engine may have started past it (`resume_offset`)."""
    if not offset or "snapshot" in offset or "file" not in offset or "pos" not in offset:
        return None
    return (*_file_order(str(offset["file"]), int(offset["pos"])), int(offset.get("event") or 0),
            int(offset.get("row") or 0))


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
    if _between_transactions(applied) and _file_order(str(applied["file"]), int(applied["pos"])) \
            > _file_order(str(start["file"]), int(start["pos"])):
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


# Events a transaction boundary may hold: a transaction's first (`_TRANSACTION_STARTS`), or a binlog file's own.
_BOUNDARY_EVENTS = (*_TRANSACTION_STARTS, "Format_desc", "Rotate", "Gtid_list", "Binlog_checkpoint", "Previous_gtids",
                    "Stop")


def resume_offset(connector: ConnectorConfig, checked: Any, offset: dict[str, Any] | None) -> dict[str, Any] | None:
    """The Debezium offset a run's engine starts from instead of its stored streaming `offset` (the last change it
    captured, or the last heartbeat committed), or None to keep that one: `checked`, the position a change check or
    an idle run recorded (every change before it is applied), when it is past `offset` in the same binlog, on the
    server still, and a transaction's boundary. On a busy server the engine then reads only what the checks have not
    read, instead of every other database's events since the connector's last change.

    The offset gets the GTID position there when the stored one has GTIDs: MariaDB's `BINLOG_GTID_POS(file, pos)`,
    which must not be behind the stored offset's in any domain (else the binlog was reset, or is another server's,
    and the engine meets that itself). MySQL has no such function: an offset with a GTID set (gtid_mode ON) is kept,
    and its heartbeats move it on; one without (gtid_mode OFF) is a file and position, which is all it needs."""
    start = json.loads(checked) if isinstance(checked, str) else checked
    if not start or not offset or "snapshot" in offset or "file" not in offset or "pos" not in offset:
        return None
    file, pos = str(start["file"]), int(start["pos"])
    stored = (str(offset["file"]), int(offset["pos"]))
    if file.rpartition(".")[0] != stored[0].rpartition(".")[0] or _file_order(file, pos) <= _file_order(*stored):
        return None
    gtids = offset.get("gtids")
    if gtids and connector.type == "mysql":
        return None
    import pymysql

    try:
        with connect(connector) as source, source.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            if file not in {str(row[0]) for row in cur.fetchall()}:
                return None
            end = binlog_position(cur)
            if _file_order(file, pos) > _file_order(end["file"], end["pos"]):
                return None
            cur.execute("SHOW BINLOG EVENTS IN %s FROM %s LIMIT 1", (file, pos))
            event = cur.fetchone()
            if event is not None and str(event[2]) not in _BOUNDARY_EVENTS:
                return None
            moved: dict[str, Any] = {"file": file, "pos": pos}
            if gtids:
                cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, pos))
                there = cur.fetchone()[0]
                if not there or not _gtids_reached(str(there), str(gtids)):
                    return None
                moved["gtids"] = str(there)
    except pymysql.MySQLError as exc:
        raise CdcError(f"cannot read the binlog at the checked position {file}:{pos} to start the engine there: {exc}",
                       connector=connector.name, position=offset) from None
    if offset.get("server_id") is not None:
        moved["server_id"] = offset["server_id"]
    return moved


def _gtids_reached(position: str, other: str) -> bool:
    """Whether the MariaDB GTID position `position` (domain-server-sequence, comma-separated) is at or past
    `other` in every domain of `other`."""
    def sequences(text: str) -> dict[str, int]:
        parts = (gtid.strip().split("-") for gtid in text.split(",") if gtid.strip())
        return {part[0]: int(part[-1]) for part in parts if len(part) == 3 and part[-1].isdigit()}

    here = sequences(position)
    return all(domain in here and here[domain] >= sequence for domain, sequence in sequences(other).items())


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
                key=lambda p: _file_order(p["file"], p["pos"]))
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



def lost_position(connector: ConnectorConfig, offset: dict[str, Any], captured: Callable[[str], bool]
                  ) -> LostPosition | None:
    """What the binlog no longer holds of the engine's stored `offset` (`file`, `pos`, `gtids`), or None when it
    holds the offset: its file is on the server and reaches `pos`, or (the file purged: Debezium resumes by GTID when
    the offset has GTIDs) the GTIDs of the oldest binlog's start are all at or before the offset's and none of the
    offset's is past the server's binlog (MySQL: `@@gtid_purged` is within the offset's GTIDs). Debezium's own
    `when_needed` compares MariaDB GTIDs with `@@gtid_binlog_state`, which a purge does not shrink."""
    if "file" not in offset or "pos" not in offset or offset.get("snapshot"):
        return None
    file, gtids = str(offset["file"]), str(offset.get("gtids") or "")
    position = f"{file}:{offset['pos']}" + (f" (GTID {gtids})" if gtids else "")
    with connect(connector) as source, source.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        sizes = {str(row[0]): int(row[1]) for row in cur.fetchall()}
        if not sizes or sizes.get(file, -1) >= int(offset["pos"]):
            return None
        oldest = next(iter(sizes))
        if connector.type == "mysql":
            return _mysql_lost_position(cur, position, gtids, oldest)
        return _mariadb_lost_position(cur, position, gtids, oldest)


_MARIADB_GTID = re.compile(r"(\d+)-\d+-(\d+)")


def mariadb_gtid_domains(text: str) -> dict[int, int]:
    """A MariaDB GTID list (`0-1-57,1-2-9`, or a Gtid_list event's `[0-1-57]`) as the highest sequence number of
    each replication domain."""
    domains: dict[int, int] = {}
    for domain, seq in _MARIADB_GTID.findall(text):
        domains[int(domain)] = max(domains.get(int(domain), 0), int(seq))
    return domains


def _mariadb_lost_position(cur: Any, position: str, gtids: str, oldest: str) -> LostPosition | None:
    cur.execute("SHOW BINLOG EVENTS IN %s LIMIT 4", (oldest,))
    begins_text = next((str(info) for _log, _pos, kind, _server, _next, info in cur.fetchall()
                        if kind == "Gtid_list"), "")
    begins = mariadb_gtid_domains(begins_text)
    held = f"its oldest binlog is {oldest}" + (f", which begins after GTID {begins_text.strip('[]')}" if begins
                                               else "")
    if not gtids:
        return LostPosition(position, held)
    at = mariadb_gtid_domains(gtids)
    if any(at.get(domain, 0) < seq for domain, seq in begins.items()):
        return LostPosition(position, held)
    cur.execute("SELECT @@global.gtid_binlog_state")
    state_text = str(cur.fetchone()[0] or "")
    state = mariadb_gtid_domains(state_text)
    if any(seq > state.get(domain, 0) for domain, seq in at.items()):
        return LostPosition(position, f"its binlog, from {oldest} on, holds GTIDs up to {state_text or 'none'} only: "
                                      "it was reset (RESET MASTER) or is another server's")
    return None


def _mysql_lost_position(cur: Any, position: str, gtids: str, oldest: str) -> LostPosition | None:
    held = f"its oldest binlog is {oldest}"
    if not gtids:
        return LostPosition(position, held)
    cur.execute("SELECT @@global.gtid_purged")
    missing = mysql_gtids_missing(str(cur.fetchone()[0] or ""), gtids)
    if not missing:
        return None
    return LostPosition(position, f"{held}, and it purged GTIDs {missing} the connector never read")


def _mysql_gtid_set(text: str) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """A MySQL GTID set (`uuid:1-5:7,uuid2[:tag]:1-3`) as its intervals per source (uuid and tag)."""
    intervals: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for part in "".join(text.split()).split(","):
        if not part:
            continue
        uuid, *items = part.split(":")
        tag = ""
        for item in items:
            first, _, last = item.partition("-")
            if not first.isdigit():
                tag = item
                continue
            intervals.setdefault((uuid.lower(), tag), []).append((int(first), int(last or first)))
    return intervals


def mysql_gtids_missing(purged: str, read: str) -> str:
    """The GTIDs of `purged` outside `read` (MySQL GTID sets), as text; empty when `read` holds all of them."""
    held = _mysql_gtid_set(read)
    missing = []
    for (uuid, tag), ranges in _mysql_gtid_set(purged).items():
        covered = sorted(held.get((uuid, tag), []))
        for first, last in ranges:
            start = first
            for low, high in covered:
                if low <= start <= high:
                    start = high + 1
            if start <= last:
                missing.append(f"{uuid}{':' + tag if tag else ''}:{start}-{last}")
    return ",".join(missing)


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
        return ColumnText(f"COALESCE({micros}, {_utf8(92, 78)})",
                          sql.SQL("round(extract(epoch FROM {}) * 1000000)::bigint::text").format(value),
                          how="as UTC microseconds")
    source = copy_text_sql(column, pg_type)
    if source is None:
        return ColumnText(left_out=f"{kind} is rendered by Spark only")
    digits = _fraction_digits(column)
    if kind in ("date", "datetime"):
        # A date with a zero month or day (a zero date too) is written as NULL, as the stream writes it.
        name = quote_mysql(column.name)
        source = f"IF(MONTH({name}) = 0 OR DAYOFMONTH({name}) = 0, {_utf8(92, 78)}, {source})"
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
