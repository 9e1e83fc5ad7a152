"""Exceptions raised by the engine; each names where in the pipeline it happened."""

from __future__ import annotations

from typing import Any


class CdcError(Exception):
    """An error in replication, carrying the connector, table and source position it concerns."""

    def __init__(
        self,
        message: str,
        *,
        connector: str | None = None,
        table: str | None = None,
        position: Any = None,
    ) -> None:
        self.message = message
        self.connector = connector
        self.table = table
        self.position = position
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.connector:
            where.append(f"connector {self.connector!r}")
        if self.table:
            where.append(f"table {self.table!r}")
        if self.position is not None:
            where.append(f"position {self.position}")
        return f"{self.message} ({', '.join(where)})" if where else self.message


class ConfigError(CdcError):
    """The connectors configuration file is invalid."""


class RunnerError(CdcError):
    """The Debezium runner (Java side) failed or reported an engine error."""


class ConversionError(CdcError):
    """A change event could not be converted into destination SQL."""

    # The batch's event the error is about, when it names exactly one (a malformed line): the skip strategy sets
    # that event aside without narrowing down.
    seq: int | None = None


class StagingMismatchError(CdcError):
    """The merge found fewer (or more) staged rows than Spark's tasks committed: the batch fails under every error
    strategy, since no event is at fault."""


class ConnectorBusyError(CdcError):
    """Another fetch cycle of the same connector is already running."""


class ConnectorPausedError(CdcError):
    """The connector is paused (or waits for review after a schema sync): no fetch cycle starts."""


LOST_WORDS = "the source no longer holds the connector's position"


def names_lost_position(error: str | None, connector: str) -> bool:
    """Whether a run's error (`connector_state.last_error`) is a lost position's (`PositionLostError`)."""
    return bool(error) and error.startswith(f"connector {connector!r}: {LOST_WORDS} ")


class PositionLostError(CdcError):
    """The source no longer holds the connector's stored position (a purged binlog, an invalidated or dropped
    replication slot, change tables cleaned past it): its first line names the connector, the position, what the
    source holds instead and the command that recovers; `detail`, on the lines below, what that costs and the engine's
    own text when it came from the engine."""

    def __init__(self, message: str, *, connector: str, detail: str | None = None) -> None:
        self.detail = detail
        super().__init__(message, connector=connector)

    def _render(self) -> str:
        return self.message + (f"\n{self.detail}" if self.detail else "")


class MappingRuleError(CdcError):
    """An object mapping rule is malformed, or the destination cannot follow the rules."""


class TableOwnerError(CdcError):
    """A connector would write a destination table that another connector writes."""


class PreflightError(CdcError):
    """The source or the destination lacks a setting or privilege a connector's first run needs (`cdc-pipeline
    check NAME` lists each with its fix)."""
