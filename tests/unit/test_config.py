"""Unit tests for the connectors configuration: loading, ${VAR} expansion, validation errors and secrets."""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cdc_pipeline.config import (
    CONNECTOR_TYPES,
    DEFAULT_PORTS,
    ConnectorConfig,
    PipelineConfig,
    Secret,
    config_path,
    load_config,
    parse_config,
    redact_dsn,
)
from cdc_pipeline.errors import ConfigError
from tests.helpers import PROJECT_ROOT

CONFIG_PATH = Path("/etc/cdc/connectors.yaml")
DEST_PASSWORD = "dest-pw-Zq81"
SOURCE_PASSWORD = "source-pw-Xy42"
DEBEZIUM_PASSWORD = "keystore-pw-Kk77"

MINIMAL_YAML = """\
destination:
  dsn: ${CDC_DEST_DSN}
connectors:
  inventory:
    type: mariadb
    hostname: 127.0.0.1
    user: dbz
    password: ${INVENTORY_PASSWORD}
    database: inventory
"""


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CDC_PIPELINE_CONFIG", raising=False)
    monkeypatch.setenv("CDC_DEST_DSN", f"postgresql://cdc:{DEST_PASSWORD}@localhost:5432/warehouse")
    monkeypatch.setenv("INVENTORY_PASSWORD", SOURCE_PASSWORD)


def valid_data() -> dict[str, Any]:
    return {
        "destination": {"dsn": f"host=localhost dbname=warehouse user=cdc password={DEST_PASSWORD}"},
        "connectors": {
            "inventory": {
                "type": "mariadb",
                "hostname": "127.0.0.1",
                "user": "dbz",
                "password": SOURCE_PASSWORD,
                "database": "inventory",
            }
        },
    }


def with_connector_field(key: str, value: Any) -> dict[str, Any]:
    data = valid_data()
    data["connectors"]["inventory"][key] = value
    return data


def write_config(directory: Path, text: str, name: str = "connectors.yaml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def config_error(data: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, CONFIG_PATH)
    return caught.value


def test_minimal_file_gets_every_default(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, MINIMAL_YAML))

    assert config.path == tmp_path / "connectors.yaml"
    assert config.destination.dsn.reveal() == f"postgresql://cdc:{DEST_PASSWORD}@localhost:5432/warehouse"
    assert config.destination.control_schema == "cdc"
    assert list(config.connectors) == ["inventory"]
    connector = config.connector("inventory")
    assert connector.name == "inventory"
    assert connector.type == "mariadb"
    assert connector.hostname == "127.0.0.1"
    assert connector.port == 3306
    assert connector.user == "dbz"
    assert connector.password.reveal() == SOURCE_PASSWORD
    assert connector.database == "inventory"
    assert connector.tables == ()
    assert connector.snapshot_mode == "initial"
    assert connector.on_position_lost == "fail"
    assert connector.batch_size == 2048
    assert connector.error_strategy == "exit"
    assert (connector.retry_attempts, connector.retry_backoff_seconds) == (3, 1.0)
    assert connector.schedule == "* * * * *"
    assert connector.max_events_per_run is None  # a run is bounded by time
    assert connector.max_seconds_per_run == 300.0
    assert connector.idle_timeout_seconds == 1.0
    assert (connector.run_retries, connector.source_lost_timeout_seconds) == (0, 150.0)
    assert connector.letter_casing == "lowercase"
    assert connector.destination_schema is None
    assert dict(connector.debezium) == {}


