"""How a load copies a slice of chunks: the columns a table copies (the source's that the destination table has, by
the mapping rules, each with the type it is written as), and the Spark job's input and writer. Where the source
selects every column as a COPY text field, the runner's SourceChunkCopier runs each chunk's SELECT in a task and
writes its rows (`CopyPlanner.source_copier`); else Spark reads the chunks through JDBC and turns their rows into COPY
lines (`CopyPlanner.lines`). Either way the runner's ChunkCopyWriter COPYs a chunk into the destination in the
transaction that marks it done (`CopyPlanner.writer`, with the statements of `copy_statements`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import psycopg
from psycopg import sql
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_pipeline import copy_text
from cdc_pipeline.mapping import objmap, transform_sql
from cdc_pipeline.sink.table_writes import staging_table_sql
from cdc_pipeline.catalog import DestinationTable, destination_table
from cdc_pipeline.config import ConnectorConfig, DestinationConfig
from cdc_pipeline.convert.dml import ColumnPlan
from cdc_pipeline.errors import CdcError
from cdc_pipeline.decode.events import FieldSpec
from cdc_pipeline.capture.runner import JAVA_PACKAGE, jdbc_target
from cdc_pipeline.sources import GEOMETRY_TYPES
from cdc_pipeline.bulk_load.bookkeeping import table_sql
from cdc_pipeline.bulk_load.chunk_plan import Chunk, TableLoad, chunks_per_slice, whole_table

_STAGING = "_cdc_bulk_staging"
_POSITION_ALIAS = "_cdc_position"
_LINE_ALIAS = "_cdc_line"
_GEOMETRY_LOGICAL = "io.debezium.data.geometry.Geometry"


@dataclass(frozen=True)
class BulkColumn:
    """A source column and the destination column it fills."""

    source: Any  # the source module's SourceColumn
    dest_name: str
    pg_type: str  # the type whose text input form the column's COPY text is


@dataclass
class SlicePart:
    """A table's chunks in a slice, and the columns they copy."""

    table: TableLoad
    columns: list[BulkColumn]
    chunks: list[Chunk]
    last: bool = False  # the table has no chunk left to copy after these


