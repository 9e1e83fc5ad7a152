"""The Debezium runner resource: one connector's engine, started with the run and always stopped after it."""


from contextlib import contextmanager
from typing import Iterator, Optional

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field, PrivateAttr

from cdc_pipeline.config import load_config
from cdc_pipeline.cycle import ConnectorSession
from cdc_pipeline.ops import preflight
from cdc_pipeline.ops.tables import TableChanges
from resources.replay import ReplayResource
from resources.spark_session import SparkSessionResource


class DebeziumRunnerResource(ConfigurableResource):
    """Starts the connector's embedded Debezium engine in the Spark driver JVM when the run starts.

    The first step of a run checks a connector that never ran (`preflight.require_ready`: a source or destination
    that lacks a setting or privilege fails the run before the JVM starts), connects to the destination, takes the
    connector's run lock and starts the engine;
    teardown stops the engine (flushing the offsets of completed batches), records the connector's final state
    and the run's error if any, and releases the lock, also when the run fails. Nothing starts at setup: Dagster
    also initializes a run's resources where no step runs (the `dagster job execute` command does so again after
    the run ends), and one run must start one engine.
    """

    connector: str = Field(description="Connector name in the connectors file.")
    config_path: Optional[str] = Field(default=None, description="Connectors file; default $CDC_PIPELINE_CONFIG.")
    spark: SparkSessionResource
    replay: ReplayResource

    _session: Optional[ConnectorSession] = PrivateAttr(default=None)
    _error: Optional[BaseException] = PrivateAttr(default=None)
    _table_changes: TableChanges = PrivateAttr(default_factory=TableChanges)

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            session.close(self._error)

    @property
    def session(self) -> ConnectorSession:
        """The run's connector session, opened (engine started) on first use."""
        if self._session is None:
            config = load_config(self.config_path)
            connector = config.connector(self.connector)
            preflight.require_ready(connector, config.destination)
            session = ConnectorSession(connector, config.destination, self.spark.get_session(),
                                       start_offset=self.replay.start_offset)
            try:
                session.open()
            except BaseException as exc:
                session.close(exc)
                raise
            self._session = session
        return self._session

    @property
    def table_changes(self) -> TableChanges:
        """What the run's cycle applied per table, counted as its batches are applied."""
        return self._table_changes

    @contextmanager
    def step(self) -> Iterator[ConnectorSession]:
        """Runs one step of the cycle; a failure is kept so teardown records it as the connector's last error."""
        try:
            yield self.session
        except BaseException as exc:
            self._error = exc
            raise
