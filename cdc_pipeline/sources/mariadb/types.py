"""A MariaDB/MySQL source's type map: its columns to PostgreSQL's by type name (MariaDB's JSON as text), the aliases,
the rules the maps do not show, and how a column reads by them (`column_type`)."""

from __future__ import annotations

import re
from typing import Any

from cdc_pipeline.sources.type_choice import TypeChoice, column_number

GEOMETRY_TYPES = frozenset({"geometry", "point", "linestring", "polygon", "multipoint", "multilinestring",
                             "multipolygon", "geometrycollection"})


# The source types' columns to PostgreSQL's, by type name (convert/typemap.py reads them).
MYSQL_TYPE_MAP: dict[str, str] = {
    # BOOL is TINYINT(1): it holds -128..127, and a snapshot reads it as tinyint(1) (SHOW CREATE TABLE), so a
    # table created while streaming gets the type its snapshot would give it.
    "BOOL": "smallint",
    "BOOLEAN": "smallint",
    "TINYINT": "smallint",
    "TINYINT UNSIGNED": "smallint",
    "SMALLINT": "smallint",
    "SMALLINT UNSIGNED": "integer",
    "MEDIUMINT": "integer",
    "MEDIUMINT UNSIGNED": "integer",
    "INT": "integer",
    "INT UNSIGNED": "bigint",
    "INTEGER": "integer",
    "INTEGER UNSIGNED": "bigint",
    "BIGINT": "bigint",
    "BIGINT UNSIGNED": "numeric(20,0)",
    "DECIMAL": "numeric(p,s)",
    "NUMERIC": "numeric(p,s)",
    "FLOAT": "real",
    "DOUBLE": "double precision",
    "REAL": "double precision",
    "BIT": "bit(n)",
    "CHAR": "character(n)",
    "VARCHAR": "character varying(n)",
    "TINYTEXT": "text",
    "TEXT": "text",
    "MEDIUMTEXT": "text",
    "LONGTEXT": "text",
    "BINARY": "bytea",
    "VARBINARY": "bytea",
    "TINYBLOB": "bytea",
    "BLOB": "bytea",
    "MEDIUMBLOB": "bytea",
    "LONGBLOB": "bytea",
    "DATE": "date",
    "TIME": "interval",
    "DATETIME": "timestamp(fsp) without time zone",
    "TIMESTAMP": "timestamp(fsp) with time zone",
    "YEAR": "integer",
    "JSON": "jsonb",
    "ENUM": "text",
    "SET": "text",
    "GEOMETRY": "bytea",
    "POINT": "bytea",
    "LINESTRING": "bytea",
    "POLYGON": "bytea",
    "MULTIPOINT": "bytea",
    "MULTILINESTRING": "bytea",
    "MULTIPOLYGON": "bytea",
    "GEOMETRYCOLLECTION": "bytea",
}

# MariaDB's JSON is LONGTEXT with a json_valid CHECK; a snapshot reports it as LONGTEXT, so mapping the
# JSON name to text keeps one destination type whenever the table was captured, and keeps the text verbatim.
MARIADB_TYPE_MAP: dict[str, str] = {**MYSQL_TYPE_MAP, "JSON": "text"}

MYSQL_TYPE_ALIASES: dict[str, str] = {
    "INT1": "TINYINT",
    "INT2": "SMALLINT",
    "INT3": "MEDIUMINT",
    "MIDDLEINT": "MEDIUMINT",
    "INT4": "INT",
    "INT8": "BIGINT",
    "DEC": "DECIMAL",
    "FIXED": "DECIMAL",
    "FLOAT4": "FLOAT",
    "FLOAT8": "DOUBLE",
    "DOUBLE PRECISION": "DOUBLE",
    "CHARACTER": "CHAR",
    "NCHAR": "CHAR",
    "NATIONAL CHAR": "CHAR",
    "NATIONAL CHARACTER": "CHAR",
    "NVARCHAR": "VARCHAR",
    "CHARACTER VARYING": "VARCHAR",
    "CHAR VARYING": "VARCHAR",
    "NATIONAL VARCHAR": "VARCHAR",
    "LONG": "MEDIUMTEXT",
    "LONG VARCHAR": "MEDIUMTEXT",
    "LONG VARBINARY": "MEDIUMBLOB",
    "SERIAL": "BIGINT UNSIGNED",
}