def test_every_field_set_explicitly(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        """\
        destination:
          dsn: host=db dbname=warehouse
          control_schema: replication
        connectors:
          sales_2:
            type: postgres
            hostname: sales.internal
            port: 6543
            user: replicator
            password: "0123"
            database: sales
            tables: [public.orders, public.customers]
            snapshot_mode: no_data
            on_position_lost: snapshot
            batch_size: 500
            error_strategy: skip
            schedule: "*/5 * * * *"
            max_events_per_run: 10
            max_seconds_per_run: 12.5
            idle_timeout_seconds: 0.5
            source_lost_timeout_seconds: 9
            run_retries: 4
            letter_casing: asis
            destination_schema: Sales
            debezium:
              plugin.name: pgoutput
              snapshot.delay.ms: 1000
              provide.transaction.metadata: true
        """,
    )

    connector = load_config(path).connector("sales_2")

    assert connector.port == 6543
    assert connector.password.reveal() == "0123"
    assert connector.tables == ("public.orders", "public.customers")
    assert (connector.snapshot_mode, connector.error_strategy, connector.letter_casing) == ("no_data", "skip", "asis")
    assert connector.on_position_lost == "snapshot"
    assert (connector.batch_size, connector.max_events_per_run) == (500, 10)
    assert (connector.max_seconds_per_run, connector.idle_timeout_seconds) == (12.5, 0.5)
    assert connector.schedule == "*/5 * * * *"
    assert (connector.run_retries, connector.source_lost_timeout_seconds) == (4, 9.0)
    assert connector.destination_schema == "Sales"
    assert dict(connector.debezium) == {
        "plugin.name": "pgoutput",
        "snapshot.delay.ms": "1000",
        "provide.transaction.metadata": "true",
    }


@pytest.mark.parametrize("connector_type", CONNECTOR_TYPES)
def test_default_port_depends_on_type(connector_type: str) -> None:
    config = parse_config(with_connector_field("type", connector_type), CONFIG_PATH)

    assert config.connector("inventory").port == DEFAULT_PORTS[connector_type]


def test_default_ports() -> None:
    assert dict(DEFAULT_PORTS) == {"mariadb": 3306, "mysql": 3306, "postgres": 5432, "sqlserver": 1433, "oracle": 1521}


def test_example_file_is_valid() -> None:
    example = PROJECT_ROOT / "dagster_home" / "connectors.example.yaml"

    config = load_config(example)

    assert list(config.connectors) == ["inventory"]
    assert config.connector("inventory").password.reveal() == SOURCE_PASSWORD


def test_variables_expand_with_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_HOST", "db.internal")
    monkeypatch.setenv("EMPTY_VALUE", "")
    monkeypatch.delenv("SOURCE_PORT", raising=False)
    monkeypatch.delenv("SOURCE_USER", raising=False)
    data = valid_data()
    data["connectors"]["inventory"].update(
        {
            "hostname": "${SOURCE_HOST}",
            "port": "${SOURCE_PORT:-3307}",
            "user": "${SOURCE_USER:-dbz}_${EMPTY_VALUE:-ro}",
            "database": "$${literal}",
            "tables": ["${SOURCE_DB:-inventory}.orders"],
            "debezium": {"database.ssl.mode": "${SSL_MODE:-required}"},
        }
    )

    connector = parse_config(data, CONFIG_PATH).connector("inventory")

    assert connector.hostname == "db.internal"
    assert connector.port == 3307
    assert connector.user == "dbz_ro"
    assert connector.database == "${literal}"
    assert connector.tables == ("inventory.orders",)
    assert connector.debezium["database.ssl.mode"] == "required"


