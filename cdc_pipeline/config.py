"""The connectors configuration: one YAML file naming the destination PostgreSQL, the Spark cluster and every
source connector.

The file path comes from the ``CDC_PIPELINE_CONFIG`` environment variable (default
``dagster_home/connectors.yaml`` relative to the current directory). String values may reference the
environment as ``${VAR}`` or ``${VAR:-default}`` (``$${`` writes a literal ``${``). ``load_config`` reads
and validates the file in one go (pydantic, one dataclass per section) and raises a single ``ConfigError``
naming the connector and field of the first problem; passwords and the destination DSN are held as ``Secret``
so they never reach a log.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import hmac
import json
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from contextvars import ContextVar
import functools
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Optional

import yaml
from pydantic import ConfigDict, PlainValidator, TypeAdapter, ValidationError, field_validator
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

from cdc_pipeline.errors import ConfigError

logger = logging.getLogger(__name__)

CONFIG_PATH_ENV = "CDC_PIPELINE_CONFIG"
DEFAULT_CONFIG_PATH = Path("dagster_home/connectors.yaml")

CONNECTOR_TYPES = ("mariadb", "mysql", "postgres", "sqlserver", "oracle")
DEFAULT_PORTS: Mapping[str, int] = MappingProxyType(
    {"mariadb": 3306, "mysql": 3306, "postgres": 5432, "sqlserver": 1433, "oracle": 1521}
)
SNAPSHOT_MODES = ("initial", "initial_only", "no_data", "always", "never", "when_needed", "recovery", "schemasync")
ERROR_STRATEGIES = ("exit", "retry", "skip")
# What a run does when the source no longer holds the connector's position (a purged binlog, an invalidated slot,
# change tables cleaned past it): fail, naming the command that recovers, or take a new snapshot by itself.
POSITION_LOST_POLICIES = ("fail", "snapshot")
# How a connector copies the rows that exist when it starts: `spark`, parallel chunked reads and COPY (MariaDB,
# MySQL); `debezium`, Debezium's own snapshot events through the stream's path (every source type).
SNAPSHOT_ENGINES = ("spark", "debezium")
APPLY_COPIERS = ("executors", "driver")
# Set (to anything): the JVM's third-party warnings (ANTLR's version check) are printed; `sync -v` sets it.
THIRD_PARTY_WARNINGS_ENV = "CDC_THIRD_PARTY_WARNINGS"
TLS_MODES = ("disable", "require", "verify-ca", "verify-full")
TLS_SOURCE_TYPES = ("mariadb", "mysql", "postgres")
# The types one connector of which may read several databases (`databases`), and how its destination_schema names
# the database.
MULTI_DATABASE_TYPES = ("mariadb", "mysql")
DATABASE_PLACEHOLDER = "{database}"
TRIGGERS = ("changes", "schedule")
# The change sensor's check of the source (milliseconds of CPU; docs/triggers.md): a change from a quiet source waits
# for it, then for a run's start.
DEFAULT_CHECK_INTERVAL_SECONDS = 5
BULK_SNAPSHOT_TYPES = ("mariadb", "mysql", "postgres")
DEFAULT_SNAPSHOT_CHUNK_ROWS = 50_000
MIN_SNAPSHOT_CHUNK_ROWS = 100
LETTER_CASINGS = ("lowercase", "asis")

SPARK_MASTER_ENV = "CDC_SPARK_MASTER"
DEFAULT_SPARK_MASTER = "local[*]"

DEFAULT_CONTROL_SCHEMA = "cdc"
DEFAULT_SCHEDULE = "* * * * *"
DEFAULT_BATCH_SIZE = 2048
MAX_BATCH_SIZE = 100_000
# Consecutive Debezium batches are joined up to this many events into one Spark job and one transaction.
DEFAULT_APPLY_BATCH_EVENTS = 20_000
MAX_APPLY_BATCH_EVENTS = 1_000_000
# ... and up to this many MB of rows: a group of multi-MB values is a few events, and every buffer of the stream is
# bounded from it (Debezium's queue holds as much, the runner three times as much; docs/configuration.md).
DEFAULT_APPLY_BATCH_MB = 64
MAX_APPLY_BATCH_MB = 4096
DRIVER_MEMORY = "spark.driver.memory"
# The driver's heap when the file's spark.conf sets none: what Spark, Debezium and the schemas need (BASE), and
# PER_BATCH_MB times apply_batch_mb for the rows in flight, each of which is held up to that many times over:
# Debezium's queue and the batch its engine polled, the runner's batches (three groups' worth), and the group being
# applied (its rows, their serialized tasks and the tasks' copies, the COPY lines made of them). With the defaults,
# 1.5 GB: the JVM's resident memory stays under 2 GB (docs/configuration.md, "Memory").
DRIVER_MEMORY_BASE_MB = 512
DRIVER_MEMORY_PER_BATCH_MB = 16


def driver_memory_mb(apply_batch_mb: int) -> int:
    """The driver JVM's heap (MB) for connectors of groups of `apply_batch_mb` MB, unless spark.conf sets one."""
    return DRIVER_MEMORY_BASE_MB + DRIVER_MEMORY_PER_BATCH_MB * apply_batch_mb
DEFAULT_MAX_SECONDS_PER_RUN = 300.0
DEFAULT_IDLE_TIMEOUT_SECONDS = 1.0
# A Dagster run that applied a change streams on until this long passes without another (docs/triggers.md,
# "Freshness": the default is chosen from measured latency against the JVM time it holds).
DEFAULT_LINGER_SECONDS = 30.0
# Past the binlog client's reconnect after a source restart: one to two keep-alive intervals of 60 s, and the connect.
DEFAULT_SOURCE_LOST_TIMEOUT_SECONDS = 150.0
# Dagster run retries of a failed sync run: by default only under error_strategy retry.
DEFAULT_RUN_RETRIES = {"retry": 2}
MAX_RUN_RETRIES = 10
DEFAULT_RETRY_ATTEMPTS = 3
MAX_RETRY_ATTEMPTS = 20
DEFAULT_RETRY_BACKOFF_SECONDS = 1.0
# PostgreSQL sources: the table Debezium's heartbeat writes to, and the unconfirmed WAL that asks for a run.
DEFAULT_HEARTBEAT_TABLE = "public.cdc_heartbeat"
DEFAULT_RETAINED_WAL_RUN_MB = 256
# Failed runs launched again by the change sensor: after check_interval_seconds, doubling, at most this long.
DEFAULT_FAILURE_BACKOFF_MAX_SECONDS = 1800.0
# The freshness check of a connector's table assets fails when the table was not brought up to date for this long.
DEFAULT_FRESHNESS_MINUTES = 60
DEFAULT_VERIFY_SCHEDULE = "0 3 * * *"
# Spark's web UI, when `spark: ui: true`: its first port (Spark takes the next free one when it is in use).
DEFAULT_SPARK_UI_PORT = 4040
POSTGRES_IDENTIFIER_MAX_LENGTH = 63

