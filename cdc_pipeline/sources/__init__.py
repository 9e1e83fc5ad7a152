"""One module per source type, holding what the pipeline knows of that type: its Debezium connector's properties,
its offsets' shape, its type map, connecting (TLS, timeouts), the change check's, the preflight's and row counts'
reads (SQL Server's and Oracle's in `sqlserver_checks`, `oracle_checks`, with the order of their offsets), and for
MariaDB/MySQL and PostgreSQL the bulk snapshot's reads. The stages ask here (`module_for`) instead of testing the
type."""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, Sequence

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline.sources import mariadb, oracle, postgres, sqlserver
from cdc_pipeline.sources.lost_position import LostPosition

log = logging.getLogger(__name__)

_MODULES: dict[str, ModuleType] = {"mariadb": mariadb, "mysql": mariadb, "postgres": postgres, "sqlserver": sqlserver,
                                  "oracle": oracle}


# The source types whose stream ends at a log position its reader must reach (`source_position`).
BINLOG_TYPES = frozenset({"mariadb", "mysql"})


def module_for(connector_type: str) -> ModuleType:
    """The module of a source type (`mysql` shares MariaDB's)."""
    return _MODULES[connector_type]


def captures(connector: ConnectorConfig, source_table: str) -> bool:
    """Whether a source table (`db.table`, or `schema.table` for PostgreSQL) belongs to the connector: one its
    source type replicates (`replicates` of the source module) and, when the connector lists `tables`, one of them.

    Debezium keeps every table of the source server in its schema history, and may report schema changes
    of tables it does not capture: those must never reach the destination.
    """
    if not module_for(connector.type).replicates(connector, source_table):
        return False
    return not connector.tables or source_table in connector.tables


def select_tables(connector: ConnectorConfig, named: Sequence[str] | None,
                  listed: Sequence[str]) -> tuple[list[str], list[str]]:
    """The tables of `listed` (the connector's, on the source) that `named` selects (all when None): each name a
    table (`db.table`) or every table of one database (`db.*`); and the names that select none, sorted."""
    if named is None:
        return list(listed), []
    wanted = set(named)
    databases = {name[:-2] for name in wanted if name.endswith(".*")}
    selected = [table for table in listed if table in wanted or connector.split_table(table)[0] in databases]
    found = {connector.split_table(table)[0] for table in selected} & databases
    unknown = sorted((wanted - set(selected) - {f"{database}.*" for database in databases})
                     | {f"{database}.*" for database in databases - found})
    return selected, unknown


def prepare_capture(connector: ConnectorConfig) -> None:
    """What the source needs before the connector's engine starts: a PostgreSQL source's heartbeat table."""
    if connector.type == "postgres":
        postgres.ensure_heartbeat_table(connector)


def lost_position(connector: ConnectorConfig, offset: dict[str, Any] | None) -> LostPosition | None:
    """What the source no longer holds of the engine's stored `offset` (`lost_position` of the source module: a
    MariaDB/MySQL binlog purged past it, a PostgreSQL slot invalidated or dropped, SQL Server change tables cleaned
    past it), or None. A source that cannot be read now says nothing: the engine meets the same trouble and fails
    with its own words."""
    check = getattr(module_for(connector.type), "lost_position", None)
    if check is None:
        return None
    try:
        return check(connector, offset or {}, lambda table: captures(connector, table))
    except Exception as exc:  # noqa: BLE001 - the engine meets the same trouble and says so
        log.warning("%s: cannot check that the source still holds the connector's position before the engine "
                    "starts: %s", connector.name, exc)
        return None


def drop_lost_slot(connector: ConnectorConfig) -> None:
    """Before a new snapshot: a PostgreSQL source's replication slot that the server invalidated is dropped, so
    that the engine makes a new one (Debezium would stream from the invalidated one, and fail)."""
    if connector.type == "postgres" and postgres.drop_lost_slot(connector):
        log.warning("%s: dropped the replication slot %s, which the server had invalidated", connector.name,
                    connector.replication_slot)


def before_snapshot(offset: dict[str, Any] | None, position: dict[str, Any]) -> bool:
    """Whether a streamed change was committed before the consistent snapshot `position` describes (a binlog
    position of MariaDB/MySQL, a transaction snapshot of PostgreSQL)."""
    module = postgres if "snapshot" in position else mariadb
    return module.before_snapshot(offset, position)


def stream_passed(offset: dict[str, Any] | None, position: dict[str, Any]) -> bool:
    """Whether a streamed change (its offset) comes after every change committed before `position` (a binlog
    position of MariaDB/MySQL, a transaction snapshot of PostgreSQL, as the source module's `load_end_position`
    gives it) in the stream."""
    module = postgres if "snapshot" in position else mariadb
    return module.stream_passed(offset, position)


def position_reached(offset: dict[str, Any] | None, position: dict[str, Any]) -> bool:
    """Whether an event's Debezium offset (a snapshot's too) is at or past the binlog position `position` of a
    MariaDB/MySQL source; False for other sources and positions."""
    return "file" in position and mariadb.position_reached(offset, position)


def source_position(connector: ConnectorConfig) -> dict[str, Any] | None:
    """The source's binlog position now (MariaDB/MySQL), or None for other source types or when it cannot be read
    (the check then finds no recorded position and launches a run)."""
    if connector.type not in BINLOG_TYPES:
        return None
    try:
        with mariadb.connect(connector) as source, source.cursor() as cur:
            return mariadb.binlog_position(cur)
    except Exception as exc:  # noqa: BLE001 - a position not recorded only costs a run
        log.warning("%s: cannot read the source's binlog position: %s", connector.name, exc)
        return None