def test_empty_default_gives_empty_string(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_PASSWORD", raising=False)

    connector = parse_config(with_connector_field("password", "${NO_PASSWORD:-}"), CONFIG_PATH).connector("inventory")

    assert connector.password.reveal() == ""


def test_undefined_variable_names_variable_connector_and_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INVENTORY_PASSWORD")

    error = config_error(with_connector_field("password", "${INVENTORY_PASSWORD}"))

    assert error.connector == "inventory"
    assert "'INVENTORY_PASSWORD'" in str(error)
    assert "field 'password'" in str(error)
    assert "undefined" in str(error)


def test_undefined_variable_in_destination_names_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CDC_DEST_DSN")
    data = valid_data()
    data["destination"]["dsn"] = "${CDC_DEST_DSN}"

    error = config_error(data)

    assert error.connector is None
    assert "field 'destination.dsn'" in str(error) and "'CDC_DEST_DSN'" in str(error)


@pytest.mark.parametrize("text", ["${UNCLOSED", "${1BAD}", "${BAD-default}"])
def test_malformed_variable_reference_is_an_error(text: str) -> None:
    error = config_error(with_connector_field("hostname", text))

    assert error.connector == "inventory"
    assert "field 'hostname'" in str(error)


@pytest.mark.parametrize(
    ("key", "value", "expected_field", "expected_detail"),
    [
        ("type", "mongodb", "type", "mariadb, mysql, postgres, sqlserver, oracle"),
        ("type", None, "type", "is required"),
        ("port", "abc", "port", "must be an integer between 1 and 65535, got 'abc'"),
        ("port", 0, "port", "between 1 and 65535"),
        ("port", 70000, "port", "between 1 and 65535"),
        ("port", True, "port", "integer"),
        ("hostname", 12, "hostname", "must be a string"),
        ("hostname", "", "hostname", "must not be empty"),
        ("tables", "inventory.orders", "tables", "must be a list"),
        ("tables", ["inventory.orders", 5], "tables[1]", "non-empty string"),
        ("snapshot_mode", "schema_only", "snapshot_mode", "must be one of"),
        ("batch_size", 0, "batch_size", "between 1 and 100000"),
        ("batch_size", 100001, "batch_size", "between 1 and 100000"),
        ("batch_size", 2.5, "batch_size", "integer"),
        ("error_strategy", "ignore", "error_strategy", "exit, retry, skip"),
        ("on_position_lost", "skip", "on_position_lost", "fail, snapshot"),
        ("retry_attempts", 0, "retry_attempts", "between 1 and 20"),
        ("retry_attempts", 21, "retry_attempts", "between 1 and 20"),
        ("retry_backoff_seconds", 0, "retry_backoff_seconds", "> 0"),
        ("max_events_per_run", 0, "max_events_per_run", ">= 1"),
        ("max_seconds_per_run", 0, "max_seconds_per_run", "> 0"),
        ("max_seconds_per_run", "soon", "max_seconds_per_run", "> 0"),
        ("idle_timeout_seconds", -1, "idle_timeout_seconds", "> 0"),
        ("letter_casing", "UPPER", "letter_casing", "lowercase, asis"),
        ("destination_schema", "s" * 64, "destination_schema", "63 characters"),
        ("debezium", ["a"], "debezium", "mapping"),
        ("debezium", {"column.include.list": ["a"]}, "debezium.column.include.list", "string, number or boolean"),
        ("prot", 3306, "prot", "did you mean 'port'"),
        ("run_retries", 11, "run_retries", "between 0 and 10"),
        ("source_lost_timeout_seconds", 0, "source_lost_timeout_seconds", "> 0"),
        ("apply_copy", "python", "apply_copy", "executors, driver"),
        ("tls_mode", "prefer", "tls_mode", "disable, require, verify-ca, verify-full"),
        ("tls_mode", "verify-full", "tls_ca_file", "required by tls_mode verify-full"),
        ("tls_ca_file", "/nonexistent/ca.pem", "tls_ca_file", "names no readable file"),
    ],
)
def test_bad_connector_field_names_connector_and_field(
    key: str, value: Any, expected_field: str, expected_detail: str
) -> None:
    error = config_error(with_connector_field(key, value))

    assert isinstance(error, ConfigError)
    assert error.connector == "inventory"
    assert f"'{expected_field}'" in str(error)
    assert expected_detail in str(error)
    assert "connector 'inventory'" in str(error)
    assert str(CONFIG_PATH) in str(error)


@pytest.mark.parametrize("missing", ["type", "hostname", "user", "password", "database"])
def test_missing_required_field_is_named(missing: str) -> None:
    data = valid_data()
    del data["connectors"]["inventory"][missing]

    error = config_error(data)

    assert error.connector == "inventory"
    assert f"field '{missing}' is required" in str(error)


def test_all_missing_required_fields_are_listed() -> None:
    data = valid_data()
    data["connectors"]["inventory"] = None

    error = config_error(data)

    assert error.connector == "inventory"
    for field_name in ("type", "hostname", "user", "password"):
        assert f"'{field_name}'" in str(error)
    data["connectors"]["inventory"] = {"type": "mariadb", "hostname": "db", "user": "u", "password": "p"}
    assert "field 'database' is required (or `databases`" in str(config_error(data)), "then the database"


def test_wrong_password_type_does_not_echo_the_value() -> None:
    error = config_error(with_connector_field("password", 918273645))

    assert "field 'password' must be a string" in str(error)
    assert "918273645" not in str(error)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda data: data.update(extra=1), "unknown field 'extra'"),
        (lambda data: data.pop("destination"), "field 'destination' is required"),
        (lambda data: data.update(destination="dsn"), "field 'destination' must be a mapping"),
        (lambda data: data["destination"].pop("dsn"), "field 'destination.dsn' is required"),
        (lambda data: data["destination"].update(dsn=""), "field 'destination.dsn' must not be empty"),
        (lambda data: data["destination"].update(schema="x"), "unknown field 'destination.schema'"),
        (lambda data: data["destination"].update(control_schema=""), "field 'destination.control_schema'"),
        (lambda data: data.update(connectors={}), "field 'connectors' must define at least one connector"),
        (lambda data: data.pop("connectors"), "field 'connectors' is required"),
        (lambda data: data.update(connectors=["inventory"]), "field 'connectors' must be a mapping"),
    ],
)
def test_bad_top_level_or_destination_names_field(mutate: Any, expected: str) -> None:
    data = valid_data()
    mutate(data)

    error = config_error(data)

    assert expected in str(error)
    assert error.connector is None


