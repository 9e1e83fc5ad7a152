"""The `cdc_control` job: the Dagster UI's way to ask a connector for a state change (a row in the requests table,
which the request sensor serves)."""


from enum import Enum
from typing import Optional

from dagster import Config, MetadataValue, OpExecutionContext, Output, in_process_executor, job, op
from pydantic import Field

from cdc_pipeline.ops import requests
from cdc_pipeline.config import load_config
from resources.destination import DestinationResource


class RequestKind(str, Enum):
    pause = requests.PAUSE
    resume = requests.RESUME
    set_offset = requests.SET_OFFSET
    restart = requests.RESTART
    reload_objmap = requests.RELOAD_OBJMAP
    snapshot = requests.SNAPSHOT


class ControlRequestConfig(Config):
    """A state-change request for one connector."""

    connector: str = Field(description="Connector name in the connectors file.")
    kind: RequestKind = Field(description="pause, resume, set_offset (while paused), restart, reload_objmap or "
                                          "snapshot.")
    argument: Optional[str] = Field(
        default=None, description="set_offset: the offset as JSON; restart: the snapshot mode (initial, initial_only, "
                                  "no_data, always, never, when_needed, recovery, schemasync); snapshot: the tables "
                                  "(db.table1,db.table2).")


@op(description="Adds the request to the requests table; the cdc_requests sensor serves it (done or rejected "
                "with its reason).")
def submit_request(context: OpExecutionContext, config: ControlRequestConfig, destination: DestinationResource):
    pipeline = load_config(destination.config_path)
    pipeline.connector(config.connector)
    with destination.connect() as conn:
        request_id = requests.submit_request(conn, pipeline.destination.control_schema, config.connector,
                                             config.kind.value, config.argument)
    context.log.info(f"request {request_id}: {config.kind.value} of connector {config.connector}")
    return Output(request_id, metadata={"request_id": MetadataValue.int(request_id),
                                        "connector": config.connector, "kind": config.kind.value})


@job(name="cdc_control", executor_def=in_process_executor,
     description="Asks a connector to pause, resume, move its offset, restart with a snapshot mode, reload its "
                 "rules or copy tables again (launch it with its run config).")
def control_job():
    submit_request()
