"""Every type of the SQL Server map, exact end to end, on events made by Debezium's SQL Server classes.

The scripted source (tests/helpers/scripted_source.py) replays a change table through the connector's own code inside
the real embedded engine: a capture instance's schema change through `SqlServerSchemaChangeEventEmitter` and
Debezium's `tableChanges` serializer, each row through `SqlServerValueConverters` and `TableSchemaBuilder` on the
columns as mssql-jdbc's `getColumns` reports them, the values being the Java objects mssql-jdbc's `getObject` hands
the connector. Then the product's runner, Spark and apply. One table holds a column of every type; its rows hold
each type's minimum, maximum, full-precision fractions, Unicode, empty values and NULL; they are inserted, updated
and deleted, and every value is compared in PostgreSQL with the Python value expected. A second capture instance
adds, drops and retypes columns.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import date, datetime, time, timezone
from decimal import Decimal
from typing import Any

import pytest
from psycopg import sql

from tests.helpers.scripted_source import hexbytes, java, new_scripted_pipeline, sqlserver_column

pytestmark = pytest.mark.integration

TABLE = "dbo.AllTypes"
UTC = timezone.utc
EVERY_BYTE = bytes(range(256))
LONG_UNICODE = "line 1\nline\t2 \\ back\r\n" + "ø€😀" * 5_000


def ts(text: str) -> dict[str, str]:
    return java("java.sql.Timestamp", text)


@dataclass(frozen=True)
class Case:
    """One column: its definition as mssql-jdbc reports it, its destination type, and its values per row as the
    driver hands them to the connector (`low`, `high`, `other`) with the Python values PostgreSQL gives back."""

    column: dict[str, Any]
    pg_type: str
    low: tuple[Any, Any]
    high: tuple[Any, Any]
    other: tuple[Any, Any]
    read_as: str = "{}"


def col(name: str, type_name: str, length: int | None = None, scale: int | None = None, **fields: Any) -> dict:
    return sqlserver_column(name, type_name, length, scale, **fields)


def same(value: Any) -> tuple[Any, Any]:
    return value, value


def num(text: str) -> tuple[Any, Any]:
    return java("java.math.BigDecimal", text), Decimal(text)


CASES = [
    Case(col("c_bit", "bit", 1), "boolean", same(False), same(True), same(True)),
    Case(col("c_tinyint", "tinyint", 3, 0), "smallint", (java("java.lang.Short", "0"), 0),
         (java("java.lang.Short", "255"), 255), (java("java.lang.Short", "7"), 7)),
    Case(col("c_smallint", "smallint", 5, 0), "smallint", (java("java.lang.Short", "-32768"), -32768),
         (java("java.lang.Short", "32767"), 32767), (java("java.lang.Short", "0"), 0)),
    Case(col("c_int", "int", 10, 0), "integer", same(-2147483648), same(2147483647), same(0)),
    Case(col("c_bigint", "bigint", 19, 0), "bigint", (java("java.lang.Long", "-9223372036854775808"), -2**63),
         (java("java.lang.Long", "9223372036854775807"), 2**63 - 1), (java("java.lang.Long", "-1"), -1)),
    Case(col("c_decimal", "decimal", 38, 10), "numeric(38,10)", num("-9999999999999999999999999999.9999999999"),
         num("9999999999999999999999999999.9999999999"), num("0.0000000001")),
    Case(col("c_numeric", "numeric", 18, 0), "numeric(18,0)", num("-999999999999999999"),
         num("999999999999999999"), num("0")),
    Case(col("c_smallmoney", "smallmoney", 10, 4), "numeric(10,4)", num("-214748.3648"), num("214748.3647"),
         num("0.0001")),
    Case(col("c_money", "money", 19, 4), "numeric(19,4)", num("-922337203685477.5808"),
         num("922337203685477.5807"), num("1.2345")),
    # real read back as float8: the float4 value itself, not its shortest text.
    Case(col("c_real", "real", 24), "real", (java("java.lang.Float", "-3.4028235E38"), -3.4028234663852886e38),
         (java("java.lang.Float", "3.4028235E38"), 3.4028234663852886e38),
         (java("java.lang.Float", "1.17549435E-38"), 1.1754943508222875e-38), read_as="{}::float8"),
    Case(col("c_float", "float", 53, jdbc_type=8), "double precision", same(-1.7976931348623157e308),
         same(1.7976931348623157e308), same(2.2250738585072014e-308)),
    Case(col("c_date", "date", 10), "date", (java("java.sql.Date", "0001-01-01"), date(1, 1, 1)),
         (java("java.sql.Date", "9999-12-31"), date(9999, 12, 31)), (java("java.sql.Date", "2024-02-29"),
                                                                     date(2024, 2, 29))),
    # The change-table reader reads time as a Timestamp (SqlServerChangeTablePointer.getColumnData).
    Case(col("c_time", "time", 16, 7), "time(6) without time zone", (ts("1900-01-01 00:00:00"), time(0)),
         (ts("1900-01-01 23:59:59.9999999"), time(23, 59, 59, 999999)),
         (ts("1900-01-01 12:34:56.1234567"), time(12, 34, 56, 123456))),
    Case(col("c_time3", "time", 12, 3), "time(3) without time zone", (ts("1900-01-01 00:00:00"), time(0)),
         (ts("1900-01-01 23:59:59.999"), time(23, 59, 59, 999000)), (ts("1900-01-01 00:00:00.001"),
                                                                     time(0, 0, 0, 1000))),
    Case(col("c_datetime", "datetime", 23, 3), "timestamp(3) without time zone",
         (ts("1753-01-01 00:00:00"), datetime(1753, 1, 1)),
         (ts("9999-12-31 23:59:59.997"), datetime(9999, 12, 31, 23, 59, 59, 997000)),
         (ts("2024-02-29 12:00:00.003"), datetime(2024, 2, 29, 12, 0, 0, 3000))),
    Case(col("c_smalldatetime", "smalldatetime", 16, 0), "timestamp(0) without time zone",
         (ts("1900-01-01 00:00:00"), datetime(1900, 1, 1)), (ts("2079-06-06 23:59:00"), datetime(2079, 6, 6, 23, 59)),
         (ts("2024-02-29 12:01:00"), datetime(2024, 2, 29, 12, 1))),
    Case(col("c_datetime2", "datetime2", 27, 7), "timestamp(6) without time zone",
         (ts("0001-01-01 00:00:00"), datetime(1, 1, 1)),
         (ts("9999-12-31 23:59:59.9999999"), datetime(9999, 12, 31, 23, 59, 59, 999999)),
         (ts("1969-12-31 23:59:59.9999999"), datetime(1969, 12, 31, 23, 59, 59, 999999))),
    Case(col("c_datetime2_3", "datetime2", 23, 3), "timestamp(3) without time zone",
         (ts("0001-01-01 00:00:00"), datetime(1, 1, 1)),
         (ts("9999-12-31 23:59:59.999"), datetime(9999, 12, 31, 23, 59, 59, 999000)),
         (ts("2024-02-29 00:00:00.001"), datetime(2024, 2, 29, 0, 0, 0, 1000))),
    Case(col("c_datetimeoffset", "datetimeoffset", 34, 7), "timestamp(6) with time zone",
         (java("microsoft.sql.DateTimeOffset", "0001-01-01 00:00:00 -14:00"), datetime(1, 1, 1, 14, tzinfo=UTC)),
         (java("microsoft.sql.DateTimeOffset", "9999-12-31 23:59:59.9999999 +14:00"),
          datetime(9999, 12, 31, 9, 59, 59, 999999, tzinfo=UTC)),
         (java("microsoft.sql.DateTimeOffset", "2024-03-01 00:00:00.9999999 +05:30"),
          datetime(2024, 2, 29, 18, 30, 0, 999999, tzinfo=UTC))),
    # SQL Server pads char(n) to n; n bytes or UTF-16 units of BMP characters are n characters.
    Case(col("c_char", "char", 10), "character(10)", same(" " * 10), same("~" * 10), same("ab c      ")),
    Case(col("c_nchar", "nchar", 5), "character(5)", same("     "), same("ĉ€ßøÿ"), same("é    ")),
    Case(col("c_varchar", "varchar", 50), "character varying(50)", same(""), same("x" * 50),
         same("tab\tnew\nline\\back 'quote' \"dq\"")),
    Case(col("c_nvarchar", "nvarchar", 20), "character varying(20)", same(""), same("😀" * 10),
         same("naïve ÆØÅ ∑ 中文")),
    Case(col("c_varchar_max", "varchar", 2147483647), "text", same(""), same("y" * 70_000), same("a\u0001b")),
    Case(col("c_nvarchar_max", "nvarchar", 1073741823), "text", same(""), same(LONG_UNICODE), same("ø")),
    Case(col("c_text", "text", 2147483647), "text", same(""), same("z" * 9000), same("text")),
    Case(col("c_ntext", "ntext", 1073741823), "text", same(""), same("🎉" * 3000), same("ntext")),
    Case(col("c_binary", "binary", 4), "bytea", (hexbytes(b"\0" * 4), b"\0" * 4),
         (hexbytes(b"\xff" * 4), b"\xff" * 4), (hexbytes(b"\x00\x01\xfe\xff"), b"\x00\x01\xfe\xff")),
    Case(col("c_varbinary", "varbinary", 8000), "bytea", (hexbytes(b""), b""), (hexbytes(EVERY_BYTE), EVERY_BYTE),
         (hexbytes(b"\x00"), b"\x00")),
    Case(col("c_varbinary_max", "varbinary", 2147483647), "bytea", (hexbytes(b""), b""),
         (hexbytes(EVERY_BYTE * 400), EVERY_BYTE * 400), (hexbytes(b"\\x00"), b"\\x00")),
    Case(col("c_image", "image", 2147483647), "bytea", (hexbytes(b""), b""), (hexbytes(EVERY_BYTE), EVERY_BYTE),
         (hexbytes(b"GIF89a"), b"GIF89a")),
    Case(col("c_rowversion", "timestamp", 8), "bytea", (hexbytes(b"\0" * 8), b"\0" * 8),
         (hexbytes(b"\xff" * 8), b"\xff" * 8), (hexbytes(b"\0\0\0\0\0\0\x07\xd1"), b"\0\0\0\0\0\0\x07\xd1")),
    Case(col("c_uuid", "uniqueidentifier", 36), "uuid",
         ("00000000-0000-0000-0000-000000000000", uuid.UUID(int=0)),
         ("FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF", uuid.UUID(int=2**128 - 1)),
         ("6F9619FF-8B86-D011-B42D-00C04FC964FF", uuid.UUID("6f9619ff-8b86-d011-b42d-00c04fc964ff"))),
    Case(col("c_xml", "xml", 2147483647), "xml", same("<a/>"),
         same('<order id="1"><item qty="2">tea &amp; milk ø€😀</item></order>'), same("<r>\n  <x>1</x>\n</r>"),
         read_as="{}::text"),
    # mssql-jdbc reports CLR types as varbinary (SQLServerDatabaseMetaData's DataTypeFilter: SQL_SS_UDT).
    Case(col("c_hierarchyid", "hierarchyid", 892, jdbc_type=-3), "bytea", (hexbytes(b""), b""),
         (hexbytes(b"\x58"), b"\x58"), (hexbytes(b"\x5a\xc0"), b"\x5a\xc0")),
    Case(col("c_geometry", "geometry", 2147483647, jdbc_type=-3), "bytea",
         (hexbytes(b"\xe6\x10\0\0\x01\x0c" + b"\0" * 16), b"\xe6\x10\0\0\x01\x0c" + b"\0" * 16),
         (hexbytes(b"\0\0\0\0\x01\x0c" + b"\x01" * 16), b"\0\0\0\0\x01\x0c" + b"\x01" * 16), same(None)),
]
LOW, HIGH, OTHER = 1, 2, 3
NAMES = [case.column["name"] for case in CASES]


def row(key: int, which: str) -> dict[str, Any]:
    return {"id": key, **{case.column["name"]: getattr(case, which)[0] for case in CASES}}


def expected(key: int, which: str | None) -> dict[str, Any]:
    return {"id": key, **{case.column["name"]: getattr(case, which)[1] if which else None for case in CASES}}


def dest_rows(pipe, table: str, columns: list[str], read_as: dict[str, str]) -> list[dict[str, Any]]:
    """The destination table's rows in key order, each column read through its SQL (`{}::float8`)."""
    select = sql.SQL(", ").join(sql.SQL(read_as.get(name, "{}")).format(sql.Identifier(name)) for name in columns)
    query = sql.SQL("SELECT {} FROM {} ORDER BY 1").format(select, sql.Identifier(pipe.dest_schema, table))
    return [dict(zip(columns, values)) for values in pipe.dest_query(query.as_string())]


