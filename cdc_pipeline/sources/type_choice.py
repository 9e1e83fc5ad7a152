"""What every source type's type map returns for a column (`column_type` of the source module): the template of its
destination type, which the convert stage fills with the column's length, precision and scale
(`convert.typemap.pg_type_for`); and how a Debezium column description's numbers are read."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# The longest `character varying(n)` / `character(n)` PostgreSQL takes; a longer source length gives no modifier.
MAX_VARCHAR_LENGTH = 10_485_760


@dataclass(frozen=True)
class TypeChoice:
    """A source column's destination type: `template` is a PostgreSQL type, or one with a placeholder for the column
    to fill (`(n)` a length, `(p,s)` precision and scale, `(fsp)` fractional-second digits), `fractional_digits`
    what `(fsp)` becomes (None: no modifier, PostgreSQL's default)."""

    template: str
    fractional_digits: int | None = None


def column_number(value: Any) -> int | None:
    """A length or scale of a column description as an int, or None when there is none (or it is no number)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def column_length(value: Any) -> int | None:
    """A column's length as a character type's modifier takes it (1..MAX_VARCHAR_LENGTH), else None."""
    length = column_number(value)
    if length is None or not 1 <= length <= MAX_VARCHAR_LENGTH:
        return None
    return length


def balanced(text: str) -> bool:
    """Whether the parentheses of `text` are balanced (a default expression's outer pair may be taken off)."""
    depth = 0
    for character in text:
        depth += {"(": 1, ")": -1}.get(character, 0)
        if depth < 0:
            return False
    return depth == 0


def default_literal(expression: str, clock: re.Pattern[str]) -> str | None:
    """A SQL Server or Oracle column default in the form the type map's defaults read (`convert.typemap`): spaces and
    outer parentheses taken off, the N of a national literal too (`(N'abc')` -> `'abc'`), a call of one of the source's
    clock functions (`clock`) as CURRENT_TIMESTAMP; None for NULL."""
    text = expression.strip()
    while text.startswith("(") and text.endswith(")") and balanced(text[1:-1]):
        text = text[1:-1].strip()
    if text.upper() == "NULL":
        return None
    if len(text) >= 3 and text[0] in "Nn" and text[1] == "'" and text.endswith("'"):
        text = text[1:]
    return "CURRENT_TIMESTAMP" if clock.fullmatch(text) else text
