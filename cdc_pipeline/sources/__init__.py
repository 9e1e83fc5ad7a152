"""Per source type: what the pipeline knows of a source database outside Debezium."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from cdc_pipeline.sources import mariadb, postgres

_MODULES: dict[str, ModuleType] = {"mariadb": mariadb, "mysql": mariadb, "postgres": postgres}


def module_for(connector_type: str) -> ModuleType:
    """The module that reads a source type's tables for the bulk snapshot."""
    return _MODULES[connector_type]


def before_snapshot(offset: dict[str, Any] | None, position: dict[str, Any]) -> bool:
    """Whether a streamed change was committed before the consistent snapshot `position` describes (a binlog
    position of MariaDB/MySQL, a transaction snapshot of PostgreSQL)."""
    module = postgres if "snapshot" in position else mariadb
    return module.before_snapshot(offset, position)
