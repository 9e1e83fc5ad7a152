"""`cdc-pipeline verify`: compares each table a connector replicates, in its source and in the destination, by the
content of its rows, and names the rows that differ; with `repair`, copies those rows again from the source.

How a table is compared. Every column the comparison can render alike on both sides (`verify_text` of the source
module) is rendered as text: in the source, the COPY text field the bulk snapshot writes for it; in the
destination, its value written back to that same text. A row is the line of those fields, and hashes to the first
60 bits of its MD5. The table is split into ranges of its integer key (`chunk_rows` rows each, boundaries found by
index range scans in the source); each side computes, per range, in its own SQL, the count of rows and the sum of
their hashes. A range that differs is split again, down to ranges of at most LIST_ROWS rows, whose rows are read
as (key, hash) from both sides: the keys missing in the destination, extra in it, or changed are named. A table
whose key is not of an integer type is compared as one range (its keys named up to UNRANGED_LIST_LIMIT rows); a
table without a key as one range whose rows cannot be named.

A live source. The source moves on while verify reads, and the destination follows it a little later: a row that
differs at the first look is read again, `rechecks` times, `recheck_seconds` apart, and is reported only if it
differs every time. When rows still differ, the connector's change check (`check_changes` of the source module, as
`cdc-pipeline pending` runs it) says whether the source holds changes the connector has not applied; then the
differences are reported as unconfirmed, not as differences.

Repair. Under the connector's run lock (no fetch cycle runs meanwhile), each range that still differs is read from
the source by the bulk snapshot's own reader (Spark, the same COPY lines and transforms), and in one destination
transaction the range's destination rows are deleted and the source's are copied in. A change the source makes
after that read comes later in the stream, which replays whole rows: the range ends as the source has it.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import psycopg
from psycopg import sql

from cdc_pipeline import control, sources
from cdc_pipeline.bulk_load import bookkeeping, chunk_plan, copy_plan
from cdc_pipeline.bulk_load.engine import BulkLoader
from cdc_pipeline.catalog import destination_table
from cdc_pipeline.config import ConnectorConfig, DestinationConfig
from cdc_pipeline.copy_text import ESCAPES, NULL_TEXT
from cdc_pipeline.errors import CdcError, ConnectorBusyError
from cdc_pipeline.mapping.objmap import ObjectMap
from cdc_pipeline.mapping.rule_store import read_rules
from cdc_pipeline.ops.pending import checked_offset
from cdc_pipeline.sources.table import ColumnText

log = logging.getLogger(__name__)

CHUNK_ROWS = 10_000
LIST_ROWS = 1_000  # a differing range of at most this many rows has its rows read and compared one by one
UNRANGED_LIST_LIMIT = 100_000  # a table compared as one range has its keys named up to this many rows
RECHECKS = 3
CHANGED_COLUMNS_KEYS = 20  # the changed keys whose differing columns a report names
RECHECK_SECONDS = 5.0
LOCK_WAIT_SECONDS = 60.0
_RANGED_TYPE = re.compile(r"(smallint|integer|bigint|numeric\(\d+,0\))")  # keys both databases order alike
EQUAL, DIFFERS, UNCONFIRMED = 0, 1, 3  # the command's exit codes


@dataclass
class ColumnReport:
    """One source column: its destination column, and how it is compared or why it is left out."""

    source: str
    destination: str | None
    compared: str | None
    left_out: str | None = None


@dataclass
class Leaf:
    """A key range small enough to compare row by row (None bounds: unbounded), and what differs in it."""

    lower: list[Any] | None
    upper: list[Any] | None
    missing: set[tuple[Any, ...]] = field(default_factory=set)
    extra: set[tuple[Any, ...]] = field(default_factory=set)
    changed: set[tuple[Any, ...]] = field(default_factory=set)
    listed: bool = True  # False: the range differs, but its rows are not named (see TableReport.unlisted)

    @property
    def differs(self) -> bool:
        return bool(self.missing or self.extra or self.changed) or not self.listed


@dataclass
class TableReport:
    """One table's comparison: the ranges and keys that differ, the columns left out, the rows repaired."""

    source_table: str
    destination_table: str
    key: list[str]
    compared_by: str = "key ranges"
    chunks: int = 0
    source_rows: int = 0
    destination_rows: int = 0
    columns: list[ColumnReport] = field(default_factory=list)
    leaves: list[Leaf] = field(default_factory=list)
    unlisted: str | None = None  # why a differing range's rows are not named
    changed_columns: dict[str, list[str]] = field(default_factory=dict)  # a changed key: its columns that differ
    repaired_rows: int = 0
    deleted_rows: int = 0
    repair: str | None = None  # why a differing range was not repaired
    error: str | None = None

    @property
    def differs(self) -> bool:
        return self.error is not None or any(leaf.differs for leaf in self.leaves)

    def keys(self, kind: str) -> list[list[Any]]:
        return [list(key) for key in sorted({key for leaf in self.leaves for key in getattr(leaf, kind)},
                                            key=lambda key: [str(part).zfill(40) for part in key])]

    def as_dict(self) -> dict[str, Any]:
        return {
            "source_table": self.source_table, "destination_table": self.destination_table, "key": self.key,
            "compared_by": self.compared_by, "chunks": self.chunks, "source_rows": self.source_rows,
            "destination_rows": self.destination_rows, "differs": self.differs,
            "differing_ranges": [{"lower": leaf.lower, "upper": leaf.upper} for leaf in self.leaves if leaf.differs],
            "missing_keys": self.keys("missing"), "extra_keys": self.keys("extra"),
            "changed_keys": self.keys("changed"), "changed_columns": self.changed_columns,
            "unlisted": self.unlisted,
            "columns": [asdict(column) for column in self.columns],
            "left_out": {column.source: column.left_out for column in self.columns if column.left_out},
            "repaired_rows": self.repaired_rows, "deleted_rows": self.deleted_rows, "repair": self.repair,
            "error": self.error,
        }


