"""Every MariaDB type through the pipeline: edge values written in the source, snapshot then streaming, and each
value on the destination compared with the source value, both read back through their own drivers (PyMySQL for
MariaDB, psycopg for PostgreSQL). Only representation is normalised (bytes of a BIT as digits, a TIMESTAMP read
in UTC on both sides, CHAR padding, geometry as SRID and WKB); precision never is.
"""

from __future__ import annotations

import struct
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Callable

import psycopg
import pytest
from psycopg import sql

from tests.helpers.value_compare import assert_rows_equal

pytestmark = pytest.mark.integration

# Zero dates need a sql_mode without NO_ZERO_DATE / NO_ZERO_IN_DATE; TIMESTAMP literals are written at +05:30.
SESSION = ["SET SESSION sql_mode = 'ALLOW_INVALID_DATES'", "SET SESSION time_zone = '+05:30'"]

EMOJI = "😀"
LONG_4_BYTE = "𝄞😀ü✓"  # 4, 4, 2 and 3 bytes in UTF-8
# MariaDB's SHOW CREATE TABLE, where Debezium's snapshot reads ENUM and SET labels from, writes 4-byte characters
# as '?' (see the README's type map): labels here stay within 3-byte characters.
LABEL = "ü✓€"
ALL_BYTES = "".join(f"{i:02x}" for i in range(256))

# (column, MariaDB type, how its values compare)
COLUMNS: list[tuple[str, str, str]] = [
    ("id", "INT NOT NULL AUTO_INCREMENT PRIMARY KEY", "int"),
    ("ti", "TINYINT", "int"), ("tiu", "TINYINT UNSIGNED", "int"),
    ("si", "SMALLINT", "int"), ("siu", "SMALLINT UNSIGNED", "int"),
    ("mi", "MEDIUMINT", "int"), ("miu", "MEDIUMINT UNSIGNED", "int"),
    ("i", "INT", "int"), ("iu", "INT UNSIGNED", "int"),
    ("bi", "BIGINT", "int"), ("biu", "BIGINT UNSIGNED", "int"),
    ("t1", "TINYINT(1)", "int"), ("bo", "BOOL", "int"),
    ("d10", "DECIMAL(10,2)", "decimal"), ("d65", "DECIMAL(65,30)", "decimal"), ("d65u", "DECIMAL(65,0) UNSIGNED", "decimal"),
    ("f", "FLOAT", "float32"), ("db", "DOUBLE", "exact"),
    ("bit1", "BIT(1)", "bit1"), ("bit10", "BIT(10)", "bits10"), ("bit64", "BIT(64)", "bits64"),
    ("c", "CHAR(10)", "char"), ("vc", "VARCHAR(300)", "exact"),
    ("tt", "TINYTEXT", "exact"), ("tx", "TEXT", "exact"), ("mt", "MEDIUMTEXT", "exact"), ("lt", "LONGTEXT", "exact"),
    ("bn", "BINARY(8)", "exact"), ("vb", "VARBINARY(300)", "exact"),
    ("tb", "TINYBLOB", "exact"), ("bl", "BLOB", "exact"), ("mb", "MEDIUMBLOB", "exact"), ("lb", "LONGBLOB", "exact"),
    ("dt", "DATE", "date"), ("dtn", "DATE NOT NULL DEFAULT '2000-01-01'", "date"),
    ("tm", "TIME", "exact"), ("tm6", "TIME(6)", "exact"),
    *[(f"dtm{fsp}", f"DATETIME({fsp})", "datetime") for fsp in range(7)],
    *[(f"ts{fsp}", f"TIMESTAMP({fsp}) NULL DEFAULT NULL", "timestamp") for fsp in range(7)],
    ("tsn", "TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP", "timestamp"),
    ("yr", "YEAR", "int"),
    ("js", "JSON", "exact"),
    ("en", f"ENUM('a', 'b c', '{LABEL}')", "exact"), ("st", f"SET('x', 'y', '{LABEL}')", "exact"),
    ("g", "GEOMETRY", "geometry"), ("pt", "POINT", "geometry"), ("ls", "LINESTRING", "geometry"),
    ("pg", "POLYGON", "geometry"), ("mpt", "MULTIPOINT", "geometry"), ("gc", "GEOMETRYCOLLECTION", "geometry"),
]
NAMES = [name for name, _, _ in COLUMNS]
KINDS = {name: kind for name, _, kind in COLUMNS}