@pytest.mark.parametrize("data", [None, [], "text"])
def test_top_level_must_be_a_mapping(data: Any) -> None:
    error = config_error(data)

    assert str(CONFIG_PATH) in str(error)


def test_connector_must_be_a_mapping() -> None:
    data = valid_data()
    data["connectors"]["inventory"] = "mariadb"

    error = config_error(data)

    assert error.connector == "inventory"
    assert "must be a mapping" in str(error)


@pytest.mark.parametrize("name", ["inventory", "a", "db_2", "a" * 63])
def test_valid_connector_names(name: str) -> None:
    data = valid_data()
    data["connectors"] = {name: data["connectors"]["inventory"]}

    assert list(parse_config(data, CONFIG_PATH).connectors) == [name]


@pytest.mark.parametrize("name", ["Inventory", "2db", "_db", "my-db", "my db", "a" * 64, "", 7])
def test_invalid_connector_names(name: Any) -> None:
    data = valid_data()
    data["connectors"] = {name: data["connectors"]["inventory"]}

    error = config_error(data)

    assert error.connector == str(name)
    assert "invalid connector name" in str(error)


def test_secret_hides_its_value() -> None:
    secret = Secret("hunter2")

    assert str(secret) == "***"
    assert repr(secret) == "***"
    assert f"{secret}" == "***"
    assert secret.reveal() == "hunter2"
    assert secret == Secret("hunter2")
    assert secret != Secret("other")


def test_secrets_never_appear_in_repr_str_or_redacted() -> None:
    data = valid_data()
    data["connectors"]["inventory"]["debezium"] = {
        "database.ssl.keystore.password": DEBEZIUM_PASSWORD,
        "snapshot.delay.ms": 5,
    }
    config = parse_config(data, CONFIG_PATH)
    connector = config.connector("inventory")

    texts = [
        repr(config),
        str(config),
        repr(config.destination),
        str(config.destination),
        repr(connector),
        str(connector),
        repr(connector.redacted()),
        repr(config.redacted()),
        repr(config.destination.redacted()),
    ]
    for text in texts:
        for secret in (SOURCE_PASSWORD, DEST_PASSWORD, DEBEZIUM_PASSWORD):
            assert secret not in text

    redacted = connector.redacted()
    assert redacted["password"] == "***"
    assert redacted["debezium"] == {"database.ssl.keystore.password": "***", "snapshot.delay.ms": "5"}
    assert redacted["tables"] == []
    assert redacted["port"] == 3306 and redacted["name"] == "inventory"
    assert config.destination.redacted()["dsn"] == "host=localhost dbname=warehouse user=cdc password=***"


