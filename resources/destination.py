"""The destination PostgreSQL resource."""


from typing import Optional

import psycopg
from dagster import ConfigurableResource
from pydantic import Field

from cdc_pipeline import control
from cdc_pipeline.config import DestinationConfig, load_config

CONNECT_TIMEOUT_SECONDS = 10


class DestinationResource(ConfigurableResource):
    """Connections to the destination PostgreSQL named in the connectors file (its DSN never enters run config)."""

    config_path: Optional[str] = Field(default=None, description="Connectors file; default $CDC_PIPELINE_CONFIG.")

    def destination(self) -> DestinationConfig:
        return load_config(self.config_path).destination

    def connect(self) -> psycopg.Connection:
        """An autocommit connection; the control schema exists once it returns."""
        destination = self.destination()
        conn = destination.connect(connect_timeout=CONNECT_TIMEOUT_SECONDS)
        try:
            control.ensure_control_schema(conn, destination.control_schema)
        except BaseException:
            conn.close()
            raise
        return conn