def _datetimes(value: str) -> dict[str, str]:
    return {f"dtm{fsp}": value for fsp in range(7)}


def _timestamps(value: str) -> dict[str, str]:
    return {**{f"ts{fsp}": value for fsp in range(7)}, "tsn": value}


MINIMUM = {
    "ti": "-128", "tiu": "0", "si": "-32768", "siu": "0", "mi": "-8388608", "miu": "0", "i": "-2147483648",
    "iu": "0", "bi": "-9223372036854775808", "biu": "0", "t1": "-128", "bo": "0",
    "d10": "-99999999.99", "d65": "-" + "9" * 35 + "." + "9" * 30, "d65u": "0",
    "f": "-3.40282e38", "db": "-1.7976931348623157e308",
    "bit1": "b'0'", "bit10": "b'0'", "bit64": "b'0'",
    "c": "''", "vc": "''", "tt": "''", "tx": "''", "mt": "''", "lt": "''",
    "bn": "x'0000000000000000'", "vb": "x''", "tb": "x''", "bl": "x''", "mb": "x''", "lb": "x''",
    "dt": "'1000-01-01'", "dtn": "'1000-01-01'", "tm": "'-838:59:59'", "tm6": "'-838:59:58.999999'",
    **_datetimes("'1000-01-01 00:00:00'"), **_timestamps("'1970-01-01 05:30:01'"),
    "yr": "1901", "js": "'null'", "en": "'a'", "st": "''",
    "g": "ST_GeomFromText('POINT(-180 -90)', 4326)", "pt": "POINT(-1.7976931348623157e308, 0)",
    "ls": "ST_GeomFromText('LINESTRING(0 0, 1 1)')", "pg": "ST_GeomFromText('POLYGON((0 0, 1 0, 1 1, 0 0))', 3857)",
    "mpt": "ST_GeomFromText('MULTIPOINT(0 0, 1 1)')", "gc": "ST_GeomFromText('GEOMETRYCOLLECTION EMPTY')",
}
MAXIMUM = {
    "ti": "127", "tiu": "255", "si": "32767", "siu": "65535", "mi": "8388607", "miu": "16777215",
    "i": "2147483647", "iu": "4294967295", "bi": "9223372036854775807", "biu": "18446744073709551615",
    "t1": "127", "bo": "1", "d10": "99999999.99", "d65": "9" * 35 + "." + "9" * 30, "d65u": "9" * 65,
    "f": "3.40282e38", "db": "1.7976931348623157e308",
    "bit1": "b'1'", "bit10": "b'1111111111'", "bit64": "b'" + "1" * 64 + "'",
    "c": f"'{EMOJI * 10}'", "vc": f"'{EMOJI * 300}'", "tt": f"'{EMOJI * 63}'",
    "tx": f"REPEAT('{LONG_4_BYTE}', 5000)", "mt": f"REPEAT('{LONG_4_BYTE}', 20000)",
    "lt": f"REPEAT('{LONG_4_BYTE} \\\\ \\t \\n \"''', 30000)",
    "bn": "x'ff000000000000ff'", "vb": f"x'{ALL_BYTES}'", "tb": f"x'{ALL_BYTES[:510]}'",
    "bl": f"REPEAT(x'{ALL_BYTES}', 200)", "mb": f"REPEAT(x'{ALL_BYTES}', 1000)", "lb": f"REPEAT(x'{ALL_BYTES}', 2000)",
    "dt": "'9999-12-31'", "dtn": "'9999-12-31'", "tm": "'838:59:59'", "tm6": "'838:59:58.999999'",
    **_datetimes("'9999-12-31 23:59:59.999999'"), **_timestamps("'2038-01-19 08:44:07.999999'"),
    "yr": "2155", "js": f"'{{\"emoji\": \"{LONG_4_BYTE}\", \"big\": 1e308, \"n\": [null, true, {{\"k\": \"v\\\\\"q\"}}]}}'",
    "en": f"'{LABEL}'", "st": f"'x,y,{LABEL}'",
    "g": "ST_GeomFromText('POLYGON((0 0, 10 0, 10 10, 0 10, 0 0), (1 1, 2 1, 2 2, 1 1))', 4326)",
    "pt": "ST_GeomFromText('POINT(1.7976931348623157e308 -0.000001)', 4326)",
    "ls": "ST_GeomFromText('LINESTRING(0 0, 1 1, 2 2, 3 5)', 4326)",
    "pg": "ST_GeomFromText('POLYGON((0 0, 1 0, 1 1, 0 0))')",
    "mpt": "ST_GeomFromText('MULTIPOINT(0 0, 1 1, -1 -1)', 2154)",
    "gc": "ST_GeomFromText('GEOMETRYCOLLECTION(POINT(1 1), LINESTRING(0 0, 1 1))', 4326)",
}
ORDINARY = {
    "ti": "0", "tiu": "1", "si": "-1", "siu": "1", "mi": "0", "miu": "1", "i": "0", "iu": "1", "bi": "-1",
    "biu": "9223372036854775808", "t1": "1", "bo": "0", "d10": "0.01", "d65": "-0." + "0" * 29 + "1", "d65u": "1",
    "f": "1.17549e-38", "db": "4.9e-324", "bit1": "b'1'", "bit10": "b'1000000001'", "bit64": "b'1'",
    "c": "'ab  '", "vc": "'tab\\tnewline\\nbackslash\\\\ quote'' NULL \\\\N'", "tt": "'\\\\N'", "tx": "'ü'",
    "mt": "' leading and trailing spaces '", "lt": f"'{LONG_4_BYTE}'",
    "bn": "x'00'", "vb": "x'000000'", "tb": "x'5c4e'", "bl": "x'0a0d09'", "mb": "x'00ff00'", "lb": "x'5c'",
    "dt": "'0069-12-31'", "dtn": "'1970-01-01'", "tm": "'-00:00:01'", "tm6": "'100:00:00.000001'",
    **_datetimes("'0050-02-28 23:59:59.123456'"), **_timestamps("'2024-02-29 05:29:59.654321'"),
    "yr": "2024", "js": "'{\"a\": 1.50, \"b\": \"\\\\u00fc\"}'", "en": "'b c'", "st": f"'{LABEL},x'",
    "g": "ST_GeomFromText('MULTIPOLYGON(((0 0, 1 0, 1 1, 0 0)), ((5 5, 6 5, 6 6, 5 5)))', 4326)",
    "pt": "POINT(0.1, 0.2)", "ls": "ST_GeomFromText('LINESTRING(0 0, 0.5 0.5)', 4326)",
    "pg": "ST_GeomFromText('POLYGON((0 0, 2 0, 2 2, 0 0))', 4326)",
    "mpt": "ST_GeomFromText('MULTIPOINT(2 2)')", "gc": "ST_GeomFromText('GEOMETRYCOLLECTION(POINT(2 3))')",
}
NULLS: dict[str, str] = {}  # every nullable column NULL, the NOT NULL ones their defaults
ZERO_DATES = {
    "dt": "'0000-00-00'", **_datetimes("'0000-00-00 00:00:00'"),
    **_timestamps("'0000-00-00 00:00:00'"), "ti": "5",
}
PARTLY_ZERO_DATES = {"dt": "'2024-00-10'", **_datetimes("'2024-01-00 10:00:00'"), "ti": "6"}

