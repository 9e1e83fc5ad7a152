"""The replay resource: where a sync run's engine starts."""


from typing import Optional

from dagster import ConfigurableResource
from pydantic import Field


class ReplayResource(ConfigurableResource):
    """A sync run starts where its connector stopped, or replays from `start_offset` (a backfill)."""

    start_offset: Optional[str] = Field(
        default=None, description="A Debezium offset as JSON (as `cdc-pipeline state NAME --json` shows it): it "
                                  "becomes the connector's offset before the engine starts, and every later change "
                                  "is applied again.")