class CopyPlanner:
    """Plans the copy of a connector's chunks: what each table's chunks select from the source and how they are written
    into the destination; `source` is the connector type's source module."""

    def __init__(self, conn: psycopg.Connection, connector: ConnectorConfig, destination: DestinationConfig,
                 spark: SparkSession, object_map: objmap.ObjectMap, source: Any) -> None:
        self.conn = conn
        self.connector = connector
        self.destination = destination
        self.spark = spark
        self.object_map = object_map
        self.schema = destination.control_schema
        self.source = source

    def columns(self, cur: Any, table: TableLoad, source_columns: Sequence[Any] | None = None,
                existing: DestinationTable | None = None) -> list[BulkColumn]:
        """The source columns (`source_columns`, else read now) that the destination table (`existing`, else read
        now) has (by the mapping rules), with the type each is written as. A column the source added or dropped
        during the load is left to the stream's DDL."""
        if existing is None:
            with self.conn.cursor() as dest:
                existing = destination_table(dest, table.dest_schema, table.dest_table)
        if existing is None:
            raise CdcError(f"the destination table {table.dest_schema}.{table.dest_table} no longer exists",
                           connector=self.connector.name, table=table.source_table)
        if source_columns is None:
            source_columns = self.source.list_columns(cur, table.database, table.table)
        columns = []
        for column in source_columns:
            dest_name = self.object_map.column_name(table.source_table, column.name)
            if dest_name in existing.columns:
                columns.append(BulkColumn(column, dest_name, input_type(existing, dest_name)))
        return columns

    def copy_fields(self, columns: list[BulkColumn]) -> list[tuple[str, int]] | None:
        """How the source selects each column as a value the runner's SourceChunkCopier writes as a COPY text field
        (`copy_field_sql`), or as its own COPY writes it (`copy_out_column`: the kind is then unused); None where a
        column needs Spark (`lines`)."""
        copy_out = self.source.copy_out_column
        if copy_out is not None:
            return [(copy_out(column.source, column.pg_type), copy_text.FIELD_PLAIN) for column in columns] or None
        field_sql = self.source.copy_field_sql
        fields = [field_sql(column.source, column.pg_type) for column in columns] if field_sql else []
        if not columns or not fields or any(field is None for field in fields):
            return None
        return fields

    def source_copier(self, parts: Sequence[SlicePart], snapshot: str | None = None) -> tuple[Any, Any] | None:
        """The Spark job's input and writer of a slice whose tasks read the source themselves (the runner's
        SourceChunkCopier): where the source selects every column as a value the writer makes a COPY text field, a
        task runs its chunks' SELECTs over the source's JDBC driver and writes the rows, no per-row expression in
        the source nor Spark row between; a PostgreSQL source's chunks are its own COPY text, piped into the
        destination's COPY (`copy_out_query`), the parts of a table without a key under the exported `snapshot`
        (`slices._SliceCopy`). None where a column needs Spark (`lines`)."""
        copy_out = self.source.copy_out_query
        queries, positions, kinds, fetch_sizes = [], [], [], []
        for part in parts:
            fields = self.copy_fields(part.columns)
            if fields is None:
                return None
            table = part.table
            select = f"SELECT {', '.join(render for render, _ in fields)} FROM " \
                     f"{self.source.qualified(table.database, table.table)}"
            for chunk in part.chunks:
                if table.key_columns:
                    predicate = self.source.chunk_predicate(table.key_columns, chunk.lower, chunk.upper)
                    query = f"{select} WHERE {predicate}"
                    positions.append(None)
                else:
                    # One chunk under its own consistent snapshot, or a part of the table under the slice's.
                    query = select if whole_table(chunk) else \
                        f"{select} WHERE {self.source.ctid_predicate(chunk.lower, chunk.upper)}"
                    positions.append(self.source.snapshot_position_select(_POSITION_ALIAS, []))
                queries.append(copy_out(query) if copy_out else query)
                kinds.append([kind for _, kind in fields])
                fetch_sizes.append(table.fetch_rows)
        session = [self.source.SESSION_INIT] if self.source.SESSION_INIT else []
        plan = {"sessionStatements": session, "positionSql": positions, "chunkQueries": queries, "kinds": kinds,
                "fetchSizes": fetch_sizes, "copyOut": copy_out is not None,
                "snapshotStatement": self.source.import_snapshot(snapshot) if snapshot
                else self.source.COPY_SNAPSHOT if copy_out else self.source.CONSISTENT_SNAPSHOT}
        copier_class = getattr(self.spark._jvm, f"{JAVA_PACKAGE}.SourceChunkCopier")
        copier = copier_class.fromJson(self.writer(parts), self.source.JDBC_DRIVER,
                                       self.source.jdbc_url(self.connector), self.connector.user,
                                       self.connector.password.reveal(), json.dumps(plan))
        # A slice of tables read whole: a task per core copies its share in turn (a connection to each side per
        # task, not per chunk); else a task per chunk.
        partitions = chunks_per_slice(self.spark) // 4 if whole_table(parts[0].chunks[0]) else len(queries)
        return copier_class.chunks(self.spark.sparkContext._jsc, len(queries), partitions), copier

    def _read(self, table: TableLoad, renders: list[str], selected: list[str],
              chunks: list[Chunk]) -> tuple[DataFrame, Column]:
        """The source's rows of these chunks as `renders` select them (named `selected`), one partition per chunk,
        and the column of a chunk's position: a table without a key is one chunk read under a consistent snapshot,
        whose first row carries the snapshot's binlog position and NULL data columns; the others have none."""
        source = self.source.qualified(table.database, table.table)
        properties = {"user": self.connector.user, "password": self.connector.password.reveal(),
                      "driver": self.source.JDBC_DRIVER, "fetchsize": str(table.fetch_rows)}
        if self.source.SESSION_INIT:
            properties["sessionInitStatement"] = self.source.SESSION_INIT
        url = self.source.jdbc_url(self.connector)
        if table.key_columns:
            keys = ", ".join(map(self.source.quote, table.key_columns))
            query = f"(SELECT {keys}, {', '.join(renders)} FROM {source}) AS src"
            predicates = [self.source.chunk_predicate(table.key_columns, chunk.lower, chunk.upper) for chunk in chunks]
            return (self.spark.read.jdbc(url, query, predicates=predicates, properties=properties),
                    F.lit(None).cast("string"))
        query = (f"({self.source.snapshot_position_select(_POSITION_ALIAS, selected)} UNION ALL "
                 f"SELECT NULL, {', '.join(renders)} FROM {source}) AS src")
        frame = self.spark.read.jdbc(url, query, properties={**properties,
                                                             "sessionInitStatement": self.source.CONSISTENT_SNAPSHOT})
        return frame, F.col(_POSITION_ALIAS)

    def lines(self, table: TableLoad, columns: list[BulkColumn], chunks: list[Chunk]) -> DataFrame:
        """The chunks as a DataFrame of COPY lines (with the position and the zero dates written as NULL, see
        `_read`), one partition per chunk in order.

        Where the source can render a column's whole COPY text field (`copy_text_sql`), it does, and Spark takes
        the field as it is; when it can render every column, it renders the whole line. Other columns are rendered
        as text by the source (`select_text`) and turned into COPY text by Spark (`column_text`)."""
        aliases = [f"_cdc_{i}" for i in range(len(columns))]
        fields = [self.source.copy_text_sql(column.source, column.pg_type) for column in columns]
        whole_lines = bool(columns) and all(field is not None for field in fields)
        if whole_lines:
            renders = [f"{self.source.copy_line_sql(fields)} AS {_LINE_ALIAS}"]
        else:
            renders = [f"{field or self.source.select_text(column.source, column.pg_type)} AS {alias}"
                       for column, alias, field in zip(columns, aliases, fields)]
        frame, position = self._read(table, renders, [_LINE_ALIAS] if whole_lines else aliases, chunks)
        if whole_lines:
            line = F.col(_LINE_ALIAS)
            zero_dates = F.lit(0)  # only a TIMESTAMP column has zero dates counted, and Spark renders those
        else:
            line = F.concat_ws("\t", *[
                F.col(alias) if field is not None else self.source.column_text(F.col(alias), column.source,
                                                                               column.pg_type)
                for alias, column, field in zip(aliases, columns, fields)])
            zero_dates = self.source.zero_dates({column.source.name: F.col(alias)
                                                 for alias, column in zip(aliases, columns)},
                                                [column.source for column in columns])
        if not table.key_columns:
            line = F.when(F.col(_POSITION_ALIAS).isNull(), line)
        return frame.select(line.alias("line"), position.alias("position"), zero_dates.alias("zero_dates"))

    def writer(self, parts: Sequence[SlicePart]) -> Any:
        """The runner's ChunkCopyWriter of these tables' chunks: it writes a partition's COPY lines (`lines`) in
        its chunk's transaction, which `SourceChunkCopier` runs too."""
        url, user, password = jdbc_target(self.destination)
        chunks_table = table_sql(self.schema, "bulk_load_chunks")
        claim = sql.SQL("UPDATE {} SET done_at = now() WHERE id = ? AND done_at IS NULL").format(chunks_table)
        finish = sql.SQL(
            """WITH chunk AS (UPDATE {chunks} SET rows = ?, zero_dates = ?, snapshot_position = CAST(? AS jsonb)
                              WHERE id = ? RETURNING rows, zero_dates)
               INSERT INTO {stats} AS s (connector, events, snapshot_rows, zero_dates, first_applied_at,
                                         last_applied_at)
               SELECT {connector}, rows, rows, zero_dates, now(), now() FROM chunk
               ON CONFLICT (connector) DO UPDATE SET events = s.events + EXCLUDED.events,
                 snapshot_rows = s.snapshot_rows + EXCLUDED.snapshot_rows,
                 zero_dates = s.zero_dates + EXCLUDED.zero_dates,
                 first_applied_at = coalesce(s.first_applied_at, now()), last_applied_at = now()""").format(
            chunks=chunks_table, stats=table_sql(self.schema, "stats"), connector=sql.Literal(self.connector.name))
        plan: dict[str, Any] = {"chunkIds": [], "tableOfChunk": [], "claimSql": self._text(claim),
                                "beforeCopy": [], "copySql": [], "afterCopy": [], "finishSql": self._text(finish)}
        for i, part in enumerate(parts):
            before, copy, after = copy_statements(self.object_map, part.table, part.columns)
            plan["beforeCopy"].append([self._text(statement) for statement in before])
            plan["copySql"].append(self._text(copy))
            plan["afterCopy"].append([self._text(statement) for statement in after])
            plan["chunkIds"].extend(chunk.id for chunk in part.chunks)
            plan["tableOfChunk"].extend([i] * len(part.chunks))
        # One JSON text, not a py4j call per array element.
        return getattr(self.spark._jvm, f"{JAVA_PACKAGE}.ChunkCopyWriter").fromJson(url, user, password,
                                                                                   json.dumps(plan))

    def _text(self, statement: sql.Composable) -> str:
        return statement.as_string(self.conn)