SNAPSHOT_ROWS = {1: MINIMUM, 2: MAXIMUM, 3: ORDINARY, 4: NULLS, 5: ZERO_DATES}
STREAMED_ROWS = {101: MINIMUM, 102: MAXIMUM, 103: ORDINARY, 104: NULLS, 105: ZERO_DATES, 106: PARTLY_ZERO_DATES}
STREAMED_CHANGES = [
    "INSERT INTO all_types (vc) VALUES ('auto-increment id')",
    "UPDATE all_types SET vc = CONCAT(vc, '✓'), d65 = -d65, biu = biu - 1, ts6 = '2001-01-01 00:00:00.000001', "
    "lb = REPEAT(x'00ff', 20000), g = ST_GeomFromText('POINT(7 8)', 4326), bit64 = b'101' WHERE id IN (2, 102)",
    "UPDATE all_types SET bi = NULL, tm6 = '-00:00:00.000001', js = '[]', f = -f WHERE id IN (1, 3, 101)",
    "UPDATE all_types SET ts3 = '0000-00-00 00:00:00' WHERE id = 3",
    "DELETE FROM all_types WHERE id IN (4, 103)",
]


# A table created while streaming: Debezium reads its definition from the CREATE TABLE statement, not from
# SHOW CREATE TABLE, so BOOL stays BOOL, JSON stays JSON and ENUM labels keep their 4-byte characters.
LATE_COLUMNS: list[tuple[str, str, str]] = [
    ("id", "BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY", "int"), ("bo", "BOOL", "int"),
    ("bn", "BOOLEAN NOT NULL DEFAULT TRUE", "int"), ("js", "JSON", "exact"), ("d65", "DECIMAL(65,30)", "decimal"),
    ("ts", "TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)", "timestamp"), ("dtm", "DATETIME(6)", "datetime"),
    ("tm", "TIME(6)", "exact"), ("yr", "YEAR", "int"), ("en", f"ENUM('a', '{LONG_4_BYTE}')", "exact"),
    ("st", f"SET('a', '{LONG_4_BYTE}')", "exact"), ("g", "GEOMETRY", "geometry"), ("b1", "BIT(1)", "bit1"),
]
LATE_ROWS = [
    "(18446744073709551615, 1, DEFAULT, '{\"k\": [1, 2]}', -0.5, '2038-01-19 08:44:07.999', "
    f"'9999-12-31 23:59:59.999999', '838:59:59.000000', 2155, '{LONG_4_BYTE}', 'a,{LONG_4_BYTE}', "
    "ST_GeomFromText('LINESTRING(1 1, 2 2)', 4326), b'1')",
    "(1, 0, FALSE, NULL, NULL, '0000-00-00 00:00:00', NULL, '-838:59:59.000000', 1901, 'a', '', NULL, b'0')",
]


