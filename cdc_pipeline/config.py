"""The connectors configuration: one YAML file naming the destination PostgreSQL and every source connector.

The file path comes from the ``CDC_PIPELINE_CONFIG`` environment variable (default
``dagster_home/connectors.yaml`` relative to the current directory). String values may reference the
environment as ``${VAR}`` or ``${VAR:-default}`` (``$${`` writes a literal ``${``). ``load_config`` reads
and validates the file in one go and raises a single ``ConfigError`` naming the connector and field of
the first problem; passwords and the destination DSN are held as ``Secret`` so they never reach a log.
"""

from __future__ import annotations

import dataclasses
import difflib
import hmac
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

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
# How a connector copies the rows that exist when it starts: `spark`, parallel chunked reads and COPY (MariaDB,
# MySQL); `debezium`, Debezium's own snapshot events through the stream's path (every source type).
SNAPSHOT_ENGINES = ("spark", "debezium")
APPLY_COPIERS = ("executors", "driver")
# Set (to anything): the JVM's third-party warnings (ANTLR's version check) are printed; `sync -v` sets it.
THIRD_PARTY_WARNINGS_ENV = "CDC_THIRD_PARTY_WARNINGS"
TLS_MODES = ("disable", "require", "verify-ca", "verify-full")
TLS_SOURCE_TYPES = ("mariadb", "mysql", "postgres")
TRIGGERS = ("changes", "schedule")
DEFAULT_CHECK_INTERVAL_SECONDS = 15
BULK_SNAPSHOT_TYPES = ("mariadb", "mysql", "postgres")
DEFAULT_SNAPSHOT_CHUNK_ROWS = 50_000
MIN_SNAPSHOT_CHUNK_ROWS = 100
LETTER_CASINGS = ("lowercase", "asis")

DEFAULT_CONTROL_SCHEMA = "cdc"
DEFAULT_SCHEDULE = "* * * * *"
DEFAULT_BATCH_SIZE = 2048
MAX_BATCH_SIZE = 100_000
DEFAULT_MAX_EVENTS_PER_RUN = 100_000
# Consecutive Debezium batches are joined up to this many events into one Spark job and one transaction.
DEFAULT_APPLY_BATCH_EVENTS = 20_000
MAX_APPLY_BATCH_EVENTS = 1_000_000
DEFAULT_MAX_SECONDS_PER_RUN = 300.0
DEFAULT_IDLE_TIMEOUT_SECONDS = 5.0
DEFAULT_SOURCE_LOST_TIMEOUT_SECONDS = 60.0
# Dagster run retries of a failed sync run: by default only under error_strategy retry.
DEFAULT_RUN_RETRIES = {"retry": 2}
MAX_RUN_RETRIES = 10
DEFAULT_RETRY_ATTEMPTS = 3
MAX_RETRY_ATTEMPTS = 20
DEFAULT_RETRY_BACKOFF_SECONDS = 1.0
POSTGRES_IDENTIFIER_MAX_LENGTH = 63

CONNECTOR_NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,62}")

REDACTED = "***"

_TOP_LEVEL_FIELDS = ("destination", "connectors")
_DESTINATION_FIELDS = (
    "dsn", "control_schema", "lock_timeout_seconds", "statement_timeout_seconds", "operator_role",
)
# No run waits forever on the destination: a lock it cannot get, or a statement that does not end, fails the run.
DEFAULT_LOCK_TIMEOUT_SECONDS = 60.0
DEFAULT_STATEMENT_TIMEOUT_SECONDS = 1800.0
# TCP keepalives on every destination connection: a dead peer is noticed in about a minute.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
_REQUIRED_CONNECTOR_FIELDS = ("type", "hostname", "user", "password", "database")
_CONNECTOR_FIELDS = (
    *_REQUIRED_CONNECTOR_FIELDS,
    "port",
    "tables",
    "snapshot_mode",
    "snapshot_engine",
    "snapshot_chunk_rows",
    "batch_size",
    "apply_batch_events",
    "apply_copy",
    "tls_mode",
    "tls_ca_file",
    "source_lock_timeout_seconds",
    "source_statement_timeout_seconds",
    "error_strategy",
    "retry_attempts",
    "retry_backoff_seconds",
    "run_retries",
    "schedule",
    "trigger",
    "check_interval_seconds",
    "max_events_per_run",
    "max_seconds_per_run",
    "idle_timeout_seconds",
    "source_lost_timeout_seconds",
    "letter_casing",
    "destination_schema",
    "debezium",
)

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


