"""Every PostgreSQL type through the pipeline from a PostgreSQL source: edge values written in the source, snapshot
then streaming, and each value on the destination compared with the source value, both read back through psycopg.
Date, time and JSON types are read as their text on both sides (Python's types cannot hold 'infinity' or 24:00,
and json's text is what must survive); the rest as psycopg's Python values. Only representation is normalised.

Unchanged TOASTed values arrive as Debezium's placeholder and must never overwrite the stored value.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any, Callable

import psycopg
import pytest
from psycopg import sql
from psycopg.types.string import TextLoader

from tests.helpers.postgres_source import SOURCE_SCHEMA
from tests.helpers.value_compare import assert_rows_equal

pytestmark = pytest.mark.integration

EMOJI = "😀"
LONG_4_BYTE = "𝄞😀ü✓"
ALL_BYTES = "".join(f"{i:02x}" for i in range(256))
# Spacing and key order that jsonb would not keep, a 4-byte character, an escaped quote and a backslash.
JSON_TEXT = '{"b": 1,  "a": [1, 2.50, 1e308], "s": "' + LONG_4_BYTE + r'\"q\\"}'
TEXT_READ_TYPES = ("date", "time", "timetz", "timestamp", "timestamptz", "interval", "json", "jsonb")

# (column, PostgreSQL type, how its values compare)
COLUMNS: list[tuple[str, str, str]] = [
    ("id", "integer PRIMARY KEY", "exact"),
    ("sm", "smallint", "exact"), ("i", "integer", "exact"), ("bi", "bigint", "exact"),
    ("n", "numeric", "numeric_value"), ("n30", "numeric(40,30)", "decimal"), ("n0", "numeric(10)", "decimal"),
    ("r", "real", "float"), ("d", "double precision", "float"), ("b", "boolean", "exact"),
    ("t", "text", "exact"), ("vc", "varchar(20)", "exact"), ("ch", "char(5)", "exact"), ("by", "bytea", "exact"),
    ("dt", "date", "exact"), ("tm", "time", "exact"), ("tm3", "time(3)", "exact"), ("ttz", "timetz", "timetz"),
    ("ts", "timestamp", "exact"), ("ts3", "timestamp(3)", "exact"), ("tstz", "timestamptz", "exact"),
    ("tstz0", "timestamptz(0)", "exact"), ("iv", "interval", "exact"), ("u", "uuid", "exact"),
    ("j", "json", "exact"), ("jb", "jsonb", "exact"), ("ai", "integer[]", "exact"), ("at", "text[]", "exact"),
    ("tsa", "timestamp(3)[]", "exact"), ("md", "mood", "exact"), ("ip", "inet", "exact"), ("ci", "cidr", "exact"),
    ("mo", "money", "money"), ("mac", "macaddr", "exact"), ("bits", "bit(5)", "exact"), ("pt", "point", "exact"),
]
NAMES = [name for name, _, _ in COLUMNS]
KINDS = {name: kind for name, _, kind in COLUMNS}

MINIMUM = {
    "sm": "-32768", "i": "-2147483648", "bi": "-9223372036854775808",
    "n": "-123456789012345678901234567890.123456789012345678901234567890", "n30": "-9999999999.999999999999999999999999999999",
    "n0": "-9999999999", "r": "'-3.4028235e38'", "d": "'-1.7976931348623157e308'", "b": "false",
    "t": "''", "vc": "''", "ch": "''", "by": "'\\x'", "dt": "'0001-01-01'", "tm": "'00:00:00'", "tm3": "'00:00:00'",
    "ttz": "'00:00:00-15:59'", "ts": "'-infinity'", "ts3": "'1583-01-01 00:00:00'", "tstz": "'-infinity'",
    "tstz0": "'1900-01-01 00:00:00+00'", "iv": "'-178000000 years -3 days -00:00:00.000001'",
    "u": "'00000000-0000-0000-0000-000000000000'", "j": "'null'", "jb": "'null'", "ai": "'{}'", "at": "'{}'",
    "tsa": "'{}'", "md": "'sad'", "ip": "'0.0.0.0/0'", "ci": "'::/0'", "mo": "'-92233720368.55'",
    "mac": "'00:00:00:00:00:00'", "bits": "B'00000'", "pt": "'(-1.7976931348623157e308, -0.5)'",
}
MAXIMUM = {
    "sm": "32767", "i": "2147483647", "bi": "9223372036854775807",
    "n": "123456789012345678901234567890.123456789012345678901234567890", "n30": "9999999999.999999999999999999999999999999",
    "n0": "9999999999", "r": "'3.4028235e38'", "d": "'1.7976931348623157e308'", "b": "true",
    "t": f"repeat('{LONG_4_BYTE} \\ \t \n \"''', 20000)", "vc": f"'{EMOJI * 20}'", "ch": f"'{EMOJI * 5}'",
    "by": f"decode(repeat('{ALL_BYTES}', 300), 'hex')", "dt": "'9999-12-31'", "tm": "'23:59:59.999999'",
    "tm3": "'24:00:00'", "ttz": "'23:59:59.999999+15:59'", "ts": "'infinity'", "ts3": "'9999-12-31 23:59:59.999'",
    "tstz": "'infinity'", "tstz0": "'9999-12-31 23:59:59+00'", "iv": "'178000000 years 11 mons 29 days 23:59:59.999999'",
    "u": "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
    "j": f"'{JSON_TEXT}'", "jb": f"'{JSON_TEXT}'",
    "ai": "'{-2147483648,NULL,2147483647}'", "at": f"ARRAY['a b', 'c\"d', NULL, 'NULL', '', '\\', '{LONG_4_BYTE}', ',{{}}']",
    "tsa": "'{\"2024-01-02 03:04:05.678\",NULL,\"1970-01-01 00:00:00\"}'", "md": "'happy ✓'",
    "ip": "'2001:db8::ffff/128'", "ci": "'255.255.255.255/32'", "mo": "'92233720368.55'",
    "mac": "'ff:ff:ff:ff:ff:ff'", "bits": "B'11111'", "pt": "'(1.7976931348623157e308, 5e-324)'",
}
ORDINARY = {
    "sm": "0", "i": "1", "bi": "-1", "n": "0.000000000000000000000000000001", "n30": "0.000000000000000000000000000001",
    "n0": "0", "r": "'NaN'", "d": "'5e-324'", "b": "true", "t": "'tab\tnewline\ncr\rbackslash\\ quote'' NULL \\N'",
    "vc": "' padded  '", "ch": "'ab'", "by": "'\\x00ff005c4e'", "dt": "'2024-02-29'", "tm": "'12:34:56.789012'",
    "tm3": "'12:34:56.789'", "ttz": "'12:34:56.789+05:30'", "ts": "'2024-02-29 12:34:56.789012'",
    "ts3": "'2024-02-29 12:34:56.789'", "tstz": "'2024-02-29 12:34:56.789012+05:30'",
    "tstz0": "'2024-02-29 12:34:56-08'", "iv": "'1 year 2 mons 3 days 04:05:06.789'",
    "u": "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "j": "'[]'", "jb": "'{\"k\": {\"nested\": [true, false]}}'",
    "ai": "'{0}'", "at": "'{\"\"}'", "tsa": "'{\"2000-02-29 00:00:00.001\"}'", "md": "'ok'",
    "ip": "'192.168.0.1/24'", "ci": "'10.0.0.0/8'", "mo": "'0.01'", "mac": "'08:00:2b:01:02:03'",
    "bits": "B'10101'", "pt": "'(0.1, 0.2)'",
}
INFINITE_FLOATS = {"r": "'Infinity'", "d": "'-Infinity'", "n": "1"}
NULLS: dict[str, str] = {}

SNAPSHOT_ROWS = {1: MINIMUM, 2: MAXIMUM, 3: ORDINARY, 4: NULLS, 5: INFINITE_FLOATS}
STREAMED_ROWS = {101: MINIMUM, 102: MAXIMUM, 103: ORDINARY, 104: NULLS, 105: INFINITE_FLOATS}
STREAMED_CHANGES = [
    "UPDATE all_types SET t = t || '✓', n = -n, ai = ai || 7, iv = -iv, tstz = '2001-01-01 00:00:00+14', "
    "by = by || '\\x00'::bytea WHERE id IN (2, 102)",
    "UPDATE all_types SET bi = NULL, at = '{x}', md = 'sad' WHERE id IN (1, 3, 101)",
    "DELETE FROM all_types WHERE id IN (4, 103)",
    # Debezium's snapshot moves timestamps before 1582-10-15 by the Julian calendar (see the README); streamed
    # changes carry them exactly.
    "UPDATE all_types SET ts3 = '1000-01-01 00:00:00', tstz0 = '0001-01-01 00:00:00+00', ts = '1582-10-14 12:00:00' "
    "WHERE id = 101",
    "UPDATE all_types SET dt = '4714-11-24 BC', ts = '0001-12-31 23:59:59.999999 BC', ts3 = '0044-03-15 12:00:00 BC' "
    "WHERE id = 105",
]
TYPES = ["CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy ✓')"]


def _create_table() -> str:
    return "CREATE TABLE all_types (" + ", ".join(f"{name} {ddl}" for name, ddl, _ in COLUMNS) + ")"


def _insert(rows: dict[int, dict[str, str]]) -> str:
    values = []
    for row_id, row in rows.items():
        values.append("(" + ", ".join([str(row_id)] + [row.get(name, "DEFAULT") for name in NAMES[1:]]) + ")")
    return f"INSERT INTO all_types ({', '.join(NAMES)}) VALUES " + ", ".join(values)


def read_rows(dsn: str, table: str) -> list[dict[str, Any]]:
    """The table's rows through psycopg, date, time and JSON types as their text (the session in UTC)."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        for type_name in TEXT_READ_TYPES:
            conn.adapters.register_loader(type_name, TextLoader)
        cur = conn.execute(sql.SQL("SELECT * FROM {} ORDER BY 1").format(sql.Identifier(SOURCE_SCHEMA, table)))
        names = [column.name for column in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]