def test_redacted_holds_every_field_as_plain_data() -> None:
    connector = parse_config(valid_data(), CONFIG_PATH).connector("inventory")

    redacted = connector.redacted()

    assert set(redacted) == set(ConnectorConfig.__dataclass_fields__)
    assert all(isinstance(value, (str, int, float, list, dict, type(None))) for value in redacted.values())


def test_configs_are_frozen_and_hashable() -> None:
    config = parse_config(valid_data(), CONFIG_PATH)
    connector = config.connector("inventory")

    with pytest.raises(AttributeError):
        connector.port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        connector.debezium["x"] = "y"  # type: ignore[index]
    assert hash(connector) == hash(parse_config(copy.deepcopy(valid_data()), CONFIG_PATH).connector("inventory"))
    assert isinstance(config, PipelineConfig)


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://cdc:s3cret@db:5432/warehouse", "postgresql://cdc:***@db:5432/warehouse"),
        ("postgres://cdc:p%40ss@db/warehouse?sslmode=require", "postgres://cdc:***@db/warehouse?sslmode=require"),
        ("postgresql://cdc@db/warehouse", "postgresql://cdc@db/warehouse"),
        ("postgresql://db/warehouse?user=cdc&password=s3cret", "postgresql://db/warehouse?user=cdc&password=***"),
        ("postgresql://cdc:pw@h1:5432,h2:5433/warehouse", "postgresql://cdc:***@h1:5432,h2:5433/warehouse"),
        ("host=db dbname=warehouse password=s3cret user=cdc", "host=db dbname=warehouse password=*** user=cdc"),
        ("host=db password = 's3 cr\\'et' user=cdc", "host=db password = *** user=cdc"),
        ("host=db sslpassword=keypw", "host=db sslpassword=***"),
        ("host=db dbname=warehouse", "host=db dbname=warehouse"),
    ],
)
def test_redact_dsn(dsn: str, expected: str) -> None:
    assert redact_dsn(dsn) == expected


def test_unknown_connector_lists_known_names() -> None:
    config = parse_config(valid_data(), CONFIG_PATH)

    with pytest.raises(ConfigError) as caught:
        config.connector("sales")

    assert caught.value.connector == "sales"
    assert "inventory" in str(caught.value)


def test_config_path_defaults_and_honours_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert config_path() == Path("dagster_home/connectors.yaml")

    custom = write_config(tmp_path, MINIMAL_YAML, name="custom.yaml")
    monkeypatch.setenv("CDC_PIPELINE_CONFIG", str(custom))

    assert config_path() == custom
    assert load_config().path == custom


def test_default_path_is_relative_to_current_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "dagster_home").mkdir()
    write_config(tmp_path / "dagster_home", MINIMAL_YAML)
    monkeypatch.chdir(tmp_path)

    assert load_config().path == tmp_path / "dagster_home" / "connectors.yaml"