def _insert(rows: dict[int, dict[str, str]]) -> str:
    values = []
    for row_id, row in rows.items():
        values.append("(" + ", ".join([str(row_id)] + [row.get(name, "DEFAULT") for name in NAMES[1:]]) + ")")
    return f"INSERT INTO all_types ({', '.join(NAMES)}) VALUES " + ", ".join(values)


def _create_table() -> str:
    return "CREATE TABLE all_types (" + ", ".join(f"`{name}` {ddl}" for name, ddl, _ in COLUMNS) + ")"


def _source_rows(pipeline, table: str) -> list[dict[str, Any]]:
    """Rows read through PyMySQL with the session in UTC, so TIMESTAMP values come back in UTC."""
    with pipeline.mariadb.connect(pipeline.source_db) as connection, connection.cursor() as cursor:
        cursor.execute("SET time_zone = '+00:00'")
        cursor.execute(f"SELECT * FROM `{table}` ORDER BY 1")
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]


def _dest_rows(pipeline, table: str) -> list[dict[str, Any]]:
    with psycopg.connect(pipeline.dest_dsn) as conn, conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT * FROM {} ORDER BY 1").format(sql.Identifier(pipeline.source_db, table)))
        names = [column.name for column in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]


def _is_zero_date(value: Any) -> bool:
    """PyMySQL hands back MariaDB's zero and partly-zero dates as their text (they are no Python date)."""
    return isinstance(value, str) and value[:10].count("-") == 2 and ("0000" in value[:4] or "-00" in value[:10])


def _bits(width: int) -> Callable[[Any, Any], tuple[Any, Any]]:
    def normalise(source: Any, dest: Any) -> tuple[Any, Any]:
        return (None if source is None else format(int.from_bytes(source, "big"), f"0{width}b")), dest
    return normalise