def copy_statements(object_map: objmap.ObjectMap, table: TableLoad, columns: list[BulkColumn]) -> tuple[
        list[sql.Composable], sql.Composable, list[sql.Composable]]:
    """What writes a chunk's COPY lines into the table: the statements before the COPY, the COPY, and those after it
    (a column with a transform: the lines go to a staging table, and an INSERT applies the transforms)."""
    target = table_sql(table.dest_schema, table.dest_table)
    names = [column.dest_name for column in columns]
    plans, transforms = object_map.transforms(table.source_table, [_column_plan(column) for column in columns])
    before: list[sql.Composable] = []
    after: list[sql.Composable] = []
    into = target
    if transforms:
        into = sql.Identifier(_STAGING)
        before.append(staging_table_sql(into, target, names, transforms))
        values = transform_sql.staged_values(plans, transforms, "s")
        after.append(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} AS s").format(
            target, sql.SQL(", ").join(map(sql.Identifier, names)),
            sql.SQL(", ").join(values[name] for name in names), into))
    return before, sql.SQL("COPY {} ({}) FROM STDIN").format(into, sql.SQL(", ").join(map(sql.Identifier, names))), after


def input_type(existing: DestinationTable, column: str) -> str:
    """The type whose text form a column receives: a domain over a built-in type takes its base type's."""
    column_type = existing.types.get(column)
    if column_type is not None and column_type.user_defined and column_type.builtin:
        return column_type.base
    return existing.columns[column]


def _column_plan(column: BulkColumn) -> ColumnPlan:
    """The column as the mapping rules' transforms see it (geometry is told by its logical type)."""
    geometry = column.source.data_type in GEOMETRY_TYPES
    spec = FieldSpec(name=column.source.name, type="struct" if geometry else "string",
                     logical=_GEOMETRY_LOGICAL if geometry else None, parameters={}, optional=True)
    return ColumnPlan(source_name=column.source.name, dest_name=column.dest_name, pg_type=column.pg_type, spec=spec,
                      convert=lambda value, spec, pg_type: value)