CONNECTOR_NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,62}")

REDACTED = "***"

# No run waits forever on the destination: a lock it cannot get, or a statement that does not end, fails the run.
DEFAULT_LOCK_TIMEOUT_SECONDS = 60.0
DEFAULT_STATEMENT_TIMEOUT_SECONDS = 1800.0
# TCP keepalives on every destination connection: a dead peer is noticed in about a minute.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
_VARIABLE_REFERENCE = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")
_VARIABLE_BODY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)
_SECRET_PROPERTY = re.compile(r"password|secret|credential", re.IGNORECASE)
_URI_DSN = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<netloc>[^/?#]*)(?P<rest>.*)", re.DOTALL)
_URI_PASSWORD_PARAMETER = re.compile(r"(?P<key>(?:^|[?&])(?:ssl)?password=)[^&#]*", re.IGNORECASE)
_CONNINFO_PASSWORD = re.compile(r"(?P<key>\b(?:ssl)?password\s*=\s*)(?:'(?:[^'\\]|\\.)*'?|\S*)", re.IGNORECASE)


class Secret:
    """A string that never shows itself in repr, str or logs (both give '***'); ``reveal()`` returns the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"Secret holds a string, got {type(value).__name__}")
        self._value = value

    def reveal(self) -> str:
        """Return the secret value; call it only where the value is handed to a driver."""
        return self._value

    def __repr__(self) -> str:
        return REDACTED

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash(self._value)


def redact_dsn(dsn: str) -> str:
    """Return the DSN with its password replaced by '***', for log messages.

    Handles libpq URIs (``postgresql://user:pw@host/db``, including ``?password=`` parameters) and
    key/value conninfo strings (``host=h password=pw``, quoted values included); ``sslpassword`` is hidden
    too. A DSN without a password comes back unchanged.
    """
    uri = _URI_DSN.fullmatch(dsn)
    if uri is None:
        return _CONNINFO_PASSWORD.sub(lambda match: match.group("key") + REDACTED, dsn)
    userinfo, at, hosts = uri.group("netloc").rpartition("@")
    netloc = uri.group("netloc")
    if at and ":" in userinfo:
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{REDACTED}@{hosts}"
    rest = _URI_PASSWORD_PARAMETER.sub(lambda match: match.group("key") + REDACTED, uri.group("rest"))
    return f"{uri.group('scheme')}{netloc}{rest}"


def dsn_secrets(dsn: str) -> list[str]:
    """The password-like values a DSN holds, as written and percent-decoded (longest first), for scrubbing them
    from messages that quote the DSN (a driver's parse error quotes the token it could not read)."""
    from urllib.parse import unquote

    found: list[str] = []
    uri = _URI_DSN.fullmatch(dsn)
    if uri is not None:
        userinfo, at, _ = uri.group("netloc").rpartition("@")
        if at and ":" in userinfo:
            found.append(userinfo.split(":", 1)[1])
        found += [match.group(0)[len(match.group("key")):] for match in _URI_PASSWORD_PARAMETER.finditer(
            uri.group("rest"))]
    else:
        found += [match.group(0)[len(match.group("key")):].strip("'") for match in _CONNINFO_PASSWORD.finditer(dsn)]
    variants = {value for secret in found if secret for value in (secret, unquote(secret))}
    return sorted(variants, key=len, reverse=True)


def scrub(message: str, dsn: str) -> str:
    """The message with the DSN's passwords (as written or decoded) replaced by '***'."""
    for secret in dsn_secrets(dsn):
        message = message.replace(secret, REDACTED)
    return message


def _invalid(detail: str, *, child: str | int | None = None, connector: str | None = None,
             about_field: bool = True) -> PydanticCustomError:
    """A validation error whose message is `detail`. It is about the field at the error's place, or that field's
    `child` (a list index or a property name), or, with `about_field` False, about the connector as a whole."""
    return PydanticCustomError("cdc_config", "{detail}", {"detail": detail, "child": child, "connector": connector,
                                                          "about_field": about_field})


# Set while a file is read: its strings' ${VAR} references are expanded. Values given in code (a test's
# ConnectorConfig, dataclasses.replace) are taken as they are, so validating a value twice never expands it twice.
_READING_FILE: ContextVar[bool] = ContextVar("cdc_config_reading_file", default=False)


def _expanded(text: str) -> str:
    return _expand_variables(text, _invalid) if _READING_FILE.get() else text


def _string(value: Any, *, secret: bool = False, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        shown = type(value).__name__ if secret else _show(value)
        raise _invalid(f"must be a string, got {shown} (quote the value in YAML)")
    value = _expanded(value)
    if not value and not allow_empty:
        raise _invalid("must not be empty")
    return value


def _secret(value: Any) -> Secret:
    return value if isinstance(value, Secret) else Secret(_string(value, secret=True, allow_empty=True))


def _destination_dsn(value: Any) -> Secret:
    return value if isinstance(value, Secret) else Secret(_string(value, secret=True))


def _choice(value: Any, *, choices: tuple[str, ...]) -> str:
    value = _string(value)
    if value not in choices:
        raise _invalid(f"must be one of: {', '.join(choices)}; got {value!r}")
    return value


def _identifier(value: Any) -> str:
    value = _string(value)
    if len(value) > POSTGRES_IDENTIFIER_MAX_LENGTH:
        raise _invalid(f"must be at most {POSTGRES_IDENTIFIER_MAX_LENGTH} characters (a PostgreSQL identifier), "
                       f"got {value!r}")
    return value


def _integer(value: Any, *, minimum: int, maximum: int | None = None) -> int:
    number = _as_integer(_expanded(value) if isinstance(value, str) else value)
    if number is None or number < minimum or (maximum is not None and number > maximum):
        expected = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise _invalid(f"must be an integer {expected}, got {_show(value)}")
    return number


def _number(value: Any, zero_allowed: bool) -> float:
    number = _as_number(_expanded(value) if isinstance(value, str) else value)
    if number is None or number < 0 or number == 0 and not zero_allowed:
        raise _invalid(f"must be a number {'>=' if zero_allowed else '>'} 0, got {_show(value)}")
    return number


def _names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise _invalid(f"must be a list of names, got {_show(value)}")
    names = []
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise _invalid(f"must be a non-empty string, got {_show(item)}", child=index)
        try:
            names.append(_string(item).strip())
        except PydanticCustomError as exc:
            raise _invalid(exc.context["detail"], child=index) from None
    return tuple(names)


def _properties(value: Any, *, prefix: str = "") -> Mapping[str, str]:
    """A mapping of property names to strings (numbers and booleans written as Java reads them), read-only."""
    if not isinstance(value, Mapping):
        raise _invalid(f"must be a mapping of property names to values, got {_show(value)}")
    properties = {}
    for name, item in value.items():
        if not isinstance(name, str) or not name:
            raise _invalid("must have a non-empty string as property name", child=str(name))
        if not name.startswith(prefix):
            raise _invalid(f"is not a {prefix.rstrip('.')} property (its name must start with '{prefix}')", child=name)
        if isinstance(item, bool):
            properties[name] = "true" if item else "false"
        elif isinstance(item, (int, float)):
            properties[name] = str(item)
        elif isinstance(item, str):
            try:
                properties[name] = _expanded(item)
            except PydanticCustomError as exc:
                raise _invalid(exc.context["detail"], child=name) from None
        else:
            shown = type(item).__name__ if _SECRET_PROPERTY.search(name) else _show(item)
            raise _invalid(f"must be a string, number or boolean, got {shown}", child=name)
    return MappingProxyType(properties)


Text = Annotated[str, PlainValidator(_string)]
OptionalText = Optional[Text]
Identifier = Annotated[str, PlainValidator(_identifier)]
OptionalIdentifier = Optional[Identifier]
PositiveNumber = Annotated[float, PlainValidator(partial(_number, zero_allowed=False))]
NonNegativeNumber = Annotated[float, PlainValidator(partial(_number, zero_allowed=True))]
Names = Annotated[tuple[str, ...], PlainValidator(_names)]
Properties = Annotated[Mapping[str, str], PlainValidator(_properties)]


def _between(minimum: int, maximum: int | None = None) -> Any:
    """An integer field within bounds (a string of digits, or a ${VAR} holding one, is read as one)."""
    return Annotated[int, PlainValidator(partial(_integer, minimum=minimum, maximum=maximum))]


def _one_of(choices: tuple[str, ...]) -> Any:
    return Annotated[str, PlainValidator(partial(_choice, choices=choices))]


ConnectorType = _one_of(CONNECTOR_TYPES)
SnapshotMode = _one_of(SNAPSHOT_MODES)
SnapshotEngine = _one_of(SNAPSHOT_ENGINES)
ApplyCopier = _one_of(APPLY_COPIERS)
TlsMode = _one_of(TLS_MODES)
ErrorStrategy = _one_of(ERROR_STRATEGIES)
PositionLostPolicy = _one_of(POSITION_LOST_POLICIES)
Trigger = _one_of(TRIGGERS)
LetterCasing = _one_of(LETTER_CASINGS)
Port = _between(1, 65535)


# The file's sections: pydantic dataclasses, so that each class is at once the section's schema (field, type,
# bounds, default) and the frozen value the engine reads. A problem is reported as one ConfigError naming the
# file, the connector and the field (`_config_error`).
_SECTION = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


# The destination session settings the pipeline's SQL depends on, pinned on every session it opens so that no
# default set by a DBA for the database or the role changes what it does:
# - READ COMMITTED: the merge reads the rows Spark's tasks committed into the staging table after the batch's
#   transaction began; a REPEATABLE READ snapshot taken before would see none of them.
# - search_path: names the pipeline writes unqualified resolve to the catalog's own objects, never to a function,
#   operator or type a role with CREATE on some schema defined (the CVE-2018-1058 pattern); its tables and the
#   replicated tables are always schema-qualified, and the temporary staging tables are pg_temp's.
# - how values read and write as text: dates, times with zone, intervals, floats, bytes, backslashes in literals,
#   and the encoding of the text sent and read.
# Not pinned: default_transaction_read_only (a read-only destination fails every write, loudly, as its DBA meant)
# and session_replication_role (only a superuser may set it; it changes which triggers fire, not what is written).
SESSION_SETTINGS = {
    "default_transaction_isolation": "read committed",
    "search_path": "pg_catalog, pg_temp",
    "DateStyle": "ISO, MDY",
    "TimeZone": "UTC",
    "IntervalStyle": "postgres",
    "extra_float_digits": "3",
    "bytea_output": "hex",
    "standard_conforming_strings": "on",
    "client_encoding": "UTF8",
}


def _options_escape(value: str) -> str:
    """A setting's value as one word of the `options` connection parameter: spaces and backslashes escaped."""
    return re.sub(r"([\\\s])", r"\\\1", value)


@dataclass(frozen=True, config=_SECTION)
class DestinationConfig:
    """The destination PostgreSQL: where replicated tables land and where the control schema lives."""

    dsn: Annotated[Secret, PlainValidator(_destination_dsn)]
    control_schema: Identifier = DEFAULT_CONTROL_SCHEMA
    # No run waits forever on the destination: a lock it cannot get, or a statement that does not end, fails it.
    lock_timeout_seconds: PositiveNumber = DEFAULT_LOCK_TIMEOUT_SECONDS
    statement_timeout_seconds: PositiveNumber = DEFAULT_STATEMENT_TIMEOUT_SECONDS
    # A role that may submit requests and manage mapping rules, and read the state, and nothing else.
    operator_role: OptionalIdentifier = None

    @property
    def session_options(self) -> str:
        """The settings every destination session of the pipeline runs with (Python's and the JVM's), as the
        `options` connection parameter both libpq and pgjdbc take: `SESSION_SETTINGS` and the timeouts. A client's
        setting outranks the database's and the role's defaults (ALTER DATABASE/ROLE ... SET)."""
        settings = {**SESSION_SETTINGS, "lock_timeout": f"{int(self.lock_timeout_seconds * 1000)}ms",
                    "statement_timeout": f"{int(self.statement_timeout_seconds * 1000)}ms"}
        return " ".join(f"-c {name}={_options_escape(value)}" for name, value in settings.items())

    def connect(self, connector: str | None = None, **options: Any) -> Any:
        """A psycopg connection to the destination (autocommit unless told otherwise), with the lock and statement
        timeouts and TCP keepalives; a failure is a CdcError whose message holds no secret of the DSN (psycopg
        quotes a token it cannot parse, a password too)."""
        import psycopg

        from cdc_pipeline.errors import CdcError

        options.setdefault("autocommit", True)
        for key, value in KEEPALIVES.items():
            options.setdefault(key, value)
        options["options"] = f"{options.get('options', '')} {self.session_options}".strip()
        try:
            return psycopg.connect(self.dsn.reveal(), **options)
        except psycopg.Error as exc:
            raise CdcError(f"cannot connect to the destination PostgreSQL: {scrub(str(exc), self.dsn.reveal())}",
                           connector=connector) from None

    def redacted(self) -> dict[str, Any]:
        """Return the fields as plain data with the DSN's password hidden."""
        plain = {config_field.name: getattr(self, config_field.name) for config_field in dataclasses.fields(self)}
        return {**plain, "dsn": redact_dsn(self.dsn.reveal())}


def default_spark_master() -> str:
    """The Spark master when the file's `spark.master` names none: `CDC_SPARK_MASTER`, else local[*]."""
    return os.environ.get(SPARK_MASTER_ENV) or DEFAULT_SPARK_MASTER


@dataclass(frozen=True, config=_SECTION)
class SparkConfig:
    """The Spark cluster every run of the file uses, from the CLI and from Dagster alike: its master and extra
    Spark configuration (`spark.*` properties; the pipeline adds its jars to `spark.jars` and
    `spark.driver.extraClassPath`, and its JVM options to `spark.driver.extraJavaOptions`)."""

    master: Text = dataclasses.field(default_factory=default_spark_master)
    conf: Annotated[Mapping[str, str], PlainValidator(partial(_properties, prefix="spark."))] = dataclasses.field(
        default_factory=lambda: MappingProxyType({}), hash=False)
    # Spark's web UI of a run's driver (spark.ui.enabled, spark.ui.port; `conf` wins over both).
    ui: bool = False
    ui_port: Port = DEFAULT_SPARK_UI_PORT
    # The driver's heap unless `conf` sets spark.driver.memory: from the file's connectors (`driver_memory_mb`).
    default_driver_memory_mb: int = dataclasses.field(default=driver_memory_mb(DEFAULT_APPLY_BATCH_MB), init=False,
                                                      compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if self.ui:
            object.__setattr__(self, "conf", MappingProxyType(
                {"spark.ui.enabled": "true", "spark.ui.port": str(self.ui_port), **self.conf}))

    def redacted(self) -> dict[str, Any]:
        return {"master": self.master, "ui": self.ui, "ui_port": self.ui_port,
                "conf": {key: REDACTED if _SECRET_PROPERTY.search(key) else value for key, value in self.conf.items()}}


@dataclass(frozen=True, repr=False, config=_SECTION)
class ConnectorConfig:
    """One source database replicated by Debezium into the destination, with its run limits and schedule.

    ``destination_schema`` is None when the default applies (the source database name, or for postgres
    sources the source schema). ``debezium`` holds extra raw Debezium properties as strings. The fields left
    None by the file take defaults that depend on other fields (the port and the snapshot engine on the type,
    the run retries on the error strategy).
    """

    name: str
    type: ConnectorType
    hostname: Text
    user: Text
    password: Annotated[Secret, PlainValidator(_secret)]
    # The source database; a MariaDB/MySQL connector may take `databases` instead: names and shell-style patterns
    # (`tenant_*`), read from one binlog by one engine, each database into its own destination schema.
    database: OptionalText = None
    databases: Names = ()
    port: Optional[Port] = None
    tables: Names = ()
    snapshot_mode: SnapshotMode = "initial"
    # The source no longer holds the connector's position: "fail" (the run names the command that recovers) or
    # "snapshot" (the run takes a new snapshot instead, as snapshot_mode when_needed does).
    on_position_lost: PositionLostPolicy = "fail"
    # How the rows that exist when the connector starts are copied: `spark` (parallel chunked reads and COPY) where
    # the type allows, else `debezium`.
    snapshot_engine: Optional[SnapshotEngine] = None
    snapshot_chunk_rows: _between(MIN_SNAPSHOT_CHUNK_ROWS) = DEFAULT_SNAPSHOT_CHUNK_ROWS
    batch_size: _between(1, MAX_BATCH_SIZE) = DEFAULT_BATCH_SIZE
    apply_batch_events: _between(1, MAX_APPLY_BATCH_EVENTS) = DEFAULT_APPLY_BATCH_EVENTS
    # A group's rows in MB at most (a single larger event goes through alone); Debezium's queue and the runner's
    # batches are bounded from it (`runner.debezium_properties`, `cycle.held_bytes`).
    apply_batch_mb: _between(1, MAX_APPLY_BATCH_MB) = DEFAULT_APPLY_BATCH_MB
    # Who COPYs a keyed table's streamed rows into the destination: "executors" (Spark's tasks, into a staging
    # table the batch's transaction merges from) or "driver" (collected to the driver and COPYed there).
    apply_copy: ApplyCopier = "executors"
    # TLS to the source, for every connection of a run (Debezium's, the driver's checks, the bulk snapshot's
    # readers): disable, require (encrypted, certificate not checked), verify-ca or verify-full (checked against
    # tls_ca_file, and the host name too).
    tls_mode: TlsMode = "disable"
    tls_ca_file: OptionalText = None
    # The driver's queries to the source and the bulk snapshot's reads end with an error after waiting this long
    # for a lock, or this long in all (with TCP keepalives: a dead source is noticed too).
    source_lock_timeout_seconds: PositiveNumber = DEFAULT_LOCK_TIMEOUT_SECONDS
    source_statement_timeout_seconds: PositiveNumber = DEFAULT_STATEMENT_TIMEOUT_SECONDS
    error_strategy: ErrorStrategy = "exit"
    retry_attempts: _between(1, MAX_RETRY_ATTEMPTS) = DEFAULT_RETRY_ATTEMPTS  # applications of a failing batch
    retry_backoff_seconds: PositiveNumber = DEFAULT_RETRY_BACKOFF_SECONDS  # before the first retry, then doubling
    # Times Dagster launches a failed sync run again (the run tag dagster/max_retries).
    run_retries: Optional[_between(0, MAX_RUN_RETRIES)] = None
    # The cron of the `schedule` trigger; Dagster checks it where the schedule is defined (assets/schedules.py).
    schedule: Text = DEFAULT_SCHEDULE
    # What launches runs in Dagster: "changes" (a sensor that checks the source without a JVM, every
    # check_interval_seconds) or "schedule" (the cron `schedule`).
    trigger: Trigger = "changes"
    check_interval_seconds: _between(1, 3600) = DEFAULT_CHECK_INTERVAL_SECONDS
    # A run is bounded by time (max_seconds_per_run); memory is bounded per group, so a count of events is optional.
    max_events_per_run: Optional[_between(1)] = None
    max_seconds_per_run: PositiveNumber = DEFAULT_MAX_SECONDS_PER_RUN
    idle_timeout_seconds: PositiveNumber = DEFAULT_IDLE_TIMEOUT_SECONDS
    # Dagster runs (and `cdc-pipeline sync --linger`): once a run applied a change it ends only after this long
    # without another, within max_seconds_per_run; the change sensor launches the next one at once when work waits.
    linger_seconds: NonNegativeNumber = DEFAULT_LINGER_SECONDS
    # Dagster, runs served by a pipeline server (whose engine costs no JVM of the run's own), trigger `changes`: a run
    # the change sensor launched stays streaming between changes (its max_seconds_per_run counting from its first
    # change), and the sensor launches one when none runs, while the run queue has room for it (half its
    # max_concurrent_runs); a change after a quiet spell is then applied by a run already streaming, not after a
    # check and a run's start (docs/triggers.md, "Standing runs").
    standing_run: bool = True
    # The stream's next group is fetched, parsed and converted while the last one is applied (cycle.run_ahead).
    run_ahead: bool = True
    # A run whose streaming connection to the source is lost and not regained for this long fails.
    source_lost_timeout_seconds: PositiveNumber = DEFAULT_SOURCE_LOST_TIMEOUT_SECONDS
    letter_casing: LetterCasing = "lowercase"
    destination_schema: OptionalIdentifier = None
    debezium: Properties = dataclasses.field(default_factory=lambda: MappingProxyType({}), hash=False)
    # PostgreSQL: Debezium's heartbeat writes a row of this table (`schema.table`, created if missing, in the
    # connector's publication) every heartbeat_interval_seconds while a run streams (default: half the idle
    # timeout), so that a run confirms its slot past the WAL of tables it does not capture. SQL Server, Oracle, MariaDB
    # and MySQL: Debezium sends its heartbeat as often, so a quiet source's stored offset moves to the position the
    # reader reached (a binlog reader's, through other databases' events).
    heartbeat_table: Text = DEFAULT_HEARTBEAT_TABLE
    heartbeat_interval_seconds: Optional[PositiveNumber] = None
    # PostgreSQL: the change check asks for a run once the slot holds more WAL than this after its confirmed position.
    retained_wal_run_mb: _between(1) = DEFAULT_RETAINED_WAL_RUN_MB
    # error_strategy retry or skip: after a failed run the change sensor waits check_interval_seconds, twice as long
    # after each further failure in a row, at most this long.
    failure_backoff_max_seconds: PositiveNumber = DEFAULT_FAILURE_BACKOFF_MAX_SECONDS
    # Dagster: each table asset's freshness check fails when the table was not brought up to date (a run that
    # changed it, or a change check that found the connector caught up) for this long.
    freshness_minutes: _between(1) = DEFAULT_FRESHNESS_MINUTES
    # Dagster: the cron on which each table asset's check `matches_source` runs verify (none: only by hand and after a
    # bulk load ends).
    verify_schedule: OptionalText = DEFAULT_VERIFY_SCHEDULE

    def __post_init__(self) -> None:
        defaults = {"port": DEFAULT_PORTS[self.type], "run_retries": DEFAULT_RUN_RETRIES.get(self.error_strategy, 0),
                    "snapshot_engine": "spark" if self.type in BULK_SNAPSHOT_TYPES else "debezium",
                    "heartbeat_interval_seconds": self.idle_timeout_seconds / 2}
        for name, default in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
        if self.snapshot_engine == "spark" and self.type not in BULK_SNAPSHOT_TYPES:
            raise _invalid(f"'spark' reads {', '.join(BULK_SNAPSHOT_TYPES)} sources; a {self.type} connector takes "
                           "Debezium's snapshot (debezium)", child="snapshot_engine")
        if self.tls_mode != "disable" and self.type not in TLS_SOURCE_TYPES:
            raise _invalid(f"is for {', '.join(TLS_SOURCE_TYPES)} sources; a {self.type} connector takes its TLS "
                           "settings as Debezium properties (debezium:)", child="tls_mode")
        if self.tls_mode.startswith("verify") and self.tls_ca_file is None:
            raise _invalid(f"is required by tls_mode {self.tls_mode} (the CA certificate, PEM, that signed the "
                           "source's certificate)", child="tls_ca_file")
        if self.tls_ca_file is not None and not Path(self.tls_ca_file).is_file():
            raise _invalid(f"names no readable file: {self.tls_ca_file}", child="tls_ca_file")
        schema, _, table = self.heartbeat_table.partition(".")
        if not schema or not table:
            raise _invalid(f"names no table as schema.table: {self.heartbeat_table!r}", child="heartbeat_table")
        self._check_databases()

    def _check_databases(self) -> None:
        """One of `database` and `databases`; `databases` for the binlog sources only, without commas (Debezium's
        include list is comma-separated); a fixed `destination_schema` for one database only."""
        if self.type not in MULTI_DATABASE_TYPES and DATABASE_PLACEHOLDER in (self.destination_schema or ""):
            raise _invalid(f"holds {DATABASE_PLACEHOLDER}, which names a source database of a "
                           f"{' or '.join(MULTI_DATABASE_TYPES)} connector", child="destination_schema")
        if self.database is not None and self.databases:
            raise _invalid("takes `database` or `databases`, not both", child="databases")
        if not self.databases:
            if self.database is None:
                plural = f" (or `databases`, names and patterns, of a {self.type} source)" \
                    if self.type in MULTI_DATABASE_TYPES else ""
                raise _invalid(f"is required{plural}", child="database")
            return
        if self.type not in MULTI_DATABASE_TYPES:
            raise _invalid(f"is for {', '.join(MULTI_DATABASE_TYPES)} sources (one binlog holds all their "
                           f"databases); a {self.type} connector reads one `database`", child="databases")
        for index, name in enumerate(self.databases):
            if "," in name:
                raise _invalid(f"holds a comma: {name!r} (Debezium's include list is comma-separated)",
                               child=index)
        if self.destination_schema is not None and DATABASE_PLACEHOLDER not in self.destination_schema \
                and (len(self.databases) > 1 or _is_pattern(self.databases[0])):
            raise _invalid(f"is one schema for the tables of several databases, whose names may clash: write "
                           f"{DATABASE_PLACEHOLDER} in it (e.g. 'tenant_{DATABASE_PLACEHOLDER}') for a schema per "
                           "database, or leave it out (each database's own name)", child="destination_schema")

    @property
    def database_patterns(self) -> tuple[str, ...]:
        """The source databases as shell-style patterns: `databases`, or `database` matched as it is spelled."""
        return self.databases or (_escape_pattern(self.database or ""),)

    @property
    def databases_text(self) -> str:
        """The source databases as messages name them: `database`, or the `databases` given."""
        return self.database if self.database is not None else ", ".join(self.databases)

    def captures_database(self, name: str) -> bool:
        """Whether a source database (a MariaDB/MySQL schema) is one of the connector's: the whole name matches one
        of `databases` (or is `database`), letters compared without case as Debezium's include list does."""
        return _database_matcher(self.database_patterns).fullmatch(name) is not None

    def destination_schema_for(self, database: str) -> str | None:
        """The `destination_schema` of a source database's tables: the setting with {database} filled in (the
        database's name in the connector's letter casing), or None when it is not set."""
        if self.destination_schema is None:
            return None
        return self.destination_schema.replace(DATABASE_PLACEHOLDER, dest_identifier(database, self.letter_casing))

    @property
    def bulk_snapshot(self) -> bool:
        """Whether this connector copies existing rows with the bulk snapshot engine."""
        return self.snapshot_engine == "spark"

    def split_table(self, source_table: str) -> tuple[str, str]:
        """A source table id (`db.table`, `schema.table`) as (container, table). A table's name may hold a dot
        (`db.a.b` is table `a.b` of database `db`): the connector's own database is taken off whole, and other
        ids are split at their first dot."""
        if self.type in MULTI_DATABASE_TYPES:
            if self.database is not None and source_table.startswith(f"{self.database}."):
                return self.database, source_table[len(self.database) + 1:]
            if self.databases:
                # The first dot after which the name is one of the connector's databases.
                for index, character in enumerate(source_table):
                    if character == "." and self.captures_database(source_table[:index]):
                        return source_table[:index], source_table[index + 1:]
        container, _, table = source_table.partition(".")
        return container, table

    @property
    def replication_slot(self) -> str:
        """A PostgreSQL source's replication slot (and publication): one per connector."""
        return f"cdc_{self.name}"

    def fingerprint(self, destination: "DestinationConfig") -> str:
        """A digest of what a run of this connector runs with (its fields and the destination's, secrets left
        out): a run asked for under another one may have work the change check cannot see."""
        settings = {"connector": self.redacted(), "destination": destination.redacted()}
        return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()

    def redacted(self) -> dict[str, Any]:
        """Return all fields as plain data, the password and password-like Debezium properties shown as '***'."""
        plain: dict[str, Any] = {}
        for config_field in dataclasses.fields(self):
            value = getattr(self, config_field.name)
            if isinstance(value, Secret):
                value = REDACTED
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = {
                    key: REDACTED if _SECRET_PROPERTY.search(key) else item for key, item in value.items()
                }
            plain[config_field.name] = value
        return plain

    def __repr__(self) -> str:
        fields_text = ", ".join(f"{key}={value!r}" for key, value in self.redacted().items())
        return f"ConnectorConfig({fields_text})"


@dataclass(frozen=True, config=_SECTION)
class _ConfigFile:
    """The file's top level, as validated."""

    destination: DestinationConfig
    connectors: dict[str, ConnectorConfig]
    spark: SparkConfig = dataclasses.field(default_factory=SparkConfig)

    @field_validator("destination", "spark", mode="before")
    @classmethod
    def _section(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise _invalid(f"must be a mapping, got {_show(value)}")
        return _present(value)

    @field_validator("connectors", mode="before")
    @classmethod
    def _connectors(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise _invalid(f"must be a mapping, got {_show(value)}")
        if not value:
            raise _invalid("must define at least one connector")
        connectors = {}
        for name, fields in value.items():
            if not isinstance(name, str) or not CONNECTOR_NAME_PATTERN.fullmatch(name):
                raise _invalid(f"invalid connector name {name!r}: it must start with a lowercase letter and hold only "
                               "lowercase letters, digits and underscores, at most 63 characters (it becomes the "
                               "Dagster job name 'sync_<name>' and a control-table key)",
                               connector=str(name), about_field=False)
            if fields is not None and not isinstance(fields, Mapping):
                raise _invalid(f"a connector must be a mapping of fields, got {_show(fields)}", connector=name,
                               about_field=False)
            fields = _present(fields or {})
            if "name" in fields:
                raise _invalid(_unknown_field("name", _field_names(ConnectorConfig), "a connector"), connector=name,
                               about_field=False)
            connectors[name] = {**fields, "name": name}
        return connectors


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """The whole configuration file: the destination, the connectors by name in file order, and the Spark cluster."""

    destination: DestinationConfig
    connectors: Mapping[str, ConnectorConfig] = dataclasses.field(hash=False)
    path: Path
    spark: SparkConfig = dataclasses.field(default_factory=SparkConfig)

    def __post_init__(self) -> None:
        largest = max((connector.apply_batch_mb for connector in self.connectors.values()),
                      default=DEFAULT_APPLY_BATCH_MB)
        object.__setattr__(self.spark, "default_driver_memory_mb", driver_memory_mb(largest))

    def connector(self, name: str) -> ConnectorConfig:
        """Return the named connector; raise ConfigError listing the configured names if there is none."""
        try:
            return self.connectors[name]
        except KeyError:
            known = ", ".join(self.connectors) or "none"
            raise ConfigError(
                f"{self.path}: no connector of that name; configured connectors: {known}", connector=name
            ) from None

    def redacted(self) -> dict[str, Any]:
        """Return the whole configuration as plain data with every secret hidden."""
        return {
            "path": str(self.path),
            "destination": self.destination.redacted(),
            "spark": self.spark.redacted(),
            "connectors": {name: connector.redacted() for name, connector in self.connectors.items()},
        }


def config_path() -> Path:
    """Return the configuration file path: $CDC_PIPELINE_CONFIG, else dagster_home/connectors.yaml."""
    return Path(os.environ.get(CONFIG_PATH_ENV) or DEFAULT_CONFIG_PATH)


def load_config(path: str | Path | None = None) -> PipelineConfig:
    """Read, expand and validate the configuration file (default: ``config_path()``).

    Raises ConfigError when the file is missing or unreadable, is not valid YAML (a key repeated within
    one mapping counts as invalid), or fails validation.
    """
    file_path = Path(path if path is not None else config_path()).expanduser().absolute()
    try:
        with file_path.open(encoding="utf-8") as stream:
            data = yaml.load(stream, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except FileNotFoundError:
        raise ConfigError(
            f"configuration file {file_path} not found; set {CONFIG_PATH_ENV} to the path of the connectors "
            f"YAML file (default: {DEFAULT_CONFIG_PATH} relative to the current directory; "
            "see dagster_home/connectors.example.yaml)"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file_path}: invalid YAML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read configuration file {file_path}: {exc}") from None
    config = parse_config(data, file_path)
    logger.info(
        "Loaded %d connector(s) from %s: %s", len(config.connectors), file_path, ", ".join(config.connectors)
    )
    return config


_FILE = TypeAdapter(_ConfigFile)


def parse_config(data: Any, path: Path) -> PipelineConfig:
    """Validate parsed YAML data, expand ${VAR} references and build the PipelineConfig.

    ``path`` is used in error messages and stored on the result. Raises one ConfigError for the first
    problem found, naming the connector (if any) and the field.
    """
    path = Path(path)
    if data is None:
        raise ConfigError(f"{path}: the file is empty; it needs a 'destination' and a 'connectors' section")
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{path}: the top level must be a mapping with 'destination' and 'connectors', got {_show(data)}"
        )
    reading = _READING_FILE.set(True)
    try:
        valid = _FILE.validate_python(_present(data))
    except ValidationError as exc:
        raise _config_error(exc, path) from None
    finally:
        _READING_FILE.reset(reading)
    _refuse_shared_destinations(list(valid.connectors.values()), path)
    return PipelineConfig(destination=valid.destination, connectors=MappingProxyType(valid.connectors), path=path,
                          spark=valid.spark)


def dest_identifier(name: str, letter_casing: str) -> str:
    """Return the destination spelling of a source identifier: lowered for "lowercase", unchanged for "asis"."""
    if letter_casing == "lowercase":
        return name.lower()
    if letter_casing == "asis":
        return name
    raise ConfigError(f"letter casing must be one of {', '.join(LETTER_CASINGS)}, not {letter_casing!r}")


def default_table_name(connector: ConnectorConfig, source_table: str) -> tuple[str, str]:
    """The destination (schema, table) of a source table when no table rule maps it: the connector's
    `destination_schema`, else the source's database (schema), and the table's own name, in the connector's
    letter casing. The one place this rule is written (`ObjectMap.table_name` adds the rules)."""
    container, table = connector.split_table(source_table)
    casing = connector.letter_casing
    return connector.destination_schema_for(container) or dest_identifier(container, casing), \
        dest_identifier(table, casing)


def _refuse_shared_destinations(connectors: list[ConnectorConfig], path: Path) -> None:
    """Refuses two connectors of the file (one destination) whose default mapping writes the same destination table:
    the second one's load would empty the first one's rows. Shards of one database (`shop` on two servers) are the
    usual case. What the file cannot tell (the schemas a PostgreSQL source has) is checked when a table is written
    (`rule_store.claim_table`)."""
    for index, second in enumerate(connectors):
        for first in connectors[:index]:
            shared = _shared_destination(first, second)
            if shared is not None:
                raise ConfigError(
                    f"{path}: connectors {first.name!r} and {second.name!r} both write {shared} of the destination, "
                    "and a destination table has one writer: give one of them its own destination_schema, or "
                    "`tables` lists that do not overlap", connector=second.name)


def destination_tables(connector: ConnectorConfig) -> tuple[frozenset[str] | None, frozenset[tuple[str, str]] | None]:
    """The destination schemas and tables the connector's default mapping writes, as far as the file tells: schemas
    None when they are its source's (a PostgreSQL source without `tables` or `destination_schema`), tables None
    when every table of those schemas may be written."""
    if connector.tables:
        tables = frozenset(default_table_name(connector, name) for name in connector.tables)
        return frozenset(schema for schema, _ in tables), tables
    if connector.type in MULTI_DATABASE_TYPES:
        if any(_is_pattern(name) for name in connector.databases):
            return None, None  # the databases that match are the server's
        return frozenset(default_table_name(connector, f"{database}.")[0]
                         for database in connector.databases or (connector.database,)), None
    if connector.destination_schema:
        return frozenset({connector.destination_schema}), None
    return None, None


def _is_pattern(name: str) -> bool:
    """Whether a `databases` entry is a pattern (holds *, ? or [), not a name."""
    return any(character in name for character in "*?[")


def _escape_pattern(name: str) -> str:
    """A database name as a pattern that matches only it."""
    return "".join(f"[{character}]" if character in "*?[" else character for character in name)


def pattern_regex(pattern: str) -> str:
    """A shell-style pattern as a regular expression of the subset Java and Python read alike (Debezium's include
    list): `*` any run of characters, `?` one, `[...]` one of a set (`[!...]` one not in it), the rest as it is."""
    parts, index = [], 0
    while index < len(pattern):
        character = pattern[index]
        closing = pattern.find("]", index + 2) if character == "[" else -1
        if character == "*":
            parts.append(".*")
        elif character == "?":
            parts.append(".")
        elif closing != -1:
            members = pattern[index + 1:closing]
            negated = members.startswith("!")
            members = members[1:] if negated else members
            parts.append("[" + ("^" if negated else "") + "".join(
                f"\\{member}" if member in "\\[]^&" else member for member in members) + "]")
            index = closing
        else:
            parts.append(re.escape(character))
        index += 1
    return "".join(parts)


@functools.lru_cache(maxsize=256)
def _database_matcher(patterns: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{pattern_regex(pattern)})" for pattern in patterns), re.IGNORECASE)


def _shared_destination(first: ConnectorConfig, second: ConnectorConfig) -> str | None:
    """What both connectors' default mapping writes ("table s.t", "every table of schema s"), or None."""
    first_schemas, first_tables = destination_tables(first)
    second_schemas, second_tables = destination_tables(second)
    if first_schemas is None or second_schemas is None or not first_schemas & second_schemas:
        return None
    schemas = first_schemas & second_schemas
    if first_tables is None and second_tables is None:
        return f"every table of schema {min(schemas)}"
    if first_tables is None or second_tables is None:
        tables = {(schema, table) for schema, table in first_tables or second_tables or () if schema in schemas}
    else:
        tables = first_tables & second_tables
    return "table {}.{}".format(*min(tables)) if tables else None


def _present(fields: Mapping[Any, Any]) -> dict[Any, Any]:
    """The fields given a value: a field written with nothing after it takes its default, as if left out."""
    return {key: value for key, value in fields.items() if value is not None}


def _field_names(section: type) -> tuple[str, ...]:
    """The fields a section of the file may set (not those the pipeline sets: `name`, and fields not in `__init__`)."""
    return tuple(config_field.name for config_field in dataclasses.fields(section)
                 if config_field.name != "name" and config_field.init)


# Each place in the file, by the first part of an error's location, and how an unknown field's message names it.
_SECTIONS: Mapping[str, tuple[type, str]] = MappingProxyType({
    "destination": (DestinationConfig, "'destination'"), "spark": (SparkConfig, "'spark'"),
    "connectors": (ConnectorConfig, "a connector"),
})


def _config_error(exc: ValidationError, path: Path) -> ConfigError:
    """The first problem of a failed validation as one ConfigError naming the file, connector and field: unknown
    fields first, then missing ones (all of one section together), then the rest in the file's order."""
    errors = exc.errors(include_url=False)
    rank = {"unexpected_keyword_argument": 0, "extra_forbidden": 0, "missing": 1, "missing_argument": 1}
    first = min(errors, key=lambda error: rank.get(error["type"], 2))
    location = list(first["loc"])
    context = first.get("ctx") or {}
    connector = context.get("connector")
    if location[:1] == ["connectors"] and len(location) >= 2:
        connector = str(location[1])
        del location[:2]
    if not context.get("about_field", True):
        return ConfigError(f"{path}: {context['detail']}", connector=connector)
    section, owner = _SECTIONS.get(str(first["loc"][0]), (_ConfigFile, "the top level")) \
        if len(first["loc"]) > 1 else (_ConfigFile, "the top level")
    prefix = f"{location[0]}." if section in (DestinationConfig, SparkConfig) else ""
    if section in (DestinationConfig, SparkConfig):
        location = location[1:]
    if first["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        message = _unknown_field(f"{prefix}{_field_path(location)}", _field_names(section), owner)
        return ConfigError(f"{path}: {message}", connector=connector)
    if first["type"] in ("missing", "missing_argument"):
        missing = [_field_path(error["loc"][-1:]) for error in errors
                   if error["type"] == first["type"] and error["loc"][:-1] == first["loc"][:-1]]
        if len(missing) > 1:
            names = ", ".join(f"'{prefix}{name}'" for name in missing)
            return ConfigError(f"{path}: fields {names} are required", connector=connector)
        detail = "is required"
    elif first["type"] == "cdc_config":
        detail = context["detail"]
        if context.get("child") is not None:
            location.append(context["child"])
    else:
        detail = f"is invalid: {first['msg']}"
    return ConfigError(f"{path}: field '{prefix}{_field_path(location)}' {detail}", connector=connector)


def _field_path(location: Any) -> str:
    """A field's place as the file writes it: `tables[1]`, `debezium.snapshot.mode`."""
    text = ""
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _unknown_field(name: str, known: tuple[str, ...], owner: str) -> str:
    close = difflib.get_close_matches(name.rpartition(".")[2], known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown field '{name}'{hint}; {owner} accepts: {', '.join(known)}"


class _StrictLoader(yaml.SafeLoader):
    """A safe YAML loader that rejects a key repeated within one mapping instead of keeping the last one."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key_node.value!r}",
                        key_node.start_mark,
                    )
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


def _expand_variables(text: str, error: Callable[[str], Exception]) -> str:
    """Replace ${VAR} and ${VAR:-default} with environment values; the default also applies to an empty VAR."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        body = match.group(1)
        if body is None:
            raise error("has an unterminated '${' (write '$${' for a literal '${')")
        reference = _VARIABLE_BODY.fullmatch(body)
        if reference is None:
            raise error(f"has an invalid variable reference '${{{body}}}'")
        name, default = reference.groups()
        value = os.environ.get(name)
        if value is None or (value == "" and default is not None):
            if default is None:
                hint = f"set it, or write '${{{name}:-default}}'"
                raise error(f"uses undefined environment variable {name!r} ({hint})")
            return default
        return value

    return _VARIABLE_REFERENCE.sub(substitute, text)


def _as_integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    return None


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def _show(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."