def _geometry_parts(value: bytes | None, *, ewkb: bool) -> tuple[int, bytes] | None:
    """(SRID, WKB) of MariaDB's geometry value (4-byte little-endian SRID, then WKB) or of PostGIS EWKB."""
    if value is None:
        return None
    value = bytes(value)
    if not ewkb:
        return struct.unpack("<I", value[:4])[0], value[4:]
    order = "<" if value[0] == 1 else ">"
    (type_word,) = struct.unpack(order + "I", value[1:5])
    if not type_word & 0x20000000:
        return 0, value
    (srid,) = struct.unpack(order + "I", value[5:9])
    return srid, value[:1] + struct.pack(order + "I", type_word & ~0x20000000) + value[9:]


def _utc(source: Any, dest: Any) -> tuple[Any, Any]:
    return (None if source is None else source.replace(tzinfo=timezone.utc)), dest


NORMALISE: dict[str, Callable[[Any, Any], tuple[Any, Any]]] = {
    "int": lambda s, d: (s, d),
    "exact": lambda s, d: (s, None if d is None else bytes(d) if isinstance(d, memoryview) else d),
    # Equal as decimals and written with the same digits (scale included).
    "decimal": lambda s, d: (None if s is None else str(s), None if d is None else str(d)),
    # MariaDB's text protocol (PyMySQL, and Debezium's snapshot through JDBC) gives FLOAT 6 significant digits.
    "float32": lambda s, d: (s, None if d is None else float(f"{d:.6g}")),
    "bit1": lambda s, d: (None if s is None else bool(int.from_bytes(s, "big")), d),
    "bits10": _bits(10),
    "bits64": _bits(64),
    # CHAR(n) pads with spaces in PostgreSQL and strips them in MariaDB; trailing spaces mean nothing in either.
    "char": lambda s, d: (s, None if d is None else d.rstrip(" ")),
    "date": lambda s, d: (None if _is_zero_date(s) else s, d),
    "datetime": lambda s, d: (None if _is_zero_date(s) else s, d),
    "timestamp": lambda s, d: _utc(None if _is_zero_date(s) else s, d),
    "geometry": lambda s, d: (_geometry_parts(s, ewkb=False), _geometry_parts(d, ewkb=True)),
}


def assert_same_values(pipeline, table: str, kinds: dict[str, str]) -> int:
    """Compares every value of every row; returns how many values were compared."""
    return assert_rows_equal(_source_rows(pipeline, table), _dest_rows(pipeline, table), "id",
                             lambda name: NORMALISE[kinds[name]])


def _zero_timestamps(pipeline, ids: list[int], nullable_only: bool = False) -> int:
    """How many TIMESTAMP values of the given rows are zero dates in the source."""
    columns = [f"ts{fsp}" for fsp in range(7)] + ([] if nullable_only else ["tsn"])
    rows = [row for row in _source_rows(pipeline, "all_types") if row["id"] in ids]
    return sum(_is_zero_date(row[name]) for row in rows for name in columns)


def test_every_mariadb_type_survives_snapshot_and_streaming(pipeline, caplog):
    pipeline.source([*SESSION, _create_table(), _insert(SNAPSHOT_ROWS)])

    summary = pipeline.sync()

    assert summary["snapshot_rows"] == len(SNAPSHOT_ROWS)
    compared = assert_same_values(pipeline, "all_types", KINDS)
    assert compared == len(SNAPSHOT_ROWS) * len(COLUMNS)
    # A snapshot reads a nullable zero TIMESTAMP as NULL already; a NOT NULL one arrives as the epoch.
    assert summary["zero_dates"] == _zero_timestamps(pipeline, [5]) - _zero_timestamps(pipeline, [5], nullable_only=True)
    identity = pipeline.dest_query(
        "SELECT attidentity FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'id'",
        (f'"{pipeline.source_db}"."all_types"',))
    assert identity == [("d",)]

    late_table = "CREATE TABLE late_types (" + ", ".join(f"`{name}` {ddl}" for name, ddl, _ in LATE_COLUMNS) + ")"
    pipeline.source([*SESSION, _insert(STREAMED_ROWS), *STREAMED_CHANGES, late_table,
                     f"INSERT INTO late_types VALUES {', '.join(LATE_ROWS)}"])

    summary = pipeline.sync()

    assert (summary["inserts"], summary["updates"], summary["deletes"]) == (
        len(STREAMED_ROWS) + 1 + len(LATE_ROWS), 6, 2)
    assert_same_values(pipeline, "all_types", KINDS)
    assert_same_values(pipeline, "late_types", {name: kind for name, _, kind in LATE_COLUMNS})
    late_zero_dates = sum(_is_zero_date(row["ts"]) for row in _source_rows(pipeline, "late_types"))
    assert summary["zero_dates"] == _zero_timestamps(pipeline, [3, 105]) + late_zero_dates
    assert "zero dates of" in caplog.text
    stats = pipeline.dest_query("SELECT zero_dates FROM cdc.stats WHERE connector = %s", (pipeline.name,))
    assert stats == [(summary["zero_dates"] + _zero_timestamps(pipeline, [5])
                      - _zero_timestamps(pipeline, [5], nullable_only=True),)]