@dataclass(frozen=True)
class DestinationConfig:
    """The destination PostgreSQL: where replicated tables land and where the control schema lives."""

    dsn: Secret
    control_schema: str
    lock_timeout_seconds: float = DEFAULT_LOCK_TIMEOUT_SECONDS
    statement_timeout_seconds: float = DEFAULT_STATEMENT_TIMEOUT_SECONDS
    # A role that may submit requests and manage mapping rules, and read the state, and nothing else.
    operator_role: str | None = None

    @property
    def session_options(self) -> str:
        """The settings every destination session of the pipeline runs with (Python's and the JVM's), as the
        `options` connection parameter both libpq and pgjdbc take."""
        return (f"-c lock_timeout={int(self.lock_timeout_seconds * 1000)}ms "
                f"-c statement_timeout={int(self.statement_timeout_seconds * 1000)}ms")

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
        return {"dsn": redact_dsn(self.dsn.reveal()), "control_schema": self.control_schema,
                "lock_timeout_seconds": self.lock_timeout_seconds,
                "statement_timeout_seconds": self.statement_timeout_seconds, "operator_role": self.operator_role}


@dataclass(frozen=True, repr=False)
class ConnectorConfig:
    """One source database replicated by Debezium into the destination, with its run limits and schedule.

    ``destination_schema`` is None when the default applies (the source database name, or for postgres
    sources the source schema). ``debezium`` holds extra raw Debezium properties as strings.
    """

    name: str
    type: str
    hostname: str
    port: int
    user: str
    password: Secret
    database: str
    tables: tuple[str, ...]
    snapshot_mode: str
    batch_size: int
    apply_batch_events: int
    error_strategy: str
    schedule: str
    max_events_per_run: int
    max_seconds_per_run: float
    idle_timeout_seconds: float
    letter_casing: str
    destination_schema: str | None
    debezium: Mapping[str, str] = field(hash=False)
    retry_attempts: int = 3  # error_strategy retry: applications of a failing batch before the run fails
    retry_backoff_seconds: float = 1.0  # ... waiting this long before the first retry, doubling up to a minute
    # Times Dagster launches a failed sync run again (the run tag dagster/max_retries).
    run_retries: int = 0
    # A run whose streaming connection to the source is lost and not regained for this long fails.
    source_lost_timeout_seconds: float = DEFAULT_SOURCE_LOST_TIMEOUT_SECONDS
    snapshot_engine: str = "debezium"
    snapshot_chunk_rows: int = DEFAULT_SNAPSHOT_CHUNK_ROWS  # rows per chunk of a bulk snapshot (spark engine)
    # What launches runs in Dagster: "changes" (a sensor that checks the source without a JVM, every
    # check_interval_seconds) or "schedule" (the cron `schedule`).
    trigger: str = "changes"
    check_interval_seconds: int = DEFAULT_CHECK_INTERVAL_SECONDS
    # Who COPYs a keyed table's streamed rows into the destination: "executors" (Spark's tasks, into a staging
    # table the batch's transaction merges from) or "driver" (collected to the driver and COPYed there).
    apply_copy: str = "executors"
    # TLS to the source, for every connection of a run (Debezium's, the driver's checks, the bulk snapshot's
    # readers): disable, require (encrypted, certificate not checked), verify-ca or verify-full (checked against
    # tls_ca_file, and the host name too).
    tls_mode: str = "disable"
    tls_ca_file: str | None = None
    # The driver's queries to the source and the bulk snapshot's reads end with an error after waiting this long
    # for a lock, or this long in all (with TCP keepalives: a dead source is noticed too).
    source_lock_timeout_seconds: float = DEFAULT_LOCK_TIMEOUT_SECONDS
    source_statement_timeout_seconds: float = DEFAULT_STATEMENT_TIMEOUT_SECONDS

    @property
    def bulk_snapshot(self) -> bool:
        """Whether this connector copies existing rows with the bulk snapshot engine."""
        return self.snapshot_engine == "spark"

    def split_table(self, source_table: str) -> tuple[str, str]:
        """A source table id (`db.table`, `schema.table`) as (container, table). A table's name may hold a dot
        (`db.a.b` is table `a.b` of database `db`): the connector's own database is taken off whole, and other
        ids are split at their first dot."""
        prefix = f"{self.database}."
        if self.type in ("mariadb", "mysql") and source_table.startswith(prefix):
            return self.database, source_table[len(prefix):]
        container, _, table = source_table.partition(".")
        return container, table

    @property
    def replication_slot(self) -> str:
        """A PostgreSQL source's replication slot (and publication): one per connector."""
        return f"cdc_{self.name}"

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