# The rules the maps above do not show, as the docs print them beside each map.
TYPE_MAP_NOTES: dict[str, list[tuple[str, str]]] = {
    "mariadb": [
        ("BIT(1)", "boolean"),
        ("TINYINT(1)", "smallint (it holds -128..127, so not boolean)"),
        ("DECIMAL without precision", "numeric"),
        ("LONGTEXT with a json_valid CHECK (MariaDB JSON)", "text (verbatim; jsonb would reorder keys)"),
        ("TIME", "interval (MariaDB TIME spans -838:59:59..838:59:59)"),
        ("DATETIME / TIMESTAMP without fsp", "timestamp(0) ..."),
        ("anything else", "text (logged as a warning)"),
    ],
    "mysql": [
        ("BIT(1)", "boolean"),
        ("TINYINT(1)", "smallint (it holds -128..127, so not boolean)"),
        ("DECIMAL without precision", "numeric"),
        ("TIME", "interval (MySQL TIME spans -838:59:59..838:59:59)"),
        ("DATETIME / TIMESTAMP without fsp", "timestamp(0) ..."),
        ("anything else", "text (logged as a warning)"),
    ],
}


TYPE_MAPS: dict[str, dict[str, str]] = {"mariadb": MARIADB_TYPE_MAP, "mysql": MYSQL_TYPE_MAP}
# A NOT NULL column added without a DEFAULT gives the rows already there its type's implicit default (0, '', the
# first ENUM value...), which the destination column takes while it is added (`ColumnDef.implicit_default_sql`).
IMPLICIT_DEFAULTS = True
# The events carry every value whole.
LEAVES_VALUES_OUT = False


def column_type(source_type: str, column: dict[str, Any], connector_type: str) -> TypeChoice | None:
    """The destination type of a MariaDB/MySQL column of `source_type` (Debezium's typeName), by the connector type's
    map; None when the map does not know it. `column` is the Debezium column description, read for its length,
    scale and typeExpression: unsigned integers widen to the next type that holds their range."""
    type_map = TYPE_MAPS[connector_type]
    words = source_type.split("(", 1)[0].upper().split()
    expression_words = re.findall(r"[A-Z]+", str(column.get("typeExpression") or "").upper())
    unsigned = any(word in ("UNSIGNED", "ZEROFILL") for word in words + expression_words)
    base = " ".join(word for word in words if word not in ("UNSIGNED", "SIGNED", "ZEROFILL"))
    base = MYSQL_TYPE_ALIASES.get(base, base)
    if base.endswith(" UNSIGNED"):
        base, unsigned = base.removesuffix(" UNSIGNED"), True
    length = column_number(column.get("length"))
    if base == "BIT" and (length is None or length == 1):
        return TypeChoice("boolean")
    if base == "FLOAT" and length is not None and length > 24 and column.get("scale") is None:
        return TypeChoice("double precision")
    template = type_map.get(f"{base} UNSIGNED" if unsigned else base) or type_map.get(base)
    if template is None:
        return None
    if template == "character(n)" and length is None:
        return TypeChoice("character(1)")
    return TypeChoice(template, _fractional_digits(length))


def _fractional_digits(length: int | None) -> int:
    """Debezium gives DATETIME(3) a length of 3; a display width (19 + 1 + digits) is also understood."""
    if length is None or length < 0:
        return 0
    if length <= 6:
        return length
    if length >= 19:
        return min(max(length - 20, 0), 6)
    return 6


def always_nullable(source_type: str) -> bool:
    """Whether a column of `source_type` stays nullable whatever its definition: a TIMESTAMP, which may hold the zero
    date, replicated as NULL."""
    return source_type.split("(", 1)[0].strip().upper() == "TIMESTAMP"
