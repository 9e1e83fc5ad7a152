"""The source tables as external assets upstream of their destination tables, against the suite's servers (no
run: the control schema's records are written as the engine writes them): a rename and a merge by table rules in
the lineage, one source asset for two connectors reading the same table, and the source's row estimates observed
at most every TABLE_OBSERVATION_SECONDS."""

from __future__ import annotations

import psycopg
import pytest
import yaml
from dagster import AssetKey, DagsterInstance

from assets import observations
from assets.definitions import build_definitions
from assets.table_assets import load_replicated_tables
from cdc_pipeline import control
from cdc_pipeline.config import load_config
from cdc_pipeline.ops.tables import read_replicated_tables
from tests.helpers.mariadb_source import new_pipeline

pytestmark = pytest.mark.integration


def _two_connectors(pipe) -> None:
    """The test's connector, and a second one reading the same MariaDB database into its own schema."""
    document = yaml.safe_load(pipe.config_path.read_text())
    first = document["connectors"][pipe.name]
    document["connectors"]["second_" + pipe.name] = {**first, "destination_schema": "second_copy"}
    pipe.config_path.write_text(yaml.safe_dump(document, sort_keys=False))


def _record_tables(pipe, rows: list[tuple[str, str, str, str]]) -> None:
    """Records (connector, source table, destination schema, destination table) as a table's DDL records it: its
    writer (first claim only, `claim_table`) and its columns."""
    with psycopg.connect(pipe.dest_dsn, autocommit=True) as conn:
        control.ensure_control_schema(conn, "cdc")
        for connector, source_table, dest_schema, dest_table in rows:
            conn.execute("INSERT INTO cdc.table_owners (dest_schema, dest_table, connector, source_table) "
                         "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                         (dest_schema, dest_table, connector, source_table))
            conn.execute("INSERT INTO cdc.objmap_columns (connector, source_table, source_column, position, "
                         "source_type, autoincrement, type_map_type, dest_schema, dest_table, dest_column, dest_type) "
                         "VALUES (%s, %s, 'id', 1, 'int', false, 'integer', %s, %s, 'id', 'integer')",
                         (connector, source_table, dest_schema, dest_table))


def test_sources_upstream_with_rename_merge_and_one_asset_per_source_table(mariadb, destination_pg, tmp_path,
                                                                             monkeypatch):
    pipe = new_pipeline(mariadb, destination_pg, tmp_path, monkeypatch)
    _two_connectors(pipe)
    second, db = "second_" + pipe.name, pipe.source_db
    _record_tables(pipe, [
        (pipe.name, f"{db}.orders", pipe.dest_schema, "orders"),
        (pipe.name, f"{db}.customers", pipe.dest_schema, "clients"),  # renamed by a table rule
        (pipe.name, f"{db}.sales_2024", pipe.dest_schema, "sales"),  # two tables merged by table rules
        (pipe.name, f"{db}.sales_2025", pipe.dest_schema, "sales"),
        (second, f"{db}.orders", "second_copy", "orders"),
    ])
    with psycopg.connect(pipe.dest_dsn) as conn:
        tables = read_replicated_tables(conn, "cdc", pipe.name)[pipe.name]
    # The merge is one destination table (one asset), naming both source tables.
    assert [(t.dest_table, t.source_tables) for t in tables] == [
        ("clients", (f"{db}.customers",)), ("orders", (f"{db}.orders",)),
        ("sales", (f"{db}.sales_2024", f"{db}.sales_2025"))]

    graph = build_definitions(load_config(pipe.config_path)).resolve_asset_graph()
    source = {name: AssetKey(["mariadb", db, name]) for name in ("orders", "customers", "sales_2024", "sales_2025")}
    assert graph.get(AssetKey([pipe.dest_schema, "orders"])).parent_keys == {source["orders"]}
    assert graph.get(AssetKey(["second_copy", "orders"])).parent_keys == {source["orders"]}
    assert graph.get(AssetKey([pipe.dest_schema, "clients"])).parent_keys == {source["customers"]}
    assert graph.get(AssetKey([pipe.dest_schema, "sales"])).parent_keys == {source["sales_2024"], source["sales_2025"]}
    # Each source table once, external (nothing materializes it), downstream of nothing.
    specs = [key for key in graph.get_all_asset_keys() if key.path[0] == "mariadb"]
    assert sorted(specs, key=str) == sorted(source.values(), key=str)
    assert all(graph.get(key).is_external and not graph.get(key).parent_keys for key in specs)
    assert graph.get(source["orders"]).child_keys == {AssetKey([pipe.dest_schema, "orders"]),
                                                      AssetKey(["second_copy", "orders"])}


def test_source_row_estimates_observed_at_most_every_interval(mariadb, destination_pg, tmp_path, monkeypatch):
    pipe = new_pipeline(mariadb, destination_pg, tmp_path, monkeypatch)
    pipe.source(["CREATE TABLE orders (id INT PRIMARY KEY)", "INSERT INTO orders SELECT seq FROM " + pipe.numbers(120),
                 "ANALYZE TABLE orders"])
    _record_tables(pipe, [(pipe.name, f"{pipe.source_db}.orders", pipe.dest_schema, "orders")])
    config = load_config(pipe.config_path)
    connector, key = config.connector(pipe.name), AssetKey(["mariadb", pipe.source_db, "orders"])
    tables = load_replicated_tables(config)[pipe.name]  # the definitions' tables, as the change sensor has them
    with DagsterInstance.ephemeral() as instance:
        [observation] = observations.source_row_observations(instance, connector, tables)
        assert observation.asset_key == key
        assert observation.metadata["dagster/row_count"].value == 120
        assert observation.metadata["row_count_estimated"].value is True
        instance.report_runless_asset_event(observation)
        assert observations.source_row_observations(instance, connector, tables) == []
        monkeypatch.setattr(observations, "TABLE_OBSERVATION_SECONDS", 0)
        assert len(observations.source_row_observations(instance, connector, tables)) == 1
