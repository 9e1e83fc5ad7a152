"""What a transform rule may be: one scalar expression of the value(s) it transforms, read by PostgreSQL's own
parser (pglast, which embeds it) and checked against an allow-list of node kinds, operators and functions.

A transform runs as the pipeline's own role, inside the batch's transaction: it must not read or change
anything but the value it transforms. So no sub-query, no column or table reference, no function outside the
allow-list (which holds pure functions of their arguments: no `pg_read_file`, `dblink`, `set_config`,
`current_setting`, `nextval`, ...), no schema-qualified name but `pg_catalog`'s, and no operator outside the usual
ones. Whatever passes is rendered into the merge by the pipeline's own quoting; the check runs wherever a rule is
read (added with the CLI, inserted into the rules table by hand, reloaded), so a rule that fails it never runs.
"""

from __future__ import annotations

from typing import Any, Iterator

from pglast import parse_sql
from pglast.parser import ParseError

# Node kinds an expression of values may hold (pglast's names of PostgreSQL's parse nodes).
ALLOWED_NODES = frozenset({
    "A_Const", "ParamRef", "FuncCall", "TypeCast", "TypeName", "A_Expr", "BoolExpr", "CaseExpr", "CaseWhen",
    "CoalesceExpr", "NullTest", "BooleanTest", "MinMaxExpr", "String", "Integer", "Float", "Boolean", "BitString",
    "A_ArrayExpr", "A_Indirection", "A_Indices", "CollateClause",
})
ALLOWED_OPERATORS = frozenset({
    "||", "+", "-", "*", "/", "%", "^", "=", "<>", "!=", "<", ">", "<=", ">=", "~", "~*", "!~", "!~*", "~~", "~~*",
    "!~~", "!~~*", "->", "->>", "#>", "#>>", "@>", "<@", "&", "|", "#", "~", "<<", ">>",
})
# Pure functions of their arguments (strings, numbers, dates, bytes, JSON, hashing): nothing that reads the
# database, the server's files or settings, or changes anything.
ALLOWED_FUNCTIONS = frozenset({
    # strings
    "upper", "lower", "initcap", "length", "char_length", "octet_length", "bit_length", "left", "right", "substr",
    "substring", "overlay", "position", "strpos", "replace", "translate", "trim", "btrim", "ltrim", "rtrim", "lpad",
    "rpad", "repeat", "reverse", "concat", "concat_ws", "split_part", "regexp_replace", "regexp_substr",
    "regexp_match", "regexp_like", "regexp_count", "starts_with", "format", "quote_literal", "quote_nullable",
    "quote_ident", "to_hex", "chr", "ascii", "unistr", "normalize", "casefold",
    # numbers
    "abs", "ceil", "ceiling", "floor", "round", "trunc", "sign", "mod", "power", "sqrt", "cbrt", "exp", "ln", "log",
    "log10", "div", "greatest", "least", "width_bucket", "scale", "trim_scale", "gcd", "lcm",
    # dates and times
    "date_trunc", "date_part", "extract", "date_bin", "make_date", "make_time", "make_timestamp", "make_timestamptz",
    "make_interval", "justify_days", "justify_hours", "justify_interval", "age", "to_char", "to_date",
    "to_timestamp", "to_number", "timezone", "isfinite",
    # bytes and hashing
    "encode", "decode", "md5", "sha224", "sha256", "sha384", "sha512", "convert_from", "convert_to", "get_byte",
    "set_byte", "crc32", "crc32c",
    # JSON and arrays
    "to_json", "to_jsonb", "json_build_object", "jsonb_build_object", "json_build_array", "jsonb_build_array",
    "jsonb_set", "jsonb_insert", "jsonb_strip_nulls", "jsonb_typeof", "json_typeof", "jsonb_pretty",
    "array_length", "array_to_string", "string_to_array", "array_position", "array_remove", "array_replace",
    "cardinality", "array_append", "array_prepend", "array_cat",
    # nulls and types
    "coalesce", "nullif", "num_nulls", "num_nonnulls", "pg_typeof",
    # PostGIS constructors and accessors (the %w and %s placeholders' use)
    "st_geomfromwkb", "st_geomfromewkb", "st_geogfromwkb", "st_setsrid", "st_transform", "st_astext", "st_asewkt",
    "st_asbinary", "st_asewkb", "st_srid", "st_x", "st_y", "geometry", "geography",
})


class TransformRejected(ValueError):
    """A transform that is not one allowed scalar expression; the message says what is not allowed."""