@dataclass(frozen=True)
class PipelineConfig:
    """The whole configuration file: the destination and the connectors by name, in file order."""

    destination: DestinationConfig
    connectors: Mapping[str, ConnectorConfig] = field(hash=False)
    path: Path

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
    top = _Section(data, path=path)
    top.reject_unknown_fields(_TOP_LEVEL_FIELDS, "the top level")
    top.require(_TOP_LEVEL_FIELDS)
    destination = _parse_destination(_Section(top.mapping("destination"), path, prefix="destination."))
    connectors_data = top.mapping("connectors")
    if not connectors_data:
        raise top.error("connectors", "must define at least one connector")
    connectors: dict[str, ConnectorConfig] = {}
    for name, connector_data in connectors_data.items():
        _check_connector_name(name, path)
        if connector_data is None:
            connector_data = {}
        if not isinstance(connector_data, Mapping):
            raise ConfigError(
                f"{path}: a connector must be a mapping of fields, got {_show(connector_data)}", connector=name
            )
        connectors[name] = _parse_connector(name, _Section(connector_data, path, connector=name))
    return PipelineConfig(destination=destination, connectors=MappingProxyType(connectors), path=path)


def _parse_destination(section: _Section) -> DestinationConfig:
    section.reject_unknown_fields(_DESTINATION_FIELDS, "'destination'")
    section.require(("dsn",))
    return DestinationConfig(
        dsn=Secret(section.string("dsn", secret=True)),
        control_schema=section.identifier("control_schema", default=DEFAULT_CONTROL_SCHEMA),
        lock_timeout_seconds=section.positive_number("lock_timeout_seconds", default=DEFAULT_LOCK_TIMEOUT_SECONDS),
        statement_timeout_seconds=section.positive_number("statement_timeout_seconds",
                                                          default=DEFAULT_STATEMENT_TIMEOUT_SECONDS),
        operator_role=section.identifier("operator_role", default=None),
    )


def _parse_connector(name: str, section: _Section) -> ConnectorConfig:
    section.reject_unknown_fields(_CONNECTOR_FIELDS, "a connector")
    section.require(_REQUIRED_CONNECTOR_FIELDS)
    connector_type = section.choice("type", CONNECTOR_TYPES)
    error_strategy = section.choice("error_strategy", ERROR_STRATEGIES, default="exit")
    return ConnectorConfig(
        name=name,
        type=connector_type,
        hostname=section.string("hostname"),
        port=section.integer("port", default=DEFAULT_PORTS[connector_type], minimum=1, maximum=65535),
        user=section.string("user"),
        password=Secret(section.string("password", secret=True, allow_empty=True)),
        database=section.string("database"),
        tables=section.string_list("tables"),
        snapshot_mode=section.choice("snapshot_mode", SNAPSHOT_MODES, default="initial"),
        batch_size=section.integer("batch_size", default=DEFAULT_BATCH_SIZE, minimum=1, maximum=MAX_BATCH_SIZE),
        apply_batch_events=section.integer("apply_batch_events", default=DEFAULT_APPLY_BATCH_EVENTS, minimum=1,
                                           maximum=MAX_APPLY_BATCH_EVENTS),
        error_strategy=error_strategy,
        schedule=section.cron("schedule", default=DEFAULT_SCHEDULE),
        max_events_per_run=section.integer("max_events_per_run", default=DEFAULT_MAX_EVENTS_PER_RUN, minimum=1),
        max_seconds_per_run=section.positive_number("max_seconds_per_run", default=DEFAULT_MAX_SECONDS_PER_RUN),
        idle_timeout_seconds=section.positive_number("idle_timeout_seconds", default=DEFAULT_IDLE_TIMEOUT_SECONDS),
        letter_casing=section.choice("letter_casing", LETTER_CASINGS, default="lowercase"),
        destination_schema=section.identifier("destination_schema", default=None),
        debezium=MappingProxyType(section.string_mapping("debezium")),
        retry_attempts=section.integer("retry_attempts", default=DEFAULT_RETRY_ATTEMPTS, minimum=1,
                                       maximum=MAX_RETRY_ATTEMPTS),
        retry_backoff_seconds=section.positive_number("retry_backoff_seconds", default=DEFAULT_RETRY_BACKOFF_SECONDS),
        run_retries=section.integer("run_retries", default=DEFAULT_RUN_RETRIES.get(error_strategy, 0), minimum=0,
                                    maximum=MAX_RUN_RETRIES),
        source_lost_timeout_seconds=section.positive_number("source_lost_timeout_seconds",
                                                            default=DEFAULT_SOURCE_LOST_TIMEOUT_SECONDS),
        snapshot_engine=_snapshot_engine(section, connector_type),
        snapshot_chunk_rows=section.integer("snapshot_chunk_rows", default=DEFAULT_SNAPSHOT_CHUNK_ROWS,
                                            minimum=MIN_SNAPSHOT_CHUNK_ROWS),
        trigger=section.choice("trigger", TRIGGERS, default="changes"),
        check_interval_seconds=section.integer("check_interval_seconds", default=DEFAULT_CHECK_INTERVAL_SECONDS,
                                               minimum=1, maximum=3600),
        apply_copy=section.choice("apply_copy", APPLY_COPIERS, default="executors"),
        **_source_tls(section, connector_type),
        source_lock_timeout_seconds=section.positive_number("source_lock_timeout_seconds",
                                                            default=DEFAULT_LOCK_TIMEOUT_SECONDS),
        source_statement_timeout_seconds=section.positive_number("source_statement_timeout_seconds",
                                                                 default=DEFAULT_STATEMENT_TIMEOUT_SECONDS),
    )