def test_missing_file_names_path_and_environment_variable(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"

    with pytest.raises(ConfigError) as caught:
        load_config(missing)

    assert str(missing) in str(caught.value)
    assert "CDC_PIPELINE_CONFIG" in str(caught.value)


def test_yaml_syntax_error_names_path(tmp_path: Path) -> None:
    path = write_config(tmp_path, "destination:\n  dsn: [unclosed\nconnectors: {}\n")

    with pytest.raises(ConfigError) as caught:
        load_config(path)

    assert str(path) in str(caught.value)
    assert "invalid YAML" in str(caught.value)


def test_duplicate_connector_is_a_yaml_error(tmp_path: Path) -> None:
    path = write_config(tmp_path, MINIMAL_YAML + "  inventory:\n    type: mysql\n")

    with pytest.raises(ConfigError) as caught:
        load_config(path)

    assert "duplicate key 'inventory'" in str(caught.value)


def test_merge_keys_may_override_shared_defaults(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        """\
        destination:
          dsn: host=db
        connectors:
          inventory: &source
            type: mariadb
            hostname: db
            user: dbz
            password: pw
            database: inventory
          sales:
            <<: *source
            database: sales
            port: 3307
        """,
    )

    config = load_config(path)

    assert config.connector("sales").database == "sales"
    assert config.connector("sales").port == 3307
    assert config.connector("sales").hostname == "db"


def test_the_root_cause_of_a_looping_exception_chain_is_found() -> None:
    from cdc_pipeline.ops.cli import _root_cause
    from cdc_pipeline.errors import CdcError

    first, second = RuntimeError("first"), RuntimeError("second")
    first.__context__, second.__context__ = second, first
    assert _root_cause(first) is first, "a loop without a pipeline error ends at the outermost exception"
    cause = CdcError("the pipeline's own", connector="c")
    second.__cause__ = cause
    assert _root_cause(first) is cause


@pytest.mark.parametrize("connector_type, engine", [("mariadb", "spark"), ("mysql", "spark"),
                                                    ("postgres", "spark"), ("sqlserver", "debezium"),
                                                    ("oracle", "debezium")])
def test_the_snapshot_engine_defaults_to_the_bulk_engine_where_it_reads_the_source(connector_type: str,
                                                                                  engine: str) -> None:
    connector = parse_config(with_connector_field("type", connector_type), CONFIG_PATH).connector("inventory")

    assert (connector.snapshot_engine, connector.bulk_snapshot) == (engine, engine == "spark")
    assert connector.snapshot_chunk_rows == 50_000


def test_the_bulk_engine_is_refused_for_a_source_it_does_not_read() -> None:
    data = with_connector_field("type", "sqlserver")
    data["connectors"]["inventory"]["snapshot_engine"] = "spark"

    message = str(config_error(data))

    assert "snapshot_engine" in message and "mariadb, mysql, postgres" in message and "inventory" in message


@pytest.mark.parametrize("key, value", [("snapshot_engine", "fdw"), ("snapshot_chunk_rows", 10)])
def test_bad_snapshot_engine_settings_are_named(key: str, value: Any) -> None:
    assert key in str(config_error(with_connector_field(key, value)))


@pytest.mark.parametrize("dsn, secret", [
    ("postgresql://u:s3cr%t@127.0.0.1:9/d", "s3cr%t"),  # a bad percent-escape: psycopg quotes the token
    ("postgresql://u:p%40ss@127.0.0.1:9/d", "p@ss"),
    ("postgresql://u@127.0.0.1:9/d?password=hunter2&sslmode=disable", "hunter2"),
    ("host=127.0.0.1 port=9 dbname=d password='my secret'", "my secret"),
    ("host=127.0.0.1 port=9 dbname=d password=plain-pw", "plain-pw"),
])
def test_a_destination_that_cannot_be_reached_or_parsed_names_no_password(dsn: str, secret: str) -> None:
    from cdc_pipeline.config import DestinationConfig, Secret
    from cdc_pipeline.errors import CdcError

    with pytest.raises(CdcError) as error:
        DestinationConfig(dsn=Secret(dsn), control_schema="cdc").connect("inventory", connect_timeout=2)
    message = str(error.value)
    assert message.startswith("cannot connect to the destination PostgreSQL") and "inventory" in message
    assert secret not in message.replace("***", ""), message


def test_the_cli_prints_no_password_of_a_destination_dsn_it_cannot_parse(tmp_path: Path, monkeypatch, capsys) -> None:
    from cdc_pipeline.ops.cli import main

    path = tmp_path / "c.yaml"
    path.write_text("destination:\n  dsn: postgresql://u:s3cr%t@127.0.0.1:9/d\nconnectors:\n  inventory:\n"
                    "    type: mariadb\n    hostname: h\n    user: u\n    password: p\n    database: inventory\n")
    assert main(["--config", str(path), "state"]) == 2
    err = capsys.readouterr().err
    assert "cannot connect to the destination PostgreSQL" in err and "s3cr" not in err, err


@pytest.mark.parametrize("connector_type, mode, expected", [
    ("mariadb", "disable", {"database.ssl.mode": "disable"}),
    ("mariadb", "require", {"database.ssl.mode": "trust"}),
    ("mysql", "require", {"database.ssl.mode": "required"}),
    ("postgres", "verify-ca", {"database.sslmode": "verify-ca"}),
])
def test_the_source_tls_mode_reaches_debezium_under_its_own_names(connector_type, mode, expected, tmp_path) -> None:
    from cdc_pipeline.capture.runner import debezium_properties

    ca_file = tmp_path / "ca.pem"
    ca_file.write_text("not read here")
    data = with_connector_field("type", connector_type)
    data["connectors"]["inventory"]["tls_mode"] = mode
    if mode.startswith("verify"):
        data["connectors"]["inventory"]["tls_ca_file"] = str(ca_file)
    config = parse_config(data, CONFIG_PATH)

    properties = debezium_properties(config.connector("inventory"), config.destination)

    assert {key: properties[key] for key in expected} == expected
    if connector_type == "postgres":
        assert properties["database.sslrootcert"] == str(ca_file)


def test_the_engine_stop_waits_a_second_for_debezium_threads_unless_the_file_says_otherwise() -> None:
    from cdc_pipeline.capture.runner import debezium_properties

    data = valid_data()
    default = parse_config(data, CONFIG_PATH)
    data["connectors"]["inventory"]["debezium"] = {"executor.shutdown.timeout.ms": 4000}
    chosen = parse_config(data, CONFIG_PATH)

    assert debezium_properties(default.connector("inventory"), default.destination)[
        "executor.shutdown.timeout.ms"] == "1000"
    assert debezium_properties(chosen.connector("inventory"), chosen.destination)[
        "executor.shutdown.timeout.ms"] == "4000"


def test_tls_is_refused_for_sources_whose_connections_the_pipeline_does_not_make() -> None:
    data = with_connector_field("type", "sqlserver")
    data["connectors"]["inventory"]["tls_mode"] = "require"
    error = config_error(data)

    assert "'tls_mode'" in str(error) and "debezium:" in str(error)


def test_the_spark_section_names_the_cluster_of_every_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_SECRET", "spark-secret-31")
    data = valid_data()
    data["spark"] = {"master": "spark://10.0.0.5:7077",
                     "conf": {"spark.executor.memory": "4g", "spark.executor.cores": 2,
                              "spark.authenticate": True, "spark.authenticate.secret": "${SPARK_SECRET}"}}

    spark = parse_config(data, CONFIG_PATH).spark

    assert spark.master == "spark://10.0.0.5:7077"
    assert dict(spark.conf) == {"spark.executor.memory": "4g", "spark.executor.cores": "2",
                                "spark.authenticate": "true", "spark.authenticate.secret": "spark-secret-31"}
    assert "spark-secret-31" not in repr(parse_config(data, CONFIG_PATH).redacted())


def test_without_a_spark_section_runs_use_the_environment_master_else_local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CDC_SPARK_MASTER", raising=False)
    assert parse_config(valid_data(), CONFIG_PATH).spark.master == "local[*]"

    monkeypatch.setenv("CDC_SPARK_MASTER", "spark://127.0.0.1:7077")
    assert parse_config(valid_data(), CONFIG_PATH).spark.master == "spark://127.0.0.1:7077"
    assert dict(parse_config(valid_data(), CONFIG_PATH).spark.conf) == {}


@pytest.mark.parametrize(
    ("spark", "expected"),
    [
        ({"mastr": "local[2]"}, "unknown field 'spark.mastr' (did you mean 'master'?); 'spark' accepts: master, conf"),
        ({"master": ""}, "field 'spark.master' must not be empty"),
        ({"master": 7077}, "field 'spark.master' must be a string"),
        ({"conf": ["spark.executor.memory=4g"]}, "field 'spark.conf' must be a mapping"),
        ({"conf": {"executor.memory": "4g"}}, "field 'spark.conf.executor.memory' is not a spark property"),
        ({"conf": {"spark.executor.memory": ["4g"]}}, "field 'spark.conf.spark.executor.memory' must be a string, "
                                                      "number or boolean"),
        ("local", "field 'spark' must be a mapping"),
    ],
)
def test_a_bad_spark_section_names_the_field(spark: Any, expected: str) -> None:
    data = valid_data()
    data["spark"] = spark

    error = config_error(data)

    assert expected in str(error), str(error)
    assert error.connector is None


def test_values_given_in_code_are_not_expanded_again() -> None:
    connector = parse_config(with_connector_field("hostname", "db-$${literal}"), CONFIG_PATH).connector("inventory")
    assert connector.hostname == "db-${literal}"

    import dataclasses

    assert dataclasses.replace(connector, snapshot_mode="always").hostname == "db-${literal}"


def test_dependent_defaults_follow_the_fields_they_depend_on() -> None:
    postgres = with_connector_field("type", "postgres")
    postgres["connectors"]["inventory"]["error_strategy"] = "retry"
    connector = parse_config(postgres, CONFIG_PATH).connector("inventory")

    assert (connector.port, connector.snapshot_engine, connector.run_retries) == (5432, "spark", 2)
    sqlserver = parse_config(with_connector_field("type", "sqlserver"), CONFIG_PATH).connector("inventory")
    assert (sqlserver.port, sqlserver.snapshot_engine, sqlserver.run_retries) == (1433, "debezium", 0)


def test_a_field_written_with_nothing_after_it_takes_its_default() -> None:
    data = with_connector_field("batch_size", None)
    data["destination"]["control_schema"] = None

    config = parse_config(data, CONFIG_PATH)

    assert config.connector("inventory").batch_size == 2048 and config.destination.control_schema == "cdc"


def shards(eu: dict[str, Any], us: dict[str, Any]) -> dict[str, Any]:
    """Two connectors on one destination: the shards `eu` and `us`, each reading its own server."""
    data = valid_data()
    source = data["connectors"].pop("inventory")
    data["connectors"] = {"eu": {**source, "hostname": "eu-db", **eu}, "us": {**source, "hostname": "us-db", **us}}
    return data


@pytest.mark.parametrize("eu, us, shared", [
    ({"database": "shop"}, {"database": "shop"}, "every table of schema shop"),
    ({"database": "shop"}, {"database": "Shop"}, "every table of schema shop"),  # lower-cased, one schema
    ({"database": "shop"}, {"database": "sales", "destination_schema": "shop"}, "every table of schema shop"),
    ({"database": "shop", "tables": ["shop.orders"]}, {"database": "shop"}, "table shop.orders"),
    ({"type": "postgres", "database": "eu", "tables": ["public.orders"]},
     {"type": "postgres", "database": "us", "tables": ["public.orders", "public.items"]}, "table public.orders"),
])
def test_connectors_writing_one_destination_table_are_refused_naming_both(eu, us, shared) -> None:
    error = config_error(shards(eu, us))

    assert "'eu' and 'us' both write" in str(error) and shared in str(error)
    assert error.connector == "us"


@pytest.mark.parametrize("eu, us", [
    ({"database": "shop"}, {"database": "shop", "destination_schema": "shop_us"}),
    ({"database": "shop", "tables": ["shop.orders"]}, {"database": "shop", "tables": ["shop.items"]}),
    ({"database": "shop", "letter_casing": "asis"}, {"database": "Shop", "letter_casing": "asis"}),
    # The schemas of a PostgreSQL source without `tables` are known when it runs (rule_store.claim_table).
    ({"type": "postgres", "database": "eu"}, {"type": "postgres", "database": "us"}),
])
def test_connectors_with_their_own_destination_tables_are_accepted(eu, us) -> None:
    assert set(parse_config(shards(eu, us), CONFIG_PATH).connectors) == {"eu", "us"}


def test_apply_batch_mb_bounds_debezium_s_queue_by_bytes() -> None:
    from cdc_pipeline.capture.runner import debezium_properties

    config = parse_config(with_connector_field("apply_batch_mb", 16), CONFIG_PATH)
    properties = debezium_properties(config.connector("inventory"), config.destination)

    assert properties["max.queue.size.in.bytes"] == str(16 << 20)
    with pytest.raises(ConfigError, match="apply_batch_mb"):
        parse_config(with_connector_field("apply_batch_mb", 0), CONFIG_PATH)
