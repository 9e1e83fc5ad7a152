"""The sources: one package per source type (`mariadb` for MariaDB and MySQL, `postgres`, `sqlserver`, `oracle`), each
with the same rooms (`connector`, `types`, `positions`, `checks`, `snapshot`, `ddl`) and each a `protocol.Source`.
This module is the only address the stages use: `module_for(type)` gives a type's package, and the functions below
ask it (`captures`, `prepare_capture`, `lost_position`, `source_position`, ...), so that no stage tests the type.
The modules beside the packages are the pieces they share (`ddl_text`, `debezium`, `quoting`, `offset_shape`, ...)."""

from __future__ import annotations

import logging
from typing import Any, Sequence, cast

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.sources import mariadb, oracle, postgres, sqlserver
from cdc_pipeline.sources.lost_position import LostPosition
from cdc_pipeline.sources.protocol import Source

log = logging.getLogger(__name__)

_PACKAGES: dict[str, Source] = {"mariadb": cast(Source, mariadb), "mysql": cast(Source, mariadb),
                                "postgres": cast(Source, postgres), "sqlserver": cast(Source, sqlserver),
                                "oracle": cast(Source, oracle)}

# MariaDB's geometry types (the bulk load reads them as WKB).
GEOMETRY_TYPES = mariadb.GEOMETRY_TYPES
# PostgreSQL's renderings for verify, which the destination's side runs too (its session, a row's hash).
postgres_verify_session = postgres.verify_session
postgres_row_hash_sql = postgres.row_hash_sql
# The stream order and re-delivery of a binlog (MariaDB/MySQL) and of PostgreSQL's stream, which decode's re-delivery
# tests read by an offset's shape (SQL Server's and Oracle's are their packages' `stream_order`).
SourceLogChangedError = mariadb.SourceLogChangedError
offset_order = mariadb.offset_order
binlog_base = mariadb.binlog_base
binlog_redelivery_test = mariadb.binlog_redelivery_test
pg_stream_offset = postgres.pg_stream_offset
pg_before = postgres.pg_before
pg_record_follows = postgres.pg_record_follows
pg_redelivery_test = postgres.pg_redelivery_test


def packages() -> list[Source]:
    """Each source package once (`mysql` shares MariaDB's)."""
    return list(dict.fromkeys(_PACKAGES.values()))


def module_for(connector_type: str) -> Source:
    """The package of a source type (`mysql` shares MariaDB's)."""
    return _PACKAGES[connector_type]


def captures(connector: ConnectorConfig, source_table: str) -> bool:
    """Whether a source table (`db.table`, or `schema.table` for PostgreSQL) belongs to the connector: one its
    source type replicates (`replicates` of the source package) and, when the connector lists `tables`, one of them.

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
    """What the source needs before the connector's engine starts (`prepare_capture` of its package: a PostgreSQL
    source's heartbeat table)."""
    prepare = module_for(connector.type).prepare_capture
    if prepare is not None:
        prepare(connector)


def lost_position(connector: ConnectorConfig, offset: dict[str, Any] | None) -> LostPosition | None:
    """What the source no longer holds of the engine's stored `offset` (`lost_position` of the source package: a
    MariaDB/MySQL binlog purged past it, a PostgreSQL slot invalidated or dropped, SQL Server change tables cleaned
    past it), or None. A source that cannot be read now says nothing: the engine meets the same trouble and fails
    with its own words."""
    check = module_for(connector.type).lost_position
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
    drop = module_for(connector.type).drop_lost_slot
    if drop is not None and drop(connector):
        log.warning("%s: dropped the replication slot %s, which the server had invalidated", connector.name,
                    connector.replication_slot)


# The packages a bulk load reads, by the key only their load positions hold (`LOAD_POSITION_KEY`).
_LOAD_POSITION_PACKAGES = {source.LOAD_POSITION_KEY: source for source in packages()
                           if source.LOAD_POSITION_KEY is not None}


def _load_position_source(position: dict[str, Any]) -> Source | None:
    """The package whose bulk load's position `position` is (by its `LOAD_POSITION_KEY`: a binlog position of
    MariaDB/MySQL, a transaction snapshot of PostgreSQL). Asked for every change a load's table streams."""
    return next((source for key, source in _LOAD_POSITION_PACKAGES.items() if key in position), None)


def before_snapshot(offset: dict[str, Any] | None, position: dict[str, Any]) -> bool:
    """Whether a streamed change was committed before the consistent snapshot `position` describes (a binlog
    position of MariaDB/MySQL, a transaction snapshot of PostgreSQL)."""
    source = _load_position_source(position)
    return source is not None and source.before_snapshot is not None and source.before_snapshot(offset, position)


def stream_passed(offset: dict[str, Any] | None, position: dict[str, Any]) -> bool:
    """Whether a streamed change (its offset) comes after every change committed before `position` (a binlog
    position of MariaDB/MySQL, a transaction snapshot of PostgreSQL, as the source package's `load_end_position`
    gives it) in the stream."""
    source = _load_position_source(position)
    return source is not None and source.stream_passed is not None and source.stream_passed(offset, position)


def position_reached(offset: dict[str, Any] | None, position: dict[str, Any]) -> bool:
    """Whether an event's Debezium offset (a snapshot's too) is at or past the binlog position `position` of a
    MariaDB/MySQL source; False for other sources and positions."""
    source = _load_position_source(position)
    return source is not None and source.position_reached is not None and source.position_reached(offset, position)


def source_position(connector: ConnectorConfig) -> dict[str, Any] | None:
    """The source's log position now, where its reader must reach (`current_position` of the package: a
    MariaDB/MySQL binlog position), or None for other source types or when it cannot be read (the check then finds
    no recorded position and launches a run)."""
    current = module_for(connector.type).current_position
    if current is None:
        return None
    try:
        return current(connector)
    except Exception as exc:  # noqa: BLE001 - a position not recorded only costs a run
        log.warning("%s: cannot read the source's binlog position: %s", connector.name, exc)
        return None
