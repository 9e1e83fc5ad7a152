"""Object mapping rules: what a source table, column and type become in the destination, and transform
expressions the destination runs on converted values.

This module holds the rules' grammar (`parse_rule`, `parse_type_mapping`, `parse_transform`) and `ObjectMap`, one
connector's rules for a fetch cycle: DDL changes go through `map_change`, DML through `table_name`, `column_name`
and `transforms`. The rules' storage in the control schema, the record of what each source column became and
`reload_mapping` are in `rule_store.py`; a transform as SQL, the staged values' casts and the failure bisection in
`transform_sql.py`; what a transform may contain in `transform_guard.py`.

A transform is one SQL expression. It runs in the destination, set-wise, on the staged converted values: `%d`
becomes a reference to the value (typed as the destination column, or its text inside a string literal), never
the value spliced into SQL text.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence


from cdc_pipeline.config import ConnectorConfig
from cdc_pipeline.convert.ddl import DdlChange, TableDef, parse_table_id
from cdc_pipeline.convert.dml import ColumnPlan, Converter
from cdc_pipeline.errors import ConversionError, MappingRuleError
from cdc_pipeline.mapping.transform_guard import TransformRejected, check_expression, check_type_name
from cdc_pipeline.convert.typemap import ColumnDef, canonical_pg_type, default_table_name, dest_identifier

log = logging.getLogger(__name__)

TABLE = "table"
COLUMN = "column"
DATATYPE = "datatype"
TRANSFORM = "transform"
KINDS = (TABLE, COLUMN, DATATYPE, TRANSFORM)

KEEP_LENGTH = -1
NO_LENGTH = 0

_MYSQL_TYPES = frozenset({"mariadb", "mysql"})
_PG_TYPE = re.compile(
    r"[a-z_][a-z0-9_]*(\s*\.\s*[a-z_][a-z0-9_]*)?(\s+[a-z_][a-z0-9_]*)*"
    r"(\s*\(\s*\w+\s*(,\s*\w+\s*)?\))?(\s+with(out)?\s+time\s+zone)?(\s*\[\])*",
    re.IGNORECASE,
)
_SOURCE_TYPE = re.compile(r"[a-z][a-z0-9_ ]*", re.IGNORECASE)
_GEOMETRY_LOGICAL = frozenset({
    "io.debezium.data.geometry.Geometry", "io.debezium.data.geometry.Geography", "io.debezium.data.geometry.Point",
})


@dataclass(frozen=True)
class Rule:
    """One mapping rule of a connector: its kind, source object and destination object, as stored."""

    kind: str
    source: str
    destination: str


# Types without a length: a source length (MariaDB's display width of INT(11), say) is not kept for them.
_TYPES_WITHOUT_LENGTH = frozenset({
    "smallint", "integer", "int", "bigint", "int2", "int4", "int8", "real", "double precision", "float4", "float8",
    "text", "boolean", "bool", "date", "bytea", "json", "jsonb", "uuid", "xml", "inet", "cidr", "money",
})


@dataclass(frozen=True)
class TypeMapping:
    """A datatype rule's destination: a PostgreSQL type and a length (-1 the source's, 0 none)."""

    pg_type: str
    length: int

    def apply(self, source_length: int | None, source_scale: int | None) -> str:
        if self.length > 0:
            return f"{self.pg_type}({self.length})"
        if (self.length == KEEP_LENGTH and source_length is not None and source_length > 0
                and self.pg_type.lower() not in _TYPES_WITHOUT_LENGTH):
            if source_scale is not None and source_scale > 0:
                return f"{self.pg_type}({source_length},{source_scale})"
            return f"{self.pg_type}({source_length})"
        return self.pg_type


@dataclass(frozen=True)
class Placeholder:
    letter: str  # "d" the converted value, "w" a geometry's WKB, "s" its SRID


@dataclass(frozen=True)
class _StringWithPlaceholders:
    pieces: tuple[str | Placeholder, ...]


@dataclass(frozen=True)
class Transform:
    """A parsed transform expression: SQL text with placeholders (`%d`, `%w`, `%s`) and string literals that
    hold placeholders, which become concatenations of the literal's text and the value's text."""

    expression: str
    parts: tuple[str | Placeholder | _StringWithPlaceholders, ...]

    @property
    def uses_geometry(self) -> bool:
        return any(letter in ("w", "s") for letter in self._letters())

    def _letters(self) -> Iterable[str]:
        for part in self.parts:
            if isinstance(part, Placeholder):
                yield part.letter
            elif isinstance(part, _StringWithPlaceholders):
                yield from (piece.letter for piece in part.pieces if isinstance(piece, Placeholder))


def parse_transform(expression: str) -> Transform:
    """Parses a transform expression; refuses more than one expression (`;`), comments, dollar quotes, E'' strings,
    unbalanced quotes or parentheses and placeholders other than %d, %w, %s and %%."""
    parts: list[str | Placeholder | _StringWithPlaceholders] = []
    text: list[str] = []
    depth = 0
    index = 0

    def flush() -> None:
        if text:
            parts.append("".join(text))
            text.clear()

    while index < len(expression):
        char = expression[index]
        if char == "'":
            if index > 0 and expression[index - 1] in "eE" and (index < 2 or not expression[index - 2].isalnum()):
                raise MappingRuleError(f"transform {expression!r}: E'' strings are not supported")
            literal, index = _read_literal(expression, index)
            if any(isinstance(piece, Placeholder) for piece in literal):
                flush()
                parts.append(_StringWithPlaceholders(literal))
            else:
                text.append(quote_literal("".join(str(piece) for piece in literal)))
            continue
        if char == '"':
            end = expression.find('"', index + 1)
            while end >= 0 and expression.startswith('""', end):
                end = expression.find('"', end + 2)
            if end < 0:
                raise MappingRuleError(f"transform {expression!r}: unterminated quoted identifier")
            text.append(expression[index:end + 1])
            index = end + 1
            continue
        if char == "%":
            letter = expression[index + 1:index + 2]
            if letter == "%":
                text.append("%")
            elif letter in ("d", "w", "s"):
                flush()
                parts.append(Placeholder(letter))
            else:
                raise MappingRuleError(
                    f"transform {expression!r}: unknown placeholder %{letter} (use %d, %w, %s or %%)")
            index += 2
            continue
        if char == ";":
            raise MappingRuleError(f"transform {expression!r}: a transform is one expression, without ';'")
        if char == "$" or expression.startswith("--", index) or expression.startswith("/*", index):
            raise MappingRuleError(f"transform {expression!r}: comments and dollar quotes are not supported")
        if char in "()":
            depth += 1 if char == "(" else -1
            if depth < 0:
                raise MappingRuleError(f"transform {expression!r}: unbalanced parentheses")
        text.append(char)
        index += 1
    if depth:
        raise MappingRuleError(f"transform {expression!r}: unbalanced parentheses")
    flush()
    if not expression.strip():
        raise MappingRuleError("a transform needs an expression")
    # PostgreSQL's parser has the last word: one scalar expression of the value, nothing else (transform_guard).
    parameters = {"d": "$1", "w": "$2", "s": "$3"}
    try:
        check_expression("".join(
            parameters[part.letter] if isinstance(part, Placeholder)
            else "'x'" if isinstance(part, _StringWithPlaceholders) else part for part in parts))
    except TransformRejected as exc:
        raise MappingRuleError(f"transform {expression!r}: {exc}") from None
    return Transform(expression, tuple(parts))


def _read_literal(expression: str, start: int) -> tuple[tuple[str | Placeholder, ...], int]:
    """The pieces of the string literal opening at `start` ('' is a quote), and the index after it."""
    pieces: list[str | Placeholder] = []
    chars: list[str] = []
    index = start + 1
    while index < len(expression):
        char = expression[index]
        if char == "'":
            if expression.startswith("''", index):
                chars.append("'")
                index += 2
                continue
            if chars:
                pieces.append("".join(chars))
            return tuple(pieces), index + 1
        if char == "%" and expression[index + 1:index + 2] in ("d", "w", "s"):
            if chars:
                pieces.append("".join(chars))
                chars = []
            pieces.append(Placeholder(expression[index + 1]))
            index += 2
            continue
        if char == "%" and expression[index + 1:index + 2] == "%":
            chars.append("%")
            index += 2
            continue
        chars.append(char)
        index += 1
    raise MappingRuleError(f"transform {expression!r}: unterminated string literal")


def quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def parse_type_mapping(destination: str) -> TypeMapping:
    """`pgtype|length` (or `pgtype`, no length): -1 keeps the source length, 0 none, n > 0 that length."""
    pg_type, _, length_text = destination.partition("|")
    pg_type = " ".join(pg_type.split())
    if not _PG_TYPE.fullmatch(pg_type):
        raise MappingRuleError(f"datatype destination {destination!r}: {pg_type!r} is not a PostgreSQL type name")
    try:
        check_type_name(pg_type)
    except TransformRejected as exc:
        raise MappingRuleError(f"datatype destination {destination!r}: {pg_type!r} is not a PostgreSQL type name "
                               f"({exc})") from None
    try:
        length = int(length_text) if length_text.strip() else NO_LENGTH
    except ValueError:
        raise MappingRuleError(f"datatype destination {destination!r}: the length must be an integer "
                               f"(-1 keeps the source length, 0 none)") from None
    if length < KEEP_LENGTH:
        raise MappingRuleError(f"datatype destination {destination!r}: the length must be -1, 0 or positive")
    if "(" in pg_type and length != NO_LENGTH:
        raise MappingRuleError(f"datatype destination {destination!r}: the type has its modifiers already; "
                               f"give length 0")
    return TypeMapping(pg_type, length)


def _parse_source_type(source: str) -> tuple[str, bool]:
    """`type|autoincrement` (`point|false`): the source type name, upper case, and the auto-increment flag."""
    type_name, _, flag = source.partition("|")
    type_name = " ".join(type_name.split()).upper()
    if not _SOURCE_TYPE.fullmatch(type_name):
        raise MappingRuleError(f"datatype source {source!r}: {type_name!r} is not a source type name")
    if flag.strip().lower() not in ("true", "false"):
        raise MappingRuleError(f"datatype source {source!r}: the auto-increment flag after '|' is true or false")
    return type_name, flag.strip().lower() == "true"


def _object_parts(text: str, counts: Sequence[int], what: str) -> tuple[str, ...]:
    try:
        parts = parse_table_id(text.strip())
    except ValueError as exc:
        raise MappingRuleError(f"{text!r} is not {what}: {exc}") from None
    if len(parts) not in counts:
        raise MappingRuleError(f"{text!r} is not {what}")
    return parts


def _source_object(parts: tuple[str, ...], connector: ConnectorConfig, table_parts: int) -> str:
    """The source object in the pipeline's spelling of source tables: `db.table` for MariaDB/MySQL, `schema.table`
    for the others (whose rules may name the database first)."""
    if len(parts) == table_parts + 1:
        if connector.type in _MYSQL_TYPES:
            raise MappingRuleError(f"{'.'.join(parts)!r}: a {connector.type} table is db.table")
        if parts[0].casefold() != connector.database.casefold():
            raise MappingRuleError(f"{'.'.join(parts)!r} names database {parts[0]!r}, not the connector's "
                                   f"{connector.database!r}")
        parts = parts[1:]
    elif connector.type in _MYSQL_TYPES and not connector.captures_database(parts[0]):
        raise MappingRuleError(f"{'.'.join(parts)!r} names database {parts[0]!r}, not one of the connector's "
                               f"({connector.databases_text})")
    return ".".join(parts)


def normalized_source(connector: ConnectorConfig, kind: str, source: str) -> str:
    """A rule's source object as stored: `db.table[.column]` (`schema.table[.column]` for PostgreSQL, SQL Server and
    Oracle sources) or `TYPE|autoincrement`."""
    if kind == DATATYPE and "|" in source:
        type_name, autoincrement = _parse_source_type(source)
        return f"{type_name}|{str(autoincrement).lower()}"
    if kind == TABLE:
        return _source_object(_object_parts(source, (2, 3), "a table (db.table or db.schema.table)"), connector, 2)
    return _source_object(_object_parts(source, (3, 4), "a column (db.table.column)"), connector, 3)


def checked_kind(connector: ConnectorConfig, kind: str) -> str:
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise MappingRuleError(f"unknown rule kind {kind!r}: one of {', '.join(KINDS)}", connector=connector.name)
    return kind


def parse_rule(connector: ConnectorConfig, kind: str, source: str, destination: str) -> Rule:
    """Checks a rule of the connector and returns it as stored; raises MappingRuleError with the reason."""
    kind = checked_kind(connector, kind)
    destination = destination.strip()
    try:
        normalized = normalized_source(connector, kind, source)
        if kind == TABLE:
            destination = ".".join(_object_parts(destination, (1, 2), "a destination table (table or schema.table)"))
        elif kind == COLUMN:
            destination = _object_parts(destination, (1,), "a column name")[0]
        elif kind == DATATYPE:
            mapping = parse_type_mapping(destination)
            destination = f"{mapping.pg_type}|{mapping.length}"
        else:
            parse_transform(destination)
    except MappingRuleError as exc:
        raise MappingRuleError(f"{kind} rule refused: {exc.message}", connector=connector.name) from None
    return Rule(kind, normalized, destination)


def _key(*names: str) -> str:
    return ".".join(names).casefold()


def _source_type_key(source_type: str, autoincrement: bool) -> str:
    """`TYPE|autoincrement` of a source column: its type name without precisions (Oracle's `TIMESTAMP(6) WITH TIME
    ZONE` is `TIMESTAMP WITH TIME ZONE`) and without SQL Server's ` identity` (the flag says it)."""
    words = " ".join(re.sub(r"\(.*?\)", " ", source_type).split()).upper().removesuffix(" IDENTITY")
    return f"{words}|{str(autoincrement).lower()}"


class ObjectMap:
    """One connector's mapping rules, as a fetch cycle applies them; without rules every name and type is the
    default (the connector's destination schema or the source database, the letter casing, the type map).

    Source objects match without regard to letter case.
    """

    def __init__(self, connector: ConnectorConfig, rules: Iterable[Rule] = ()) -> None:
        self.connector = connector
        self.rules = tuple(rules)
        by_kind: dict[str, dict[str, str]] = {kind: {} for kind in KINDS}
        for rule in self.rules:
            by_kind[rule.kind][rule.source.casefold()] = rule.destination
        self._tables = by_kind[TABLE]
        self._columns = by_kind[COLUMN]
        self._types = {source: parse_type_mapping(destination) for source, destination in by_kind[DATATYPE].items()}
        self._transforms = {source: parse_transform(destination)
                            for source, destination in by_kind[TRANSFORM].items()}

    def __bool__(self) -> bool:
        return bool(self.rules)

    def default_table_name(self, source_table: str) -> tuple[str, str]:
        return default_table_name(self.connector, source_table)

    def table_name(self, source_table: str, default: tuple[str, str] | None = None) -> tuple[str, str]:
        """The destination (schema, table) of a source table (`db.table`)."""
        schema, table = default or self.default_table_name(source_table)
        mapped = self._tables.get(_key(source_table))
        if mapped is None:
            return schema, table
        parts = parse_table_id(mapped)
        return (parts[0], parts[1]) if len(parts) == 2 else (schema, parts[0])

    def column_name(self, source_table: str, column: str, default: str | None = None) -> str:
        """The destination name of a source column (a destination-spelled default maps as its source name)."""
        mapped = self._columns.get(_key(source_table, column))
        if mapped is not None:
            return mapped
        return default if default is not None else dest_identifier(column, self.connector.letter_casing)

    def column_type(self, source_table: str, column: str, source_type: str, autoincrement: bool,
                    source_length: int | None, source_scale: int | None) -> str | None:
        """The mapped type of a source column (its own rule first, then one for its source type), or None."""
        mapping = self._types.get(_key(source_table, column)) or self._types.get(
            _source_type_key(source_type, autoincrement).casefold())
        return None if mapping is None else mapping.apply(source_length, source_scale)

    def transform(self, source_table: str, column: str) -> Transform | None:
        return self._transforms.get(_key(source_table, column))

    def map_column(self, source_table: str, column: ColumnDef) -> ColumnDef:
        name = self.column_name(source_table, column.source_name, column.name)
        mapped_type = self.column_type(source_table, column.source_name, column.source_type, column.identity,
                                       column.source_length, column.source_scale)
        if mapped_type is None or canonical_pg_type(mapped_type) == canonical_pg_type(column.pg_type):
            return dataclasses.replace(column, name=name)
        # The source default and the implicit value were rendered for the type map's type.
        return dataclasses.replace(column, name=name, pg_type=mapped_type, type_map_type=column.pg_type,
                                   default_sql=None, implicit_default_sql=None)

    def map_table_def(self, table: TableDef) -> TableDef:
        """The table definition with mapped table, column names and types (keys follow their columns)."""
        schema, name = self.table_name(table.source_id, (table.schema, table.name))
        columns = tuple(self.map_column(table.source_id, column) for column in table.columns)
        names = [column.name for column in columns]
        duplicates = sorted({column for column in names if names.count(column) > 1})
        if duplicates:
            raise MappingRuleError(f"mapping rules give several columns the name(s) {', '.join(duplicates)}",
                                   connector=self.connector.name, table=table.source_id)
        renamed = {old.name: new.name for old, new in zip(table.columns, columns)}
        return dataclasses.replace(
            table, schema=schema, name=name, columns=columns,
            primary_key=tuple(renamed.get(key, key) for key in table.primary_key),
            unique_keys=tuple((key, tuple(renamed.get(column, column) for column in key_columns))
                              for key, key_columns in table.unique_keys),
        )

    def map_change(self, change: DdlChange) -> DdlChange:
        """A DDL change in mapped names and types: the table, its columns, renames and keys."""
        schema, name = self.table_name(change.source_table, (change.schema, change.name))
        if change.table is None:
            return dataclasses.replace(change, schema=schema, name=name)
        table = self.map_table_def(change.table)
        renamed_from = change.renamed_from
        if renamed_from is not None and change.previous_source_table is not None:
            renamed_from = self.table_name(change.previous_source_table, renamed_from)
            if renamed_from == (schema, name):
                renamed_from = None
        renamed = {old.name: new.name for old, new in zip(change.table.columns, table.columns)}
        column_renames = [(self.column_name(change.source_table, old, old), renamed.get(new, new))
                          for old, new in change.column_renames]
        if change.previous_source_table is not None:
            # Rules of the table's old source name named its columns until now.
            column_renames += [(self.column_name(change.previous_source_table, old.source_name, old.name), new.name)
                               for old, new in zip(change.table.columns, table.columns)]
        return dataclasses.replace(
            change, table=table, schema=schema, name=name, renamed_from=renamed_from,
            column_renames=tuple((old, new) for old, new in column_renames if old != new),
            unique_added=tuple((key, tuple(renamed.get(column, column) for column in key_columns))
                               for key, key_columns in change.unique_added),
        )

    def transforms(self, source_table: str,
                   columns: Sequence[ColumnPlan]) -> tuple[list[ColumnPlan], dict[str, Transform]]:
        """The DML columns of a segment, and the transforms of those that have one, by destination name.

        A geometry column whose transform reads `%w` or `%s` is staged in its text form (`SRID=n;` and the hex
        WKB), whatever its destination type, so that both can be taken from it.
        """
        planned: list[ColumnPlan] = []
        found: dict[str, Transform] = {}
        for column in columns:
            transform = self.transform(source_table, column.source_name)
            if transform is not None:
                found[column.dest_name] = transform
                if transform.uses_geometry:
                    if column.spec.logical not in _GEOMETRY_LOGICAL:
                        raise ConversionError(f"the transform {transform.expression!r} of column "
                                              f"{column.source_name!r} uses %w or %s, but the column is not a geometry",
                                              connector=self.connector.name, table=source_table)
                    column = dataclasses.replace(column, convert=_as_text(column.convert))
            planned.append(column)
        return planned, found


def _as_text(convert: Converter) -> Converter:
    def to_text(value: Any, spec: Any, pg_type: str) -> Any:
        return convert(value, spec, "text")
    return to_text
