"""The table assets' check `matches_source` against real servers: its job, schedule and after-load sensor, a pass on
equal tables, and a failure naming the key of a row changed behind the pipeline's back."""

from __future__ import annotations

import psycopg
import pytest
from dagster import AssetKey, DagsterInstance, Definitions, RunRequest, SkipReason, build_sensor_context

from assets.definitions import build_definitions
from assets.verify_checks import VERIFY_CHECK
from cdc_pipeline.config import load_config
from resources.destination import DestinationResource

pytestmark = pytest.mark.integration


def _evaluations(result) -> dict[AssetKey, object]:
    return {evaluation.asset_key: evaluation for evaluation in result.get_asset_check_evaluations()}


def test_verify_check_passes_on_equal_tables_and_names_a_tampered_key(pipeline):
    pipeline.source(["CREATE TABLE orders (id INT PRIMARY KEY, v VARCHAR(10))",
                     f"INSERT INTO orders SELECT seq, CONCAT('v', seq) FROM {pipeline.numbers(50)}",
                     "CREATE TABLE notes (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO notes VALUES (1, 'n')"])
    config = load_config(pipeline.config_path)
    assert f"verify_{pipeline.name}" not in {job.name for job in build_definitions(config).jobs or []}
    pipeline.sync()
    orders, notes = AssetKey([pipeline.dest_schema, "orders"]), AssetKey([pipeline.dest_schema, "notes"])

    defs = build_definitions(config)
    Definitions.validate_loadable(defs)  # as `dagster definitions validate` (names unique across jobs and checks)
    job = defs.resolve_job_def(f"verify_{pipeline.name}")
    schedule = defs.resolve_schedule_def(f"verify_{pipeline.name}_schedule")
    assert schedule.cron_schedule == "0 3 * * *"
    sensor = defs.resolve_sensor_def(f"verify_{pipeline.name}_after_load")
    destination = DestinationResource(config_path=str(pipeline.config_path))
    with build_sensor_context(resources={"destination": destination}) as context:
        first = sensor(context)
        assert isinstance(first, RunRequest)
        assert isinstance(sensor(context), SkipReason)  # once per reconciled load

    with DagsterInstance.ephemeral() as instance:
        equal = _evaluations(job.execute_in_process(instance=instance))
        assert set(equal) == {orders, notes}
        assert all(evaluation.passed and evaluation.check_name == VERIFY_CHECK for evaluation in equal.values())

        with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
            conn.execute(f'UPDATE "{pipeline.dest_schema}".orders SET v = %s WHERE id = 17', ("tampered",))
        tampered = _evaluations(job.execute_in_process(instance=instance, raise_on_error=False))

    failed = tampered[orders]
    assert not failed.passed and failed.severity.value == "ERROR"
    assert failed.metadata["changed_keys"].value == [[17]]
    assert tampered[notes].passed