DECIMAL_COLUMNS: list[tuple[str, str, str]] = [
    ("id", "INT PRIMARY KEY", "int"), ("d65", "DECIMAL(65,30)", "decimal"), ("d10", "DECIMAL(10,2)", "decimal"),
    ("d0", "DECIMAL(65,0) UNSIGNED", "decimal"), ("biu", "BIGINT UNSIGNED", "int"),
]
DECIMAL_ROWS = [
    ("-" + "9" * 35 + "." + "9" * 30, "-99999999.99", "0", "0"),
    ("9" * 35 + "." + "9" * 30, "99999999.99", "9" * 65, "18446744073709551615"),
    ("0." + "0" * 29 + "1", "0.00", "1", "1"),
    ("NULL", "NULL", "NULL", "NULL"),
]


@pytest.mark.parametrize("mode", ["precise", "string"])
def test_decimals_in_both_decimal_handling_modes(pipeline, mode):
    pipeline.write_config(debezium={"decimal.handling.mode": mode})
    create = "CREATE TABLE decimals (" + ", ".join(f"{name} {ddl}" for name, ddl, _ in DECIMAL_COLUMNS) + ")"
    rows = ", ".join(f"({i}, {', '.join(row)})" for i, row in enumerate(DECIMAL_ROWS, start=1))
    pipeline.source([create, f"INSERT INTO decimals VALUES {rows}"])
    kinds = {name: kind for name, _, kind in DECIMAL_COLUMNS}

    pipeline.sync()

    assert_same_values(pipeline, "decimals", kinds)

    streamed = ", ".join(f"({i + 100}, {', '.join(row)})" for i, row in enumerate(DECIMAL_ROWS, start=1))
    pipeline.source([f"INSERT INTO decimals VALUES {streamed}", "UPDATE decimals SET d65 = -d65, d10 = d10 / 3 "
                     "WHERE id IN (1, 102)"])

    pipeline.sync()

    assert_same_values(pipeline, "decimals", kinds)
    assert len(_source_rows(pipeline, "decimals")) == 2 * len(DECIMAL_ROWS)


# Every column but a TIMESTAMP or a geometry other than a POINT has its COPY text rendered by the source
# (`copy_text_sql`): a table of only those is read by the bulk load as whole COPY lines.
WHOLE_LINE_COLUMNS = [column for column in COLUMNS if column[2] not in ("timestamp", "geometry") or column[0] == "pt"]


def test_a_table_the_source_renders_as_whole_copy_lines(pipeline):
    names = [name for name, _, _ in WHOLE_LINE_COLUMNS]
    create = "CREATE TABLE line_types (" + ", ".join(f"`{name}` {ddl}" for name, ddl, _ in WHOLE_LINE_COLUMNS) + ")"
    values = ", ".join("(" + ", ".join([str(row_id)] + [row.get(name, "DEFAULT") for name in names[1:]]) + ")"
                       for row_id, row in SNAPSHOT_ROWS.items())
    pipeline.source([*SESSION, create, f"INSERT INTO line_types ({', '.join(names)}) VALUES {values}"])

    summary = pipeline.sync()

    assert summary["snapshot_rows"] == len(SNAPSHOT_ROWS)
    compared = assert_same_values(pipeline, "line_types", {name: kind for name, _, kind in WHOLE_LINE_COLUMNS})
    assert compared == len(SNAPSHOT_ROWS) * len(names)