def _source_tls(section: _Section, connector_type: str) -> dict[str, Any]:
    """`tls_mode` and `tls_ca_file`: a verifying mode needs the CA file, which must exist; the types whose
    connections the pipeline does not set up take TLS through `debezium:` properties."""
    mode = section.choice("tls_mode", TLS_MODES, default="disable")
    ca_file = section.optional_string("tls_ca_file", None)
    if mode != "disable" and connector_type not in TLS_SOURCE_TYPES:
        raise section.error("tls_mode", f"is for {', '.join(TLS_SOURCE_TYPES)} sources; a {connector_type} "
                                        "connector takes its TLS settings as Debezium properties (debezium:)")
    if mode.startswith("verify") and ca_file is None:
        raise section.error("tls_ca_file", f"is required by tls_mode {mode} (the CA certificate, PEM, that signed "
                                           "the source's certificate)")
    if ca_file is not None and not Path(ca_file).is_file():
        raise section.error("tls_ca_file", f"names no readable file: {ca_file}")
    return {"tls_mode": mode, "tls_ca_file": ca_file}


def _snapshot_engine(section: _Section, connector_type: str) -> str:
    """`spark` by default where the bulk engine reads the source type, else `debezium`; `spark` elsewhere is an
    error naming the types it reads."""
    default = "spark" if connector_type in BULK_SNAPSHOT_TYPES else "debezium"
    engine = section.choice("snapshot_engine", SNAPSHOT_ENGINES, default=default)
    if engine == "spark" and connector_type not in BULK_SNAPSHOT_TYPES:
        raise section.error("snapshot_engine", f"'spark' reads {', '.join(BULK_SNAPSHOT_TYPES)} sources; a "
                                               f"{connector_type} connector takes Debezium's snapshot (debezium)")
    return engine


def _check_connector_name(name: Any, path: Path) -> None:
    if not isinstance(name, str) or not CONNECTOR_NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            f"{path}: invalid connector name {name!r}: it must start with a lowercase letter and hold only "
            "lowercase letters, digits and underscores, at most 63 characters (it becomes the Dagster job "
            "name 'sync_<name>' and a control-table key)",
            connector=str(name),
        )