def assert_rows(actual: list[dict[str, Any]], wanted: list[dict[str, Any]]) -> None:
    """Every value of every row as expected; the differences listed by row and column."""
    differences = [f"id {w['id']} {name}: expected {str(w[name])[:80]!r}, got {str(a.get(name))[:80]!r}"
                   for a, w in zip(actual, wanted) for name in w if a.get(name) != w[name]]
    assert [a["id"] for a in actual] == [w["id"] for w in wanted]
    assert not differences, "\n".join(differences)


def test_every_sqlserver_type_is_exact_through_the_connectors_code(destination_pg, spark, tmp_path, monkeypatch):
    pipe = new_scripted_pipeline("sqlserver", destination_pg, tmp_path, monkeypatch, tables=[TABLE])
    script = pipe.script
    identity = sqlserver_column("id", "int identity", 10, 0, optional=False, auto_incremented=True)
    variant = sqlserver_column("c_variant", "sql_variant", 8000, jdbc_type=-150)
    script.create_table(TABLE, [identity, *[case.column for case in CASES], variant], primary_key=["id"])
    with script.transaction():
        script.insert(TABLE, row(LOW, "low"))
        script.insert(TABLE, row(HIGH, "high"))
        script.insert(TABLE, row(OTHER, "other"))
    script.insert(TABLE, {"id": 4})
    script.insert(TABLE, row(5, "low"))
    script.update(TABLE, row(OTHER, "other"), row(OTHER, "high"))
    script.update(TABLE, {"id": 4}, row(4, "other"))
    script.delete(TABLE, row(5, "low"))
    script.insert(TABLE, {"id": 6})
    pipe.sync()

    types = pipe.dest_columns("alltypes")
    assert types == {"id": "integer", **{case.column["name"]: case.pg_type for case in CASES}, "c_variant": "text"}
    assert pipe.dest_primary_key("alltypes") == ["id"]
    assert pipe.dest_query("SELECT is_identity FROM information_schema.columns WHERE table_schema = 'dbo' "
                           "AND table_name = 'alltypes' AND column_name = 'id'") == [("YES",)]
    read_as = {case.column["name"]: case.read_as for case in CASES}
    assert_rows(dest_rows(pipe, "alltypes", ["id", *NAMES, "c_variant"], read_as),
                [{**expected(LOW, "low"), "c_variant": None}, {**expected(HIGH, "high"), "c_variant": None},
                 {**expected(OTHER, "high"), "c_variant": None}, {**expected(4, "other"), "c_variant": None},
                 {**expected(6, None), "c_variant": None}])

    # A new capture instance after ALTER TABLE: c_int becomes bigint, c_text is dropped, c_added is added.
    altered = [identity, *[case.column for case in CASES if case.column["name"] not in ("c_int", "c_text")],
               variant, sqlserver_column("c_int", "bigint", 19, 0), sqlserver_column("c_added", "nvarchar", 10)]
    script.alter_table(TABLE, altered, primary_key=["id"], capture="dbo_AllTypes_v2")
    script.update(TABLE, {"id": LOW}, {"id": LOW, "c_int": java("java.lang.Long", "-9223372036854775808"),
                                       "c_added": "añadido"})
    script.insert(TABLE, {"id": 7, "c_int": java("java.lang.Long", "9223372036854775807"), "c_added": ""})
    pipe.sync()

    types = pipe.dest_columns("alltypes")
    assert "c_text" not in types and types["c_int"] == "bigint" and types["c_added"] == "character varying(10)"
    rows = pipe.dest_query('SELECT id, c_int, c_added, c_money FROM dbo.alltypes ORDER BY id')
    assert rows == [(1, -2**63, "añadido", None), (2, 2147483647, None, Decimal("922337203685477.5807")),
                    (3, 2147483647, None, Decimal("922337203685477.5807")), (4, 0, None, Decimal("1.2345")),
                    (6, None, None, None), (7, 2**63 - 1, "", None)]