def _timetz_instant(text: str | None) -> tuple[int, int] | None:
    """A timetz as microseconds since midnight UTC (modulo a day): Debezium sends it moved to UTC."""
    if text is None:
        return None
    clock, sign, offset = text.partition("+") if "+" in text else text.rpartition("-")
    hours, minutes, seconds = clock.split(":")
    offset_parts = [int(part) for part in offset.split(":")] + [0, 0]
    offset_seconds = (offset_parts[0] * 3600 + offset_parts[1] * 60 + offset_parts[2]) * (1 if sign == "+" else -1)
    micros = round((int(hours) * 3600 + int(minutes) * 60 + float(seconds) - offset_seconds) * 1_000_000)
    return micros % 86_400_000_000, round(float(seconds) * 1_000_000) % 1_000_000


def _money(text: str | None) -> Decimal | None:
    return None if text is None else Decimal(text.replace("$", "").replace(",", ""))


NORMALISE: dict[str, Callable[[Any, Any], tuple[Any, Any]]] = {
    "exact": lambda s, d: (s, d),
    # Equal and written with the same digits (scale included).
    "decimal": lambda s, d: (None if s is None else str(s), None if d is None else str(d)),
    # Debezium drops the trailing zeros of a numeric without declared scale (1.50 arrives as 1.5): equal values.
    "numeric_value": lambda s, d: (s, d),
    # repr: exact, and NaN equals NaN.
    "float": lambda s, d: (repr(s), repr(d)),
    "timetz": lambda s, d: (_timetz_instant(s), _timetz_instant(d)),
    "money": lambda s, d: (_money(s), d),
}


