"""Source column types to PostgreSQL column types, and the destination column definition built from them.

Each source type's map is a module-level table of its source package's `types` room (`sources.mariadb.types.
MYSQL_TYPE_MAP`, `sources.postgres.types.POSTGRES_TYPE_MAP`, ...), which the docs print with `type_map_rows`, and the
package reads a column of its own by it (`column_type`: unsigned integers, arrays, fractional-second digits). A template may carry one
placeholder that the column fills in here: `(n)` a length, `(p,s)` precision and scale, `(fsp)` fractional-second
digits. Every type produced is spelled the way PostgreSQL's `format_type()` spells it, so a later ALTER can compare
the destination's types with the ones wanted.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from psycopg import sql

# The destination spelling of names and the default mapping live in the config module, which checks the file's
# connectors by them (two connectors, one destination table); the convert stage takes them from here.
from cdc_pipeline.config import ConnectorConfig, default_table_name, dest_identifier  # noqa: F401
from cdc_pipeline import sources
from cdc_pipeline.errors import ConversionError
from cdc_pipeline.sources.protocol import Source
from cdc_pipeline.sources.type_choice import column_length, column_number

logger = logging.getLogger(__name__)

INTEGER_PG_TYPES = frozenset({"smallint", "integer", "bigint"})

_MAX_NUMERIC_PRECISION = 1000

_CURRENT_TIMESTAMP_DEFAULT = re.compile(
    r"(current_timestamp|now|localtimestamp|localtime)\s*(\(\s*\d*\s*\))?", re.IGNORECASE
)
_CURRENT_DATE_DEFAULT = re.compile(r"(current_date|curdate)\s*(\(\s*\))?", re.IGNORECASE)
_CAST_SUFFIX = re.compile(r"('(?:[^']|'')*')::[\w\s\".\[\]()]+")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_DATETIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})([ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?")
_TIME_OF_DAY = re.compile(r"\d{2}:\d{2}(:\d{2}(\.\d+)?)?")
_DURATION = re.compile(r"-?\d+:\d{2}(:\d{2}(\.\d+)?)?")
_BIT_STRING = re.compile(r"b'([01]*)'", re.IGNORECASE)
_UUID = re.compile(r"[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}")
_FUNCTION_CALL = re.compile(r"\(.*\)|[\w.]+\s*\(.*\)", re.DOTALL)
_FORMATTED_TYPE = re.compile(
    r"(?P<base>[a-z][a-z0-9_ ]*?)\s*(?:\((?P<mods>[\d\s,]*)\))?\s*(?P<zone>with(?:out)?\s+time\s+zone)?"
)


@dataclass(frozen=True)
class ColumnDef:
    """One destination column: its PostgreSQL type, nullability, default and identity, and where it came from.

    `default_sql` is a PostgreSQL expression rendered through `psycopg.sql.Literal` (or CURRENT_TIMESTAMP /
    CURRENT_DATE); source defaults PostgreSQL cannot express are dropped with a warning. `identity` is the
    source auto-increment flag. `implicit_default_sql` is the value MySQL/MariaDB give existing rows when a
    NOT NULL column without a DEFAULT is added (0, '', the first ENUM value...), or None when there is none.
    `source_length` and `source_scale` are the source column's; `type_map_type` is the type the type map gave
    when a datatype mapping rule (see `objmap`) replaced it in `pg_type`.
    """

    name: str
    source_name: str
    pg_type: str
    nullable: bool
    default_sql: str | None
    identity: bool
    source_type: str
    implicit_default_sql: str | None = None
    source_length: int | None = None
    source_scale: int | None = None
    type_map_type: str | None = None


def pg_type_for(source_type: str, column: dict[str, Any], connector_type: str) -> str:
    """Return the PostgreSQL type for a source column of `source_type` (Debezium's typeName).

    `column` is the Debezium column description, read for length, scale and typeExpression by the source type's
    module (`column_type`: MySQL and MariaDB unsigned integers widen to the next type that holds their range), and
    here to fill the template it chose; types the map does not know become text, with a warning.
    """
    choice = _type_map_source(connector_type).column_type(source_type, column, connector_type)
    if choice is None:
        logger.warning("Unknown source type %r of column %r: mapped to text", source_type, column.get("name"))
        return "text"
    return _fill_template(choice.template, column, choice.fractional_digits)


def knows_source_type(source_type: str, connector_type: str) -> bool:
    """Whether the connector type's map knows `source_type` (a PostgreSQL array of any type: text[] at worst)."""
    return _type_map_source(connector_type).column_type(source_type, {}, connector_type) is not None


def type_map_rows(connector_type: str) -> list[tuple[str, str]]:
    """Return (source type, PostgreSQL type) rows describing the map of one connector type, for the README."""
    source = _type_map_source(connector_type)
    rows = [
        (_display_source_type(name, template), template) for name, template in source.TYPE_MAPS[connector_type].items()
    ]
    return rows + source.TYPE_MAP_NOTES[connector_type]


def _type_map_source(connector_type: str) -> Source:
    """The source package holding the connector type's map (`TYPE_MAPS`)."""
    try:
        source = sources.module_for(connector_type)
    except KeyError:
        source = None
    if source is None or connector_type not in source.TYPE_MAPS:
        raise ConversionError(f"no type map for connector type {connector_type!r}")
    return source


def canonical_pg_type(type_name: str) -> str:
    """Return a PostgreSQL type name spelled as `format_type()` spells it, so two spellings compare equal.

    For example "VARCHAR(100)" and "character varying(100)" both give "character varying(100)",
    "timestamptz(3)" gives "timestamp(3) with time zone", "int4" gives "integer".
    """
    cleaned = " ".join(type_name.strip().lower().split())
    array_suffix = ""
    while cleaned.endswith("[]"):
        array_suffix += "[]"
        cleaned = cleaned[:-2].rstrip()
    match = _FORMATTED_TYPE.fullmatch(cleaned)
    if match is None:
        return cleaned + array_suffix
    base = match["base"].strip()
    mods = match["mods"]
    zone = match["zone"]
    modifiers = f"({','.join(part.strip() for part in mods.split(','))})" if mods else ""
    base, zone = _canonical_base(base, zone)
    if base in ("timestamp", "time"):
        return f"{base}{modifiers} {zone or 'without time zone'}{array_suffix}"
    if base == "bpchar" and modifiers:
        base = "character"
    return f"{base}{modifiers}{array_suffix}"


def column_def_from_source(column: dict[str, Any], *, connector_type: str, letter_casing: str) -> ColumnDef:
    """Build the destination column definition from one Debezium column description."""
    source_name = column.get("name")
    source_type = column.get("typeName")
    if not source_name or not source_type:
        raise ConversionError(f"column description without name or typeName: {column!r}")
    source = _type_map_source(connector_type)
    pg_type = pg_type_for(source_type, column, connector_type)
    return ColumnDef(
        name=dest_identifier(source_name, letter_casing),
        source_name=source_name,
        pg_type=pg_type,
        nullable=bool(column.get("optional", True)) or source.always_nullable(source_type),
        default_sql=_default_sql(_source_default(source, column.get("defaultValueExpression")), pg_type, source_name),
        identity=bool(column.get("autoIncremented", False)),
        source_type=source_type,
        implicit_default_sql=_implicit_default_sql(pg_type, source_type, column) if source.IMPLICIT_DEFAULTS else None,
        source_length=column_number(column.get("length")),
        source_scale=column_number(column.get("scale")),
    )


def _source_default(source: Source, expression: Any) -> Any:
    """A default expression in the spelling `_default_sql` reads: the source package's `default_expression` rewrites
    its own (SQL Server's `((0))`, Oracle's `SYSDATE`), where it has one."""
    rewrite = source.default_expression
    if expression is None or rewrite is None:
        return expression
    return rewrite(str(expression))


def _fill_template(template: str, column: dict[str, Any], fractional_digits: int | None) -> str:
    if "(n)" in template:
        length = column_length(column.get("length"))
        return template.replace("(n)", f"({length})" if length is not None else "")
    if "(p,s)" in template:
        return template.replace("(p,s)", _numeric_modifiers(column))
    if "(fsp)" in template:
        return template.replace("(fsp)", f"({fractional_digits})" if fractional_digits is not None else "")
    return template


def _numeric_modifiers(column: dict[str, Any]) -> str:
    precision = column_number(column.get("length"))
    scale = column_number(column.get("scale")) or 0
    if precision is None or not 1 <= precision <= _MAX_NUMERIC_PRECISION or not 0 <= scale <= precision:
        return ""
    return f"({precision},{scale})"


def _display_source_type(source: str, template: str) -> str:
    for placeholder in ("(n)", "(p,s)", "(fsp)"):
        if placeholder in template:
            return f"{source}{placeholder}"
    return source


def _canonical_base(base: str, zone: str | None) -> tuple[str, str | None]:
    aliases = {
        "int": "integer",
        "int4": "integer",
        "int2": "smallint",
        "int8": "bigint",
        "bool": "boolean",
        "float4": "real",
        "float8": "double precision",
        "float": "double precision",
        "decimal": "numeric",
        "varchar": "character varying",
        "char varying": "character varying",
        "char": "character",
        "varbit": "bit varying",
    }
    if base == "timestamptz":
        return "timestamp", "with time zone"
    if base == "timetz":
        return "time", "with time zone"
    return aliases.get(base, base), (" ".join(zone.split()) if zone else None)


def _render_literal(value: Any) -> str:
    return sql.Literal(value).as_string(None).strip()


def _default_sql(expression: Any, pg_type: str, column_name: str) -> str | None:
    """Translate a source default into a PostgreSQL expression, or None (with a warning when one is dropped)."""
    if expression is None:
        return None
    text = str(expression).strip()
    if text.upper() == "NULL":
        return None
    cast = _CAST_SUFFIX.fullmatch(text)
    if cast:
        text = cast.group(1)
    if _CURRENT_TIMESTAMP_DEFAULT.fullmatch(text):
        if pg_type.startswith("timestamp"):
            return "CURRENT_TIMESTAMP"
        return _dropped_default(expression, pg_type, column_name)
    if _CURRENT_DATE_DEFAULT.fullmatch(text):
        if pg_type.startswith(("date", "timestamp")) and "range" not in pg_type:
            return "CURRENT_DATE"
        return _dropped_default(expression, pg_type, column_name)
    quoted = len(text) >= 2 and text.startswith("'") and text.endswith("'")
    value = text[1:-1].replace("''", "'") if quoted else text
    if not quoted and _FUNCTION_CALL.fullmatch(value):
        return _dropped_default(expression, pg_type, column_name)
    rendered = _literal_for_type(value, pg_type)
    if rendered is None:
        return _dropped_default(expression, pg_type, column_name)
    return rendered


def _literal_for_type(value: str, pg_type: str) -> str | None:
    base = pg_type.split("(", 1)[0]
    if base in INTEGER_PG_TYPES or base in ("numeric", "real", "double precision"):
        if value.lower() in ("true", "false"):  # a BOOL column's DEFAULT TRUE, as a TINYINT(1) holds it
            value = "1" if value.lower() == "true" else "0"
        if not _NUMBER.fullmatch(value):
            return None
        number = Decimal(value)
        if base in INTEGER_PG_TYPES:
            return _render_literal(int(number)) if number == number.to_integral_value() else None
        return _render_literal(number)
    if base in ("text", "character varying", "character", "bpchar"):
        return _render_literal(value)
    if base == "boolean":
        truth = {"0": False, "1": True, "false": False, "true": True, "b'0'": False, "b'1'": True}
        flag = truth.get(value.lower())
        return None if flag is None else _render_literal(flag)
    if base == "bit":
        return _bit_string_default(value, pg_type)
    if base == "date":
        match = _DATE.fullmatch(value)
        return _render_literal(value) if match and not _is_zero_date(match) else None
    if base == "timestamp":
        match = _DATETIME.fullmatch(value)
        return _render_literal(value) if match and not _is_zero_date(match) else None
    if base == "time":
        return _render_literal(value) if _TIME_OF_DAY.fullmatch(value) else None
    if base == "interval":
        return _render_literal(value) if _DURATION.fullmatch(value) else None
    if base in ("json", "jsonb"):
        try:
            json.loads(value)
        except ValueError:
            return None
        return _render_literal(value)
    if base == "uuid":
        return _render_literal(value) if _UUID.fullmatch(value) else None
    return None


def _bit_string_default(value: str, pg_type: str) -> str | None:
    width_match = re.fullmatch(r"bit\((\d+)\)", pg_type)
    if width_match is None:
        return None
    width = int(width_match.group(1))
    bits_match = _BIT_STRING.fullmatch(value)
    if bits_match:
        bits = bits_match.group(1).lstrip("0")
    elif value.isdigit():
        bits = format(int(value), "b").lstrip("0")
    else:
        return None
    if len(bits) > width:
        return None
    return "B" + _render_literal(bits.rjust(width, "0"))


def _is_zero_date(match: re.Match[str]) -> bool:
    year, month, day = (int(match.group(index)) for index in (1, 2, 3))
    return year == 0 or month == 0 or day == 0


def _dropped_default(expression: Any, pg_type: str, column_name: str) -> None:
    logger.warning(
        "Default %r of column %r cannot be expressed for PostgreSQL type %s: no default set",
        expression,
        column_name,
        pg_type,
    )
    return None


def _implicit_default_sql(pg_type: str, source_type: str, column: dict[str, Any]) -> str | None:
    """The value MySQL/MariaDB give existing rows when a NOT NULL column without DEFAULT is added."""
    base = pg_type.split("(", 1)[0]
    if base in INTEGER_PG_TYPES or base in ("numeric", "real", "double precision"):
        return "0"
    if base == "boolean":
        return "false"
    if base == "bit":
        return _bit_string_default("0", pg_type)
    if base == "interval":
        return _render_literal("00:00:00")
    if base == "bytea":
        return "''::bytea"
    if base in ("text", "character varying", "character"):
        enum_values = column.get("enumValues") or []
        if source_type.upper().startswith("ENUM") and enum_values:
            first = str(enum_values[0])
            if len(first) >= 2 and first.startswith("'") and first.endswith("'"):
                first = first[1:-1].replace("''", "'")
            return _render_literal(first)
        return _render_literal("")
    return None
