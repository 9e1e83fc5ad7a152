"""The destination PostgreSQL resource."""


from typing import Optional

import psycopg
from dagster import ConfigurableResource
from pydantic import Field

from cdc_pipeline.config import DestinationConfig, load_config


class DestinationResource(ConfigurableResource):
    """Connections to the destination PostgreSQL named in the connectors file (its DSN never enters run config)."""

    config_path: Optional[str] = Field(default=None, description="Connectors file; default $CDC_PIPELINE_CONFIG.")

    def destination(self) -> DestinationConfig:
        return load_config(self.config_path).destination

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.destination().dsn.reveal(), autocommit=True)