def assert_same_values(pipeline, table: str, kinds: dict[str, str]) -> int:
    """Compares every value of every row (in the order of the first column); returns how many were compared."""
    source, dest = read_rows(pipeline.source_dsn, table), read_rows(pipeline.dest_dsn, table)
    key = next(iter(source[0])) if source else ""
    return assert_rows_equal(source, dest, key, lambda name: NORMALISE[kinds.get(name, "exact")])


DEST_TYPES = {
    "n": "numeric", "n30": "numeric(40,30)", "n0": "numeric(10,0)", "r": "real", "d": "double precision",
    "ch": "character(5)", "vc": "character varying(20)", "ttz": "time(6) with time zone", "tm3": "time(3) without time zone",
    "ts3": "timestamp(3) without time zone", "tstz0": "timestamp(0) with time zone", "iv": "interval",
    "j": "json", "jb": "jsonb", "ai": "integer[]", "at": "text[]", "tsa": "timestamp(3) without time zone[]",
    "md": "text", "ip": "inet", "ci": "cidr", "mo": "numeric(19,2)", "mac": "macaddr", "bits": "bit(5)",
    "pt": "point", "u": "uuid",
}


def test_every_postgres_type_survives_snapshot_and_streaming(pg_pipeline):
    pg_pipeline.write_config(tables=[f"{SOURCE_SCHEMA}.all_types"])
    pg_pipeline.source([*TYPES, _create_table(), _insert(SNAPSHOT_ROWS)])

    summary = pg_pipeline.sync()

    assert summary["snapshot_rows"] == len(SNAPSHOT_ROWS)
    columns = pg_pipeline.dest_columns("all_types")
    assert {name: columns[name] for name in DEST_TYPES} == DEST_TYPES
    compared = assert_same_values(pg_pipeline, "all_types", KINDS)
    assert compared == len(SNAPSHOT_ROWS) * len(COLUMNS)

    pg_pipeline.source([_insert(STREAMED_ROWS), *STREAMED_CHANGES])

    summary = pg_pipeline.sync()

    assert (summary["inserts"], summary["updates"], summary["deletes"]) == (len(STREAMED_ROWS), 7, 2)
    assert_same_values(pg_pipeline, "all_types", KINDS)