@dataclass
class VerifyReport:
    """A connector's comparison: per table, and whether the differences are confirmed (`unconfirmed`: the source
    holds changes the connector has not applied, and says which)."""

    connector: str
    tables: list[TableReport]
    seconds: float = 0.0
    unconfirmed: str | None = None
    applied_position: dict[str, Any] | None = None

    @property
    def differs(self) -> bool:
        return any(table.differs for table in self.tables)

    @property
    def exit_code(self) -> int:
        if not self.differs:
            return EQUAL
        return UNCONFIRMED if self.unconfirmed else DIFFERS

    def as_dict(self) -> dict[str, Any]:
        return {"connector": self.connector, "differs": self.differs, "unconfirmed": self.unconfirmed,
                "applied_position": self.applied_position, "seconds": round(self.seconds, 3),
                "tables": [table.as_dict() for table in self.tables]}


def _escaped(text: sql.Composable) -> sql.Composable:
    """The COPY text field of a destination value's text (as `copy_escape` makes it; `\\N` for NULL)."""
    for char, escape in ESCAPES:
        text = sql.SQL("replace({}, {}, {})").format(text, sql.Literal(char), sql.Literal(escape))
    return sql.SQL("coalesce({}, {})").format(text, sql.Literal(NULL_TEXT))