@dataclass(frozen=True)
class _Section:
    """One mapping of the file, read field by field; every error names the connector and the field."""

    data: Mapping[Any, Any]
    path: Path
    prefix: str = ""
    connector: str | None = None

    def error(self, key: Any, detail: str) -> ConfigError:
        return ConfigError(f"{self.path}: field '{self.prefix}{key}' {detail}", connector=self.connector)

    def reject_unknown_fields(self, known: tuple[str, ...], owner: str) -> None:
        for key in self.data:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(
                    f"{self.path}: unknown field '{self.prefix}{key}'{hint}; {owner} accepts: {', '.join(known)}",
                    connector=self.connector,
                )

    def require(self, keys: tuple[str, ...]) -> None:
        missing = [key for key in keys if self.data.get(key) is None]
        if len(missing) == 1:
            raise self.error(missing[0], "is required")
        if missing:
            names = ", ".join(f"'{self.prefix}{key}'" for key in missing)
            raise ConfigError(f"{self.path}: fields {names} are required", connector=self.connector)

    def mapping(self, key: str) -> Mapping[Any, Any]:
        value = self.data.get(key)
        if not isinstance(value, Mapping):
            raise self.error(key, f"must be a mapping, got {_show(value)}")
        return value

    def expand(self, key: str, text: str) -> str:
        return _expand_variables(text, lambda detail: self.error(key, detail))

    def string(self, key: str, *, secret: bool = False, allow_empty: bool = False) -> str:
        value = self.data.get(key)
        if not isinstance(value, str):
            shown = type(value).__name__ if secret else _show(value)
            raise self.error(key, f"must be a string, got {shown} (quote the value in YAML)")
        value = self.expand(key, value)
        if not value and not allow_empty:
            raise self.error(key, "must not be empty")
        return value

    def optional_string(self, key: str, default: str | None) -> str | None:
        return default if self.data.get(key) is None else self.string(key)

    def choice(self, key: str, choices: tuple[str, ...], default: str | None = None) -> str:
        value = self.optional_string(key, default)
        if value not in choices:
            raise self.error(key, f"must be one of: {', '.join(choices)}; got {value!r}")
        return value

    def identifier(self, key: str, default: str | None) -> str | None:
        value = self.optional_string(key, default)
        if value is not None and len(value) > POSTGRES_IDENTIFIER_MAX_LENGTH:
            limit = POSTGRES_IDENTIFIER_MAX_LENGTH
            raise self.error(key, f"must be at most {limit} characters (a PostgreSQL identifier), got {value!r}")
        return value

    def cron(self, key: str, default: str) -> str:
        value = self.optional_string(key, default)
        if not _is_valid_cron(value):
            raise self.error(key, f"must be a valid 5-field cron expression such as '*/5 * * * *', got {value!r}")
        return value

    def integer(self, key: str, *, default: int, minimum: int, maximum: int | None = None) -> int:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, str):
            value = self.expand(key, value)
        number = _as_integer(value)
        if number is None or number < minimum or (maximum is not None and number > maximum):
            expected = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
            raise self.error(key, f"must be an integer {expected}, got {_show(value)}")
        return number

    def positive_number(self, key: str, *, default: float) -> float:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, str):
            value = self.expand(key, value)
        number = _as_number(value)
        if number is None or number <= 0:
            raise self.error(key, f"must be a number > 0, got {_show(value)}")
        return number

    def string_list(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key)
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.error(key, f"must be a list of names, got {_show(value)}")
        items = []
        for index, item in enumerate(value):
            item_key = f"{key}[{index}]"
            if not isinstance(item, str) or not item.strip():
                raise self.error(item_key, f"must be a non-empty string, got {_show(item)}")
            items.append(self.expand(item_key, item).strip())
        return tuple(items)

    def string_mapping(self, key: str) -> dict[str, str]:
        value = self.data.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.error(key, f"must be a mapping of property names to values, got {_show(value)}")
        properties = {}
        for name, item in value.items():
            item_key = f"{key}.{name}"
            if not isinstance(name, str) or not name:
                raise self.error(item_key, "must have a non-empty string as property name")
            if isinstance(item, bool):
                properties[name] = "true" if item else "false"
            elif isinstance(item, (int, float)):
                properties[name] = str(item)
            elif isinstance(item, str):
                properties[name] = self.expand(item_key, item)
            else:
                shown = type(item).__name__ if _SECRET_PROPERTY.search(name) else _show(item)
                raise self.error(item_key, f"must be a string, number or boolean, got {shown}")
        return properties


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


def _expand_variables(text: str, error: Callable[[str], ConfigError]) -> str:
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


_CRON_FIELDS = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, {m: i + 1 for i, m in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))}),
    ("day of week", 0, 7, {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}),
)
_CRON_MACROS = {"@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually"}


def _is_valid_cron(expression: str) -> bool:
    """A standard 5-field cron expression (the form Dagster schedules accept), or one of its @ macros."""
    text = expression.strip().lower()
    if text in _CRON_MACROS:
        return True
    fields = text.split()
    if len(fields) != 5:
        return False
    return all(_is_valid_cron_field(field, low, high, names) for field, (_, low, high, names) in zip(fields, _CRON_FIELDS))


def _is_valid_cron_field(field: str, low: int, high: int, names: dict[str, int]) -> bool:
    def value(token: str) -> int | None:
        if token in names:
            return names[token]
        return int(token) if token.isdigit() else None

    for part in field.split(","):
        base, _, step = part.partition("/")
        if step and (not step.isdigit() or int(step) == 0):
            return False
        if base == "*":
            continue
        start_text, dash, end_text = base.partition("-")
        start = value(start_text)
        end = value(end_text) if dash else start
        if start is None or end is None or not (low <= start <= end <= high):
            return False
    return True


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