# Random md5 digests do not compress: these values are stored out of line (TOASTed), so an UPDATE that leaves
# them alone sends Debezium's placeholder instead of them.
LARGE_TEXT = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 200))"
LARGE_BYTES = "(SELECT string_agg(decode(md5(random()::text), 'hex'), '') FROM generate_series(1, 400))"
LARGE_TEXT_ARRAY = "(SELECT array_agg(md5(random()::text)) FROM generate_series(1, 200))"
LARGE_INT_ARRAY = "(SELECT array_agg((random() * 2000000000)::int) FROM generate_series(1, 2000))"
LARGE_JSONB = "(SELECT jsonb_agg(md5(random()::text)) FROM generate_series(1, 200))"
LARGE_COLUMNS = ("big", "blob", "tags", "numbers", "doc")
TOAST_TABLE = ("CREATE TABLE toasted (id integer PRIMARY KEY, counter integer, big text, blob bytea, tags text[], "
               "numbers integer[], doc jsonb)")
# A `%` in its name: the keyless one-event-at-a-time statements carry parameters.
KEYLESS = "toasted%keyless"
KEYLESS_TABLE = f'CREATE TABLE "{KEYLESS}" (n integer, counter integer, big text)'


def _large_values() -> str:
    return f"{LARGE_TEXT}, {LARGE_BYTES}, {LARGE_TEXT_ARRAY}, {LARGE_INT_ARRAY}, {LARGE_JSONB}"


def _stored_sizes(dsn: str, table: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql.SQL("SELECT pg_column_size(big), octet_length(big) FROM {}").format(
            sql.Identifier(SOURCE_SCHEMA, table))).fetchall()