class _TableCheck:
    """Compares one table: its ranges' hashes, then the rows of the ranges that differ."""

    def __init__(self, source: Any, cur: Any, conn: psycopg.Connection, connector: ConnectorConfig,
                 object_map: ObjectMap, source_table: str, chunk_rows: int) -> None:
        self.source, self.cur, self.conn, self.connector = source, cur, conn, connector
        self.source_table, self.chunk_rows = source_table, chunk_rows
        self.database, self.table = connector.split_table(source_table)
        self.dest_schema, self.dest_table = object_map.table_name(source_table)
        self.report = TableReport(source_table, f"{self.dest_schema}.{self.dest_table}",
                                  source.chunk_key(cur, self.database, self.table))
        with conn.cursor() as dest:
            existing = destination_table(dest, self.dest_schema, self.dest_table)
        if existing is None:
            raise CdcError(f"the destination table {self.report.destination_table} does not exist",
                           connector=connector.name, table=source_table)
        self.texts: dict[str, ColumnText] = {}
        for column in source.list_columns(cur, self.database, self.table):
            dest_name = object_map.column_name(source_table, column.name)
            if dest_name not in existing.columns:
                self.report.columns.append(ColumnReport(column.name, None, None, "the destination has no such column"))
                continue
            pg_type = copy_plan.input_type(existing, dest_name)
            transform = object_map.transform(source_table, column.name)
            text = ColumnText(left_out=f"written through the transform {transform.expression!r}") if transform \
                else source.verify_text(column, pg_type, sql.Identifier(dest_name))
            rule = object_map.column_type(source_table, column.name, column.data_type, False, None, None)
            how = text.how + (f" (datatype rule: {pg_type})" if rule and not text.left_out else "")
            self.report.columns.append(ColumnReport(column.name, dest_name, None if text.left_out else how,
                                                    text.left_out))
            if not text.left_out:
                self.texts[column.name] = text
        key = self.report.key
        self.dest_key = [object_map.column_name(source_table, name) for name in key]
        self.ranged = bool(key) and all(
            name in self.texts and _RANGED_TYPE.fullmatch(existing.columns.get(dest, "")) is not None
            for name, dest in zip(key, self.dest_key))
        self.listable = bool(key) and all(name in self.texts for name in key)
        if not key:
            self.report.compared_by = "the whole table (it has no key)"
        elif not self.ranged:
            self.report.compared_by = "the whole table (its key is not of an integer type)"
        texts = list(self.texts.values())
        self.source_line = source.copy_line_sql([text.source for text in texts]) if texts else "''"
        self.dest_line = sql.SQL(" || chr(9) || ").join(
            sql.SQL("({})").format(_escaped(text.destination)) for text in texts) if texts else sql.Literal("")
        key_texts = [self.texts[name] for name in key if name in self.texts]
        self.source_key = source.copy_line_sql([text.source for text in key_texts]) if key_texts else "''"
        self.dest_key_text = sql.SQL(" || chr(9) || ").join(
            sql.SQL("({})").format(_escaped(text.destination)) for text in key_texts) if key_texts else sql.Literal("")

    # The two sides' SQL over a key range.

    def _source_where(self, lower: list[Any] | None, upper: list[Any] | None) -> str:
        return self.source.chunk_predicate(self.report.key, lower, upper) if self.ranged else "1 = 1"

    def _source_select(self, fields: str, lower: list[Any] | None, upper: list[Any] | None) -> str:
        """The source's query of `fields` (SQL the source module wrote) over the range, as text: PyMySQL has no
        identifier composition like psycopg.sql, so the table's name is quoted by the source's own `qualified` and
        the bounds are its literals (`chunk_predicate`)."""
        return (f"SELECT {fields} FROM {self.source.qualified(self.database, self.table)} "
                f"WHERE {self._source_where(lower, upper)}")

    def _dest_where(self, lower: list[Any] | None, upper: list[Any] | None) -> sql.Composable:
        if not self.ranged:
            return sql.SQL("true")
        key = sql.SQL("ROW({})").format(sql.SQL(", ").join(map(sql.Identifier, self.dest_key)))
        parts = []
        for bound, operator in ((lower, ">="), (upper, "<")):
            if bound is not None:
                parts.append(sql.SQL("{} {} ROW({})").format(key, sql.SQL(operator), sql.SQL(", ").join(
                    sql.Literal(str(value)) for value in bound)))
        return sql.SQL(" AND ").join(parts) if parts else sql.SQL("true")

    def hashes(self, lower: list[Any] | None, upper: list[Any] | None) -> tuple[tuple[int, int], tuple[int, int]]:
        """(rows, sum of row hashes) of the range in the source and in the destination."""
        self.cur.execute(self._source_select(
            f"COUNT(*), COALESCE(SUM({self.source.row_hash_sql(self.source_line)}), 0)", lower, upper))
        source_rows, source_sum = self.cur.fetchone()
        dest_hash = sql.SQL(sources.postgres_row_hash_sql("{}")).format(self.dest_line)
        query = sql.SQL("SELECT count(*), coalesce(sum({}), 0) FROM {} WHERE {}").format(
            dest_hash, sql.Identifier(self.dest_schema, self.dest_table), self._dest_where(lower, upper))
        dest_rows, dest_sum = self.conn.execute(query).fetchone()
        return (int(source_rows), int(source_sum)), (int(dest_rows), int(dest_sum))

    def rows(self, lower: list[Any] | None, upper: list[Any] | None) -> tuple[dict[tuple, str], dict[tuple, str]]:
        """Each side's rows of the range: key -> MD5 of the row's line."""
        self.cur.execute(self._source_select(f"{self.source_key}, MD5({self.source_line})", lower, upper))
        source_rows = {self._key(key): digest for key, digest in self.cur.fetchall()}
        dest_rows = self.conn.execute(sql.SQL("SELECT {}, md5({}) FROM {} WHERE {}").format(
            self.dest_key_text, self.dest_line, sql.Identifier(self.dest_schema, self.dest_table),
            self._dest_where(lower, upper))).fetchall()
        return source_rows, {self._key(key): digest for key, digest in dest_rows}

    def _key(self, text: Any) -> tuple[Any, ...]:
        """A key as the report names it: its columns' COPY text (integers as numbers)."""
        if isinstance(text, (bytes, bytearray)):
            text = text.decode()
        parts = str(text).split("\t")
        return tuple(int(part) for part in parts) if self.ranged else tuple(parts)

    # The comparison.

    def compare(self) -> None:
        """The first look: every range's hashes, and the differing ranges split down to rows."""
        lower: list[Any] | None = None
        while True:
            upper = (self.source.next_chunk_start(self.cur, self.database, self.table, self.report.key, lower,
                                                  self.chunk_rows) if self.ranged else None)
            source, dest = self.hashes(lower, upper)
            self.report.chunks += 1
            self.report.source_rows += source[0]
            self.report.destination_rows += dest[0]
            if source != dest:
                self.report.leaves += self._split(lower, upper, max(source[0], dest[0]))
            if upper is None:
                break
            lower = upper
        for leaf in self.report.leaves:
            self.diff(leaf)

    def _split(self, lower: list[Any] | None, upper: list[Any] | None, rows: int) -> list[Leaf]:
        """A differing range as the smallest ranges that differ (at most about LIST_ROWS rows each)."""
        if not self.ranged or rows <= LIST_ROWS:
            return [Leaf(lower, upper)]
        step = max(LIST_ROWS, rows // 8)
        bounds: list[list[Any] | None] = [lower]
        while True:
            start = self.source.next_chunk_start(self.cur, self.database, self.table, self.report.key, bounds[-1],
                                                 step)
            if start is None or (upper is not None and _at_or_after(start, upper)):
                break
            bounds.append(start)
        bounds.append(upper)
        if len(bounds) == 2:
            return [Leaf(lower, upper)]
        leaves = []
        for low, high in zip(bounds, bounds[1:]):
            source, dest = self.hashes(low, high)
            if source != dest:
                leaves += self._split(low, high, max(source[0], dest[0]))
        return leaves

    def diff(self, leaf: Leaf) -> None:
        """Reads the leaf's rows on both sides and keeps, of the keys it differed in, those that differ still (all
        of them on the first look)."""
        if not self.listable:
            self.report.unlisted = "the table has no key" if not self.report.key else "a key column is not compared"
            leaf.listed = False
            return
        source, dest = self.hashes(leaf.lower, leaf.upper)
        if source == dest:
            leaf.missing, leaf.extra, leaf.changed, leaf.listed = set(), set(), set(), True
            return
        if max(source[0], dest[0]) > UNRANGED_LIST_LIMIT:
            self.report.unlisted = f"the range holds more than {UNRANGED_LIST_LIMIT} rows"
            leaf.listed = False
            return
        source_rows, dest_rows = self.rows(leaf.lower, leaf.upper)
        missing = set(source_rows) - set(dest_rows)
        extra = set(dest_rows) - set(source_rows)
        changed = {key for key in set(source_rows) & set(dest_rows) if source_rows[key] != dest_rows[key]}
        first = not (leaf.missing or leaf.extra or leaf.changed)
        leaf.missing = missing if first else leaf.missing & missing
        leaf.extra = extra if first else leaf.extra & extra
        leaf.changed = changed if first else leaf.changed & changed
        leaf.listed = True

    def name_changed_columns(self) -> None:
        """For the changed keys (up to CHANGED_COLUMNS_KEYS of them), the columns whose values differ."""
        names = list(self.texts)
        for leaf in self.report.leaves:
            wanted = sorted(leaf.changed, key=str)[:CHANGED_COLUMNS_KEYS - len(self.report.changed_columns)]
            if not wanted:
                continue
            fields = ", ".join(f"MD5({self.texts[name].source})" for name in names)
            self.cur.execute(self._source_select(f"{self.source_key}, {fields}", leaf.lower, leaf.upper))
            source = {self._key(row[0]): row[1:] for row in self.cur.fetchall()}
            digests = sql.SQL(", ").join(sql.SQL("md5({})").format(_escaped(self.texts[name].destination))
                                         for name in names)
            rows = self.conn.execute(sql.SQL("SELECT {}, {} FROM {} WHERE {}").format(
                self.dest_key_text, digests, sql.Identifier(self.dest_schema, self.dest_table),
                self._dest_where(leaf.lower, leaf.upper))).fetchall()
            dest = {self._key(row[0]): row[1:] for row in rows}
            for key in wanted:
                if key in source and key in dest:
                    self.report.changed_columns[_key_text(key)] = [
                        name for name, one, other in zip(names, source[key], dest[key]) if one != other]

    def recheck(self) -> None:
        for leaf in self.report.leaves:
            if leaf.differs:
                if leaf.listed:
                    self.diff(leaf)
                else:
                    source, dest = self.hashes(leaf.lower, leaf.upper)
                    leaf.listed = source == dest
        self.report.leaves = [leaf for leaf in self.report.leaves if leaf.differs]


def _at_or_after(key: Sequence[Any], bound: Sequence[Any]) -> bool:
    return tuple(int(value) for value in key) >= tuple(int(value) for value in bound)


def verify_connector(connector: ConnectorConfig, destination: DestinationConfig, spark: Any = None,
                     tables: Sequence[str] | None = None, repair: bool = False, *, chunk_rows: int = CHUNK_ROWS,
                     rechecks: int = RECHECKS, recheck_seconds: float = RECHECK_SECONDS) -> VerifyReport:
    """Compares the connector's tables (or `tables`, `db.table`) in the source and the destination; with `repair`
    (which needs `spark`, a SparkSession), copies the ranges that differ again. See the module's docstring."""
    source = sources.module_for(connector.type)
    if source.verify_text is None and source.key_range_counts is not None:
        if repair:
            raise CdcError(f"verify --repair of {connector.type} sources is not available: the bulk snapshot's "
                           "reader, which repair copies ranges with, reads MariaDB/MySQL and PostgreSQL only",
                           connector=connector.name)
        return _count_ranges(connector, destination, source, tables, chunk_rows, rechecks, recheck_seconds)
    if source.verify_text is None:
        raise CdcError(f"verify of {connector.type} sources is not available", connector=connector.name)
    if repair and spark is None:
        raise CdcError("verify --repair reads the source with Spark: it needs a Spark session",
                       connector=connector.name)
    started = time.monotonic()
    schema, name = destination.control_schema, connector.name
    with destination.connect(name) as conn, source.connect(connector) as source_conn, source_conn.cursor() as cur:
        control.ensure_control_schema(conn, schema)
        if bookkeeping.running_load(conn, schema, name) is not None or \
                bookkeeping.unreconciled_end(conn, schema, name) is not None:
            raise CdcError("the connector's bulk snapshot is not finished, or the stream has not passed its end: its "
                           "tables hold rows of different moments until then; verify once it has",
                           connector=name)
        with conn.cursor() as dest:
            sources.postgres_verify_session(dest)
        source.verify_session(cur)
        object_map = ObjectMap(connector, read_rules(conn, schema, name))
        listed = [table.name for table in source.tables_of(cur, connector) if sources.captures(connector, table.name)]
        chosen, unknown = sources.select_tables(connector, tables or None, listed)
        if unknown:
            raise CdcError(f"verify names tables the connector does not replicate: {', '.join(unknown)}",
                           connector=name)
        checks, missing = [], []
        for source_table in chosen:
            try:
                check = _TableCheck(source, cur, conn, connector, object_map, source_table, chunk_rows)
            except CdcError as exc:
                schema_name, table_name = object_map.table_name(source_table)
                missing.append(TableReport(source_table, f"{schema_name}.{table_name}", [], error=exc.message))
                continue
            check.compare()
            checks.append(check)
            log.info("%s: verify %s: %d chunks, %d differing ranges", name, source_table, check.report.chunks,
                     sum(leaf.differs for leaf in check.report.leaves))
        report = VerifyReport(name, [check.report for check in checks] + missing)
        _recheck(checks, rechecks, recheck_seconds)
        if report.differs:
            for check in checks:
                check.name_changed_columns()
            report.unconfirmed = _unapplied_changes(conn, connector, schema)
            report.applied_position = control.read_applied_offset(conn, schema, name)
        if repair and report.differs:
            _repair(connector, destination, spark, object_map, cur, checks)
            _recheck(checks, 1, 0.0)
            for check in checks:
                changed = {_key_text(key) for key in check.report.keys("changed")}
                check.report.changed_columns = {key: columns for key, columns in check.report.changed_columns.items()
                                                if key in changed}
    report.seconds = time.monotonic() - started
    return report


RANGE_COUNTS = "row counts per key range"
UNHASHED = ("the rows of SQL Server and Oracle sources are counted per key range, not hashed: a row changed in place "
            "is not seen, and rows are not named (rendering each of their types as PostgreSQL's text, in their SQL, "
            "is not proven without a server)")


def _count_ranges(connector: ConnectorConfig, destination: DestinationConfig, source: Any,
                  tables: Sequence[str] | None, chunk_rows: int, rechecks: int,
                  recheck_seconds: float) -> VerifyReport:
    """`verify` of a source whose rows are not hashed (SQL Server, Oracle): each table's rows counted per range of
    its integer key (`key_range_counts` of the source module) on both sides; a table without such a key by its row
    count. Ranges that differ are counted again `rechecks` times, `recheck_seconds` apart, as rows are re-read."""
    started = time.monotonic()
    schema, name = destination.control_schema, connector.name

    def chosen(table: str) -> bool:
        return sources.captures(connector, table) and (not tables or table in tables)

    with destination.connect(name) as conn:
        control.ensure_control_schema(conn, schema)
        object_map = ObjectMap(connector, read_rules(conn, schema, name))
        counted = source.key_range_counts(connector, chosen, chunk_rows)
        unknown = sorted(set(tables or ()) - set(counted))
        if unknown:
            raise CdcError(f"verify names tables the connector does not replicate: {', '.join(unknown)}",
                           connector=name)
        reports = {table: _range_report(conn, object_map, table, counts) for table, counts in sorted(counted.items())}
        for _ in range(rechecks):
            differing = [table for table, report in reports.items() if report.differs and not report.error]
            if not differing:
                break
            time.sleep(recheck_seconds)
            for table, counts in source.key_range_counts(connector, differing.__contains__, chunk_rows).items():
                reports[table] = _range_report(conn, object_map, table, counts)
        report = VerifyReport(name, list(reports.values()))
        if report.differs:
            report.unconfirmed = _unapplied_changes(conn, connector, schema)
            report.applied_position = control.read_applied_offset(conn, schema, name)
    report.seconds = time.monotonic() - started
    return report


def _range_report(conn: psycopg.Connection, object_map: ObjectMap, source_table: str, counts: Any) -> TableReport:
    """One table's counts (`RangeCounts` of the source) against the destination's over the same ranges."""
    dest_schema, dest_table = object_map.table_name(source_table)
    report = TableReport(source_table, f"{dest_schema}.{dest_table}", [counts.key] if counts.key else [],
                         compared_by=RANGE_COUNTS, unlisted=UNHASHED)
    with conn.cursor() as dest:
        existing = destination_table(dest, dest_schema, dest_table)
    if existing is None:
        report.error = f"the destination table {report.destination_table} does not exist"
        return report
    source_rows, key = counts.rows, counts.key and object_map.column_name(source_table, counts.key)
    if key and _RANGED_TYPE.fullmatch(existing.columns.get(key, "")) is None:
        key, source_rows = None, {0: sum(counts.rows.values())} if counts.rows else {}
    if key:
        query = sql.SQL("SELECT floor(({} - {})::numeric / {})::bigint, count(*) FROM {} GROUP BY 1").format(
            sql.Identifier(key), sql.Literal(counts.base), sql.Literal(counts.width),
            sql.Identifier(dest_schema, dest_table))
    else:
        report.compared_by = "the row count of the whole table (no key of one integer column)"
        query = sql.SQL("SELECT 0, count(*) FROM {} HAVING count(*) > 0").format(
            sql.Identifier(dest_schema, dest_table))
    dest_rows = {int(number): int(rows) for number, rows in conn.execute(query).fetchall()}
    numbers = sorted(set(source_rows) | set(dest_rows))
    report.chunks = len(numbers)
    report.source_rows, report.destination_rows = sum(source_rows.values()), sum(dest_rows.values())
    for number in numbers:
        if source_rows.get(number, 0) != dest_rows.get(number, 0):
            bounds = ([counts.base + number * counts.width], [counts.base + (number + 1) * counts.width]) if key \
                else (None, None)
            report.leaves.append(Leaf(*bounds, listed=False))
    return report


def _recheck(checks: list[_TableCheck], rechecks: int, recheck_seconds: float) -> None:
    """Reads the differing rows again, `rechecks` times `recheck_seconds` apart: a row that matches at one look was a
    change the destination had not applied yet."""
    for _ in range(rechecks):
        if not any(check.report.differs for check in checks):
            return
        time.sleep(recheck_seconds)
        for check in checks:
            check.recheck()


def _unapplied_changes(conn: psycopg.Connection, connector: ConnectorConfig, schema: str) -> str | None:
    """Why the differences are not confirmed: the source holds changes the connector has not applied, or could not be
    checked (the change check's reason, whatever the connector's state: a paused connector's changes are not
    applied either), or None."""
    state = control.read_state(conn, schema, connector.name)
    if state is None:
        return "the connector has not run yet"
    source = sources.module_for(connector.type)
    try:
        found = source.check_changes(connector, state.get("source_checked"),
                                     checked_offset(conn, schema, connector.name, source),
                                     lambda table: sources.captures(connector, table))
    except CdcError as exc:
        return f"the change check failed: {exc.message}"
    return found.reason if found.changes or not found.known else None


def _acquire_run_lock(conn: psycopg.Connection, connector: str) -> None:
    """The connector's run lock, waited for: a lingering or standing run ends at its next cut once it sees the wait."""
    try:
        control.wait_for_run_lock(conn, connector, LOCK_WAIT_SECONDS)
    except ConnectorBusyError:
        raise CdcError(f"verify --repair waited {LOCK_WAIT_SECONDS:.0f} s for the connector's fetch cycle to "
                       "end (pause the connector, then repair)", connector=connector) from None


def _repair(connector: ConnectorConfig, destination: DestinationConfig, spark: Any, object_map: ObjectMap,
            cur: Any, checks: list[_TableCheck]) -> None:
    """Copies each differing range again from the source, under the connector's run lock."""
    with destination.connect(connector.name) as conn:
        _acquire_run_lock(conn, connector.name)
        try:
            for check in checks:
                report = check.report
                leaves = [leaf for leaf in report.leaves if leaf.differs]
                if not leaves:
                    continue
                if not report.key:
                    report.repair = (f"a table without a key is copied again whole: cdc-pipeline snapshot "
                                     f"{connector.name} {report.source_table}")
                    continue
                if not check.ranged and report.source_rows > UNRANGED_LIST_LIMIT:
                    report.repair = (f"the table is compared whole and holds more than {UNRANGED_LIST_LIMIT} rows: "
                                     f"cdc-pipeline snapshot {connector.name} {report.source_table}")
                    continue
                _repair_table(conn, connector, destination, spark, object_map, cur, check, leaves)
        finally:
            control.release_run_lock(conn, connector.name)


def _repair_table(conn: psycopg.Connection, connector: ConnectorConfig, destination: DestinationConfig, spark: Any,
                  object_map: ObjectMap, cur: Any, check: _TableCheck, leaves: list[Leaf]) -> None:
    report = check.report
    table = chunk_plan.TableLoad(report.source_table, check.dest_schema, check.dest_table, report.key, 0, None, True,
                                 False)
    loader = BulkLoader(conn, connector, destination, spark, object_map)
    chunks = [chunk_plan.Chunk(0, leaf.lower, leaf.upper) for leaf in leaves] if check.ranged \
        else [chunk_plan.Chunk(0, None, None)]
    columns, lines = loader.repair_lines(cur, table, chunks)
    rows = [row[0] for row in lines.where("line IS NOT NULL").select("line").collect()]
    before, copy, after = copy_plan.copy_statements(object_map, table, columns)
    target = sql.Identifier(check.dest_schema, check.dest_table)
    with conn.transaction(), conn.cursor() as dest:
        for leaf in leaves if check.ranged else leaves[:1]:
            dest.execute(sql.SQL("DELETE FROM {} WHERE {}").format(target, check._dest_where(leaf.lower, leaf.upper)))
            report.deleted_rows += dest.rowcount
        for statement in before:
            dest.execute(statement)
        with dest.copy(copy) as writer:
            for line in rows:
                writer.write(line + "\n")
        for statement in after:
            dest.execute(statement)
    report.repaired_rows += len(rows)
    log.info("%s: verify --repair %s: %d ranges copied again (%d rows deleted, %d copied)", connector.name,
             report.source_table, len(leaves), report.deleted_rows, len(rows))


# Past this many tables, the text report names only the tables with something to say (`format_report`).
TABLES_LISTED = 10


def format_report(report: VerifyReport, every_table: bool = False) -> str:
    """The report as text: per table, what was compared and what differs. Of more than TABLES_LISTED tables (and
    unless `every_table`), the equal tables whose columns were all compared as text are counted, not listed."""
    lines = []
    quiet = [table for table in report.tables if not table.error and not table.differs and not any(
        column.left_out or (column.compared and column.compared != "as text") for column in table.columns)]
    counted = set() if every_table or len(report.tables) <= TABLES_LISTED else {id(table) for table in quiet}
    for table in report.tables:
        if id(table) in counted:
            continue
        state = "NOT COMPARED" if table.error else "DIFFERS" if table.differs else "equal"
        lines.append(f"{table.source_table} -> {table.destination_table}: {state} ({table.source_rows} rows in the "
                     f"source, {table.destination_rows} in the destination; {table.chunks} chunks compared by "
                     f"{table.compared_by})")
        for column in table.columns:
            if column.left_out:
                lines.append(f"  column {column.source} left out: {column.left_out}")
            elif column.compared and column.compared != "as text":
                lines.append(f"  column {column.source} compared {column.compared}")
        for leaf in table.leaves:
            if leaf.differs:
                lines.append(f"  range {_bound(leaf.lower, '(start)')} .. {_bound(leaf.upper, '(end)')} differs")
        for kind, label in (("missing", "missing in the destination"), ("extra", "extra in the destination"),
                            ("changed", "changed")):
            keys = table.keys(kind)
            if keys:
                shown = ", ".join(_key_text(key) for key in keys[:20])
                lines.append(f"  {len(keys)} keys {label}: {shown}{' ...' if len(keys) > 20 else ''}")
        for key, columns in table.changed_columns.items():
            lines.append(f"  key {key}: columns {', '.join(columns)} differ")
        if table.unlisted and table.differs:
            lines.append(f"  rows not named: {table.unlisted}")
        if table.repaired_rows or table.deleted_rows:
            lines.append(f"  repaired: {table.deleted_rows} rows deleted, {table.repaired_rows} copied again")
        if table.repair:
            lines.append(f"  not repaired: {table.repair}")
        if table.error:
            lines.append(f"  not compared: {table.error}")
    if counted:
        rows = sum(table.source_rows or 0 for table in quiet)
        lines.append(f"{len(counted)}{' more' if lines else ''} tables equal ({rows} rows in the source; "
                     "--every-table lists them)")
    if report.differs and report.unconfirmed:
        lines.append(f"unconfirmed: the source holds changes the connector has not applied ({report.unconfirmed}); "
                     "verify again once it has")
    lines.append(f"connector {report.connector}: {'differences remain' if report.differs else 'equal'} "
                 f"({report.seconds:.1f} s)")
    return "\n".join(lines)


def _bound(bound: list[Any] | None, unbounded: str) -> str:
    return unbounded if bound is None else _key_text(bound)


def _key_text(key: Sequence[Any]) -> str:
    return str(key[0]) if len(key) == 1 else "(" + ", ".join(map(str, key)) + ")"
