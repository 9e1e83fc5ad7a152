"""The Dagster definitions: per connector, a `sync_<name>` job and its schedule."""

import logging

from dagster import Definitions, definitions

from assets.schedules import build_sync_schedule
from assets.sync_job import build_sync_job
from cdc_pipeline.config import PipelineConfig, load_config
from resources.destination import DestinationResource
from resources.spark_session import SparkSessionResource


def build_definitions(config: PipelineConfig) -> Definitions:
    config_path = str(config.path)
    spark = SparkSessionResource()
    jobs, schedules = [], []
    for connector in config.connectors.values():
        job = build_sync_job(connector, config_path, spark)
        jobs.append(job)
        schedules.append(build_sync_schedule(connector, job))
    return Definitions(
        jobs=jobs,
        schedules=schedules,
        resources={"destination": DestinationResource(config_path=config_path)},
    )


@definitions
def defs() -> Definitions:
    """The project's definitions, from the connectors file ($CDC_PIPELINE_CONFIG), loaded when Dagster asks."""
    logging.getLogger("cdc_pipeline").setLevel(logging.INFO)
    return build_definitions(load_config())
