"""The Dagster definitions: per connector, a `sync_<name>` job, its change sensor (or, for many connectors, the one
`cdc_changes`) and its schedule (one of the two running, by its `trigger`), its asset `cdc/<name>` with its row-count check and an asset per replicated table
(as the destination's control schema records them when the definitions load) with its freshness check and its
verify check (run by the `verify_<name>` job on a schedule and after each bulk load), in the connector's group; the `cdc_control` job and the `cdc_requests` sensor for state-change requests; the
`cdc_run_failures` sensor; each source table as an external asset upstream of its destination table
(`assets/source_assets.py`), and the `cdc_outside_runs` sensor, which records what cycles run outside Dagster
wrote."""

import logging

from dagster import Definitions, definitions, in_process_executor

from assets.change_sensor import ONE_SENSOR_BEYOND_CONNECTORS, Watched, build_change_sensor, build_changes_sensor
from assets.connector_asset import build_connector_asset
from assets.control_job import control_job
from assets.outside_runs import build_outside_runs_sensor
from assets.request_sensor import build_request_sensor
from assets.run_failure_sensor import build_run_failure_sensor
from assets.schedules import build_sync_schedule
from assets.source_assets import build_source_specs
from assets.sync_job import build_sync_assets, build_sync_job, sync_resources
from assets.table_assets import load_replicated_tables
from assets.verify_checks import VerifyDefinitions, build_after_loads_sensor, build_verify_checks
from cdc_pipeline.config import ConnectorConfig, PipelineConfig, load_config
from resources.destination import DestinationResource
from resources.run_processes import fork_runs_in_code_server
from resources.spark_session import SparkSessionResource
from resources.storage_revisions import cache_dagster_script_directories

# Loaded by Dagster's code server: it starts the runs' processes from a forkserver that has imported this module,
# and each sensor's evaluation opens the instance without reading Dagster's migration scripts again.
fork_runs_in_code_server(preload="assets.run_preload")
cache_dagster_script_directories()


def build_definitions(config: PipelineConfig) -> Definitions:
    config_path = str(config.path)
    spark = SparkSessionResource(config_path=config_path)
    jobs, schedules, sensors, assets, checks, verify_jobs = [], [], [], [], [], []
    tables = load_replicated_tables(config)
    watched: list[Watched] = []
    verified: list[tuple[ConnectorConfig, VerifyDefinitions]] = []
    for connector in config.connectors.values():
        connector_tables = tables.get(connector.name, [])
        spec, check = build_connector_asset(connector, config_path)
        sync_assets = build_sync_assets(connector, spec, connector_tables)
        assets.append(sync_assets)
        job = build_sync_job(connector, sync_assets)
        jobs.append(job)
        schedules.append(build_sync_schedule(connector, job, config_path))
        watched.append(Watched(connector, job, connector_tables))
        checks.append(check)
        verify = build_verify_checks(connector, connector_tables, config_path)
        if verify is not None:
            checks.append(verify.checks)
            verify_jobs.append(verify.job)
            schedules.extend([verify.schedule] if verify.schedule else [])
            verified.append((connector, verify))
    sensors.extend(_change_sensors(watched))
    sensors.extend(_after_load_sensors(verified, many=len(watched) > ONE_SENSOR_BEYOND_CONNECTORS))
    replicated = [(connector, tables.get(connector.name, [])) for connector in config.connectors.values()]
    return Definitions(
        assets=[*assets, *build_source_specs((connector, table) for connector, found in replicated for table in found)],
        asset_checks=checks,
        jobs=[*jobs, *verify_jobs, control_job],
        schedules=schedules,
        sensors=[*sensors, build_request_sensor(config_path, jobs), build_run_failure_sensor(config_path, jobs),
                 build_outside_runs_sensor([(connector, f"sync_{connector.name}", found)
                                            for connector, found in replicated])],
        resources={"destination": DestinationResource(config_path=config_path),
                   **sync_resources(config_path, spark)},
        # A connector's cycle lives in one process (its engine, the lazy stream of batches between the stages),
        # also when the UI materializes its assets outside `sync_<name>`.
        executor=in_process_executor,
    )


def _change_sensors(watched: list[Watched]) -> list:
    """A change sensor per connector (started for those whose trigger is `changes`), or, with more than
    ONE_SENSOR_BEYOND_CONNECTORS of those, `cdc_changes` for them all and a stopped sensor per other connector."""
    changes = [entry for entry in watched if entry.connector.trigger == "changes"]
    if len(changes) <= ONE_SENSOR_BEYOND_CONNECTORS:
        return [build_change_sensor(entry.connector, entry.job, entry.tables) for entry in watched]
    return [build_changes_sensor(changes), *(build_change_sensor(entry.connector, entry.job, entry.tables)
                                             for entry in watched if entry.connector.trigger != "changes")]


def _after_load_sensors(verified: list[tuple[ConnectorConfig, VerifyDefinitions]], many: bool) -> list:
    """Each connector's `verify_<name>_after_load`, or, with `many` (more than ONE_SENSOR_BEYOND_CONNECTORS
    connectors, whatever their trigger), `cdc_verify_after_loads` for them all: every sensor costs the daemon a tick
    per evaluation, and 24 of them, evaluated together every minute, held the change sensor behind them for half a
    minute on 2 cores."""
    if not many:
        return [verify.sensor for _, verify in verified]
    return [build_after_loads_sensor([(connector, verify.job) for connector, verify in verified])] if verified else []


@definitions
def defs() -> Definitions:
    """The project's definitions, from the connectors file ($CDC_PIPELINE_CONFIG), loaded when Dagster asks."""
    logging.getLogger("cdc_pipeline").setLevel(logging.INFO)
    return build_definitions(load_config())
