"""What a source package provides (`Source`): every name the pipeline reads from the package `sources.module_for`
gives. A package is a module-like object (its `__init__` re-exports its rooms' names), so the protocol is met by
module attributes: constants, and functions with the signatures below.

A capability only some sources have is an Optional member: a package that lacks it sets it to None (`ctid_split =
None` in mariadb), and a caller tests `source.name is None`, never `getattr`/`hasattr`. The bulk snapshot's reads are
None in a source the bulk snapshot does not read (SQL Server, Oracle). `tests/unit/sources/test_protocol.py` checks
that every package has every member.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.sources.change_check import ChangeCheck, RangeCounts, SourceLag
from cdc_pipeline.sources.ddl_text import Statement
from cdc_pipeline.sources.finding import Finding
from cdc_pipeline.sources.lost_position import LostPosition
from cdc_pipeline.sources.offset_shape import OffsetShape
from cdc_pipeline.sources.source_index import SourceIndex
from cdc_pipeline.sources.table import ColumnText, SourceTable
from cdc_pipeline.sources.type_choice import TypeChoice

Offset = dict[str, Any]
Captured = Callable[[str], bool]


class Source(Protocol):
    """A source type's package, room by room (`connector`, `types`, `positions`, `checks`, `snapshot`, `ddl`)."""

    # connector: the Debezium connector's properties, the tables it replicates, connecting.
    def debezium_properties(self, connector: ConnectorConfig) -> dict[str, str]: ...
    def replicates(self, connector: ConnectorConfig, source_table: str) -> bool: ...
    def connect(self, connector: ConnectorConfig) -> Any: ...
    def is_heartbeat_table(self, connector: ConnectorConfig, source_table: str) -> bool: ...
    # What the source needs before the connector's engine starts (PostgreSQL: its heartbeat table).
    prepare_capture: Callable[[ConnectorConfig], None] | None

    # types: the type map and defaults.
    TYPE_MAPS: dict[str, dict[str, str]]
    TYPE_MAP_NOTES: dict[str, list[tuple[str, str]]]
    IMPLICIT_DEFAULTS: bool
    # Whether an event may leave a value out, as Debezium's placeholder (PostgreSQL's unchanged TOASTed values,
    # Oracle's LOBs).
    LEAVES_VALUES_OUT: bool
    def column_type(self, source_type: str, column: dict[str, Any], connector_type: str) -> TypeChoice | None: ...
    def always_nullable(self, source_type: str) -> bool: ...
    # A column default as the source reports it, in the form the type map's defaults read (None: read as it is).
    default_expression: Callable[[str], str | None] | None

    # positions: offsets' shape, stream order, snapshot positions, lost positions.
    OFFSET_SHAPE: OffsetShape
    def source_partition(self, connector: str, database: str) -> dict[str, str]: ...
    # The key of a bulk load's position (`load_end_position`, `snapshot_position_select`) that names its source.
    LOAD_POSITION_KEY: str | None
    before_snapshot: Callable[[Offset | None, Offset], bool] | None
    stream_passed: Callable[[Offset | None, Offset], bool] | None
    position_reached: Callable[[Offset | None, Offset], bool] | None
    load_end_position: Callable[[Any], Offset] | None
    # Where the source's log ends now, a position its reader must reach (MariaDB/MySQL's binlog).
    current_position: Callable[[ConnectorConfig], Offset] | None
    resume_offset: Callable[[ConnectorConfig, Any, Offset | None], Offset | None] | None
    check_position: Callable[[Offset | None], Any] | None
    lost_position: Callable[[ConnectorConfig, Offset, Captured], LostPosition | None] | None
    drop_lost_slot: Callable[[ConnectorConfig], bool] | None
    # The WAL's end marked by a heartbeat, a record past it, and changes that may share an LSN (PostgreSQL).
    mark_wal_end: Callable[[ConnectorConfig], int | None] | None
    received_past: Callable[[Offset | None, int], bool] | None
    may_share_lsn_ahead: Callable[[dict[str, Any] | None, ConnectorConfig], bool] | None
    # Where a streamed offset lies (the transaction's order, the transaction, the record's place in it), and whether a
    # transaction's records come in that place's order: a source whose offsets decode orders this way (SQL Server,
    # Oracle; MariaDB/MySQL's and PostgreSQL's have their own rules, `binlog_redelivery_test`, `pg_redelivery_test`).
    stream_order: Callable[[Offset | None], tuple[Any, Any, Any] | None] | None
    ORDERED_WITHIN_TRANSACTION: bool | None

    # checks: the change check, lag, preflight, row counts, verify's SQL.
    check_changes: Callable[[ConnectorConfig, Any, Offset, Captured], ChangeCheck] | None
    replication_lag: Callable[[ConnectorConfig, Any, Offset], SourceLag | None] | None
    slot_status: Callable[[ConnectorConfig], dict[str, Any] | None] | None
    preflight: Callable[[ConnectorConfig], list[Finding]] | None
    row_counts: Callable[[ConnectorConfig, Captured], dict[str, int]] | None
    # The catalog's estimate of each table's rows (`schema.table`, rows), read in one cheap query.
    estimated_rows: Callable[[Any, Sequence[str]], list[tuple[str, Any]]] | None
    verify_text: Callable[[Any, str, Any], ColumnText] | None
    row_hash_sql: Callable[[str], str] | None
    verify_session: Callable[[Any], None] | None
    key_range_counts: Callable[..., dict[str, RangeCounts]] | None

    # snapshot: the bulk load's reads.
    JDBC_DRIVER: str | None
    SESSION_INIT: str | None
    CONSISTENT_SNAPSHOT: str | None
    COPY_SNAPSHOT: str | None
    GEOMETRY_TYPES: frozenset[str] | None
    jdbc_url: Callable[[ConnectorConfig], str] | None
    quote: Callable[[str], str] | None
    qualified: Callable[[str, str], str] | None
    tables_of: Callable[[Any, ConnectorConfig], list[SourceTable]] | None
    list_tables: Callable[..., list[SourceTable]] | None
    list_columns: Callable[[Any, str, str], list[Any]] | None
    chunk_key: Callable[[Any, str, str], list[str]] | None
    table_definitions: Callable[[Any, str, Sequence[str]], dict[str, tuple[list[Any], list[str]]]] | None
    secondary_indexes: Callable[[Any, str, Sequence[str]], list[SourceIndex]] | None
    next_chunk_start: Callable[..., list[Any] | None] | None
    chunk_predicate: Callable[[Sequence[str], Sequence[Any] | None, Sequence[Any] | None], str] | None
    ctid_split: Callable[[Any, str, str, int, int], list[int]] | None
    ctid_predicate: Callable[[Sequence[Any] | None, Sequence[Any] | None], str] | None
    export_snapshot: Callable[[ConnectorConfig], tuple[Any, str]] | None
    import_snapshot: Callable[[str], str] | None
    copy_out_column: Callable[[Any, str], str] | None
    copy_out_query: Callable[[str], str] | None
    copy_field_sql: Callable[[Any, str], tuple[str, int] | None] | None
    select_text: Callable[[Any, str], str] | None
    column_text: Callable[[Any, Any, str], Any] | None
    copy_text_sql: Callable[[Any, str], str | None] | None
    copy_line_sql: Callable[[Sequence[str]], str] | None
    zero_dates: Callable[[dict[str, Any], Sequence[Any]], Any] | None
    snapshot_position_select: Callable[[str, Sequence[str]], str] | None
    require_snapshot_position: Callable[[Any, ConnectorConfig, str], None] | None

    # ddl: the source's DDL.
    DDL_EVENTS: bool
    def parse_ddl(self, ddl_text: str) -> list[Statement]: ...
    # The database a streamed schema change drops (`DROP DATABASE`, whose event names no table), or None.
    dropped_database: Callable[[dict[str, Any]], str | None] | None
    # The tables of a database as their CREATE TABLE text (a table the stream never described), or None.
    create_statements: Callable[[Any, str, Sequence[str]], list[str]] | None


def members() -> list[str]:
    """The protocol's member names, in its order."""
    names = [name for name in Source.__dict__ if not name.startswith("_")]
    return names + [name for name in Source.__annotations__ if name not in names]
