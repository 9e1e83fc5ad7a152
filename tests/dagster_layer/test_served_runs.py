"""A Dagster run of `sync_<name>` asks the pipeline server for its cycle when CDC_PIPELINE_SERVER names one that
listens: the cycle runs there, and the run still records the connector's and each changed table's
materialization, with the cycle's numbers."""

from __future__ import annotations

import pytest
from dagster import AssetKey, DagsterInstance

from assets.definitions import build_definitions
from cdc_pipeline.config import load_config
from tests.helpers.pipeline_server import running_server

pytestmark = pytest.mark.integration


def _run(pipeline, instance: DagsterInstance):
    job = build_definitions(load_config(pipeline.config_path)).resolve_job_def(f"sync_{pipeline.name}")
    return job.execute_in_process(instance=instance)


def test_a_dagster_run_has_its_cycle_run_by_the_server_and_records_its_assets(pipeline, tmp_path, monkeypatch):
    pipeline.source(["CREATE TABLE items (id INT PRIMARY KEY, label VARCHAR(20))",
                     "INSERT INTO items VALUES (1, 'a'), (2, 'b'), (3, 'c')"])
    with running_server(pipeline.env, tmp_path) as server:
        for key, value in server.env.items():
            monkeypatch.setenv(key, value)
        with DagsterInstance.ephemeral() as instance:
            loaded = _run(pipeline, instance)
            pipeline.source(["UPDATE items SET label = 'x' WHERE id = 2", "DELETE FROM items WHERE id = 3"])
            streamed = _run(pipeline, instance)
            connector = instance.get_latest_materialization_event(AssetKey(["cdc", pipeline.name]))
            table = instance.get_latest_materialization_event(AssetKey([pipeline.dest_schema, "items"]))
            messages = [entry.user_message for entry in instance.all_logs(streamed.run_id)]

    assert loaded.success and streamed.success
    assert any(message.startswith("the cycle ran on the pipeline server at") for message in messages)
    assert connector is not None and connector.run_id == streamed.run_id
    metadata = connector.asset_materialization.metadata
    assert (metadata["updates"].value, metadata["deletes"].value) == (1, 1)
    assert "consistent_as_of" in metadata
    assert table is not None and table.run_id == streamed.run_id
    table_metadata = table.asset_materialization.metadata
    assert (table_metadata["updates"].value, table_metadata["deletes"].value) == (1, 1)
    assert table_metadata["dagster/row_count"].value == 2
    pipeline.assert_same("items")