def check_expression(expression: str) -> None:
    """Raises TransformRejected unless `expression` (placeholders already replaced by `$n` parameters) is one
    scalar expression PostgreSQL parses, made only of the allowed node kinds, operators and functions."""
    try:
        statements = parse_sql(f"SELECT {expression}")
    except ParseError as exc:
        raise TransformRejected(f"PostgreSQL cannot parse it: {exc}") from None
    if len(statements) != 1:
        raise TransformRejected("a transform is one expression")
    select = statements[0].stmt(depth=None, skip_none=True)
    extra = sorted(key for key, value in select.items() if key not in ("@", "targetList", "limitOption", "op", "all")
                   and value not in (None, False, [], {}))
    targets = select.get("targetList") or []
    if select.get("@") != "SelectStmt" or extra or len(targets) != 1 or set(targets[0]) - {"@", "val", "location"}:
        raise TransformRejected("a transform is one expression, without a FROM, a WHERE or a name")
    for node in _nodes(targets[0]["val"]):
        kind = node.get("@")
        if kind not in ALLOWED_NODES:
            raise TransformRejected(f"{_describe(kind)} is not allowed in a transform")
        if kind == "FuncCall":
            _check_function(node)
        elif kind == "TypeName" and any(name.lower().startswith("reg") for name in _names(node.get("names", []))):
            raise TransformRejected("casts to catalog lookup types (regclass, regproc, ...) are not allowed")
        elif kind == "A_Expr":
            for operator in _names(node.get("name", [])):
                if operator.lower() not in ALLOWED_OPERATORS and operator.upper() not in ("LIKE", "ILIKE"):
                    raise TransformRejected(f"operator {operator!r} is not allowed in a transform")


def check_type_name(type_name: str) -> None:
    """Raises TransformRejected unless `type_name` is a type name alone (with modifiers and array bounds): what a
    datatype rule puts into CREATE and ALTER, so no DEFAULT, CHECK, COLLATE or anything after it."""
    try:
        statements = parse_sql(f"SELECT NULL::{type_name}")
    except ParseError as exc:
        raise TransformRejected(f"PostgreSQL does not read it as a type name: {exc}") from None
    select = statements[0].stmt(depth=None, skip_none=True) if len(statements) == 1 else {}
    targets = select.get("targetList") or [{}]
    cast = targets[0].get("val") or {}
    if len(targets) != 1 or cast.get("@") != "TypeCast" or (cast.get("arg") or {}).get("@") != "A_Const":
        raise TransformRejected("it is not a type name alone")
    for node in _nodes(cast["typeName"]):
        if node.get("@") not in ("TypeName", "String", "Integer", "A_Const"):
            raise TransformRejected(f"{_describe(node.get('@'))} is not part of a type name")


def _check_function(node: dict[str, Any]) -> None:
    names = _names(node.get("funcname", []))
    schema, name = (names[0], names[-1]) if len(names) > 1 else (None, names[-1])
    if schema not in (None, "pg_catalog") or len(names) > 2:
        raise TransformRejected(f"function {'.'.join(names)} is not allowed in a transform (only pg_catalog's)")
    if name.lower() not in ALLOWED_FUNCTIONS:
        raise TransformRejected(f"function {name} is not allowed in a transform (allowed: pure functions of the "
                                "value, such as upper, md5, left, regexp_replace, round, to_char, encode)")
    if node.get("agg_star") or node.get("agg_distinct") or node.get("over") or node.get("agg_filter") \
            or node.get("agg_order"):
        raise TransformRejected(f"{name} as an aggregate or window function is not allowed in a transform")


def _names(items: list[Any]) -> list[str]:
    return [item.get("sval", "") for item in items if isinstance(item, dict)]


def _nodes(value: Any) -> Iterator[dict[str, Any]]:
    """Every parse node in `value`, depth first (pglast's dicts: a node has its kind under "@")."""
    if isinstance(value, dict):
        if "@" in value:
            yield value
        for key, child in value.items():
            if key != "@":
                yield from _nodes(child)
    elif isinstance(value, (list, tuple)):
        for child in value:
            yield from _nodes(child)


def _describe(kind: str | None) -> str:
    return {"SubLink": "a sub-query", "ColumnRef": "a column or table reference",
            "SQLValueFunction": "a session value (current_user, current_date, ...)", "RowExpr": "a row",
            "ParamRef": "a parameter"}.get(kind or "", f"a {kind} node")