def test_unchanged_toasted_values_keep_their_stored_value(pg_pipeline):
    pg_pipeline.write_config(tables=[f"{SOURCE_SCHEMA}.toasted", f"{SOURCE_SCHEMA}.{KEYLESS}"])
    pg_pipeline.source([
        TOAST_TABLE, "ALTER TABLE toasted REPLICA IDENTITY DEFAULT",
        KEYLESS_TABLE, f'ALTER TABLE "{KEYLESS}" REPLICA IDENTITY FULL',
        f"INSERT INTO toasted SELECT g, 0, {_large_values()} FROM generate_series(1, 3) AS g",
        f'INSERT INTO "{KEYLESS}" SELECT g, 0, {LARGE_TEXT} FROM generate_series(1, 2) AS g',
    ])
    assert all(stored > 2000 for stored, _ in _stored_sizes(pg_pipeline.source_dsn, "toasted"))

    pg_pipeline.sync()

    for table in ("toasted", KEYLESS):
        assert_same_values(pg_pipeline, table, {})

    pg_pipeline.source([
        # Only `counter` changes: every large column of rows 1 and 2 arrives as the placeholder.
        "UPDATE toasted SET counter = counter + 1 WHERE id IN (1, 2)",
        "UPDATE toasted SET counter = counter + 1 WHERE id = 1",
        f'UPDATE "{KEYLESS}" SET counter = 5 WHERE n = 1',
        # New large values, then changes that leave them alone, in one batch: the new values must win.
        f"UPDATE toasted SET ({', '.join(LARGE_COLUMNS)}) = ({_large_values()}) WHERE id = 2",
        "UPDATE toasted SET counter = counter + 10 WHERE id = 2",
        f"UPDATE toasted SET big = {LARGE_TEXT} WHERE id = 3",
        "UPDATE toasted SET counter = 7 WHERE id = 3",
        f"INSERT INTO toasted SELECT 4, 0, {_large_values()}",
        "UPDATE toasted SET counter = 1 WHERE id = 4",
        f'UPDATE "{KEYLESS}" SET big = {LARGE_TEXT} WHERE n = 2',
        f'UPDATE "{KEYLESS}" SET counter = 9 WHERE n = 2',
    ])

    summary = pg_pipeline.sync()

    assert (summary["inserts"], summary["updates"]) == (1, 11)
    for table in ("toasted", KEYLESS):
        assert_same_values(pg_pipeline, table, {})
    sizes = _stored_sizes(pg_pipeline.dest_dsn, "toasted")
    assert len(sizes) == 4 and all(length == 6400 for _, length in sizes)


def test_a_key_update_keeps_the_unchanged_toasted_values(pg_pipeline):
    # Debezium sends a key update as a delete of the old key and a create of the new one, whose unchanged TOASTed
    # values are the placeholder (DEFAULT identity: the delete holds the old key only).
    pg_pipeline.write_config(tables=[f"{SOURCE_SCHEMA}.toasted"])
    pg_pipeline.source([TOAST_TABLE, "ALTER TABLE toasted REPLICA IDENTITY DEFAULT",
                        f"INSERT INTO toasted SELECT g, 0, {_large_values()} FROM generate_series(1, 4) AS g"])
    pg_pipeline.sync()
    pg_pipeline.source([
        "UPDATE toasted SET id = id + 1000 WHERE id IN (1, 2)",
        "UPDATE toasted SET counter = 5 WHERE id = 3",
        # In one batch: a moved key moves again, and a key takes the place another one left.
        "UPDATE toasted SET id = 2001, counter = 1 WHERE id = 1001",
        "UPDATE toasted SET id = 1 WHERE id = 4",
    ])

    pg_pipeline.sync()

    assert_same_values(pg_pipeline, "toasted", {})
    sizes = _stored_sizes(pg_pipeline.dest_dsn, "toasted")
    assert len(sizes) == 4 and all(length == 6400 for _, length in sizes)
