"""Every type of the Oracle map, exact end to end, on events made by Debezium's Oracle classes.

The scripted source (tests/helpers/scripted_source.py) replays LogMiner's output through the connector's own code
inside the real embedded engine: DDL text through Debezium's Oracle DDL parser and its schema-change emitter (so the
columns are described as the parser describes them and the record carries the text), each row's SQL_REDO through
`LogMinerDmlParser` and `LogMinerChangeRecordEmitter`, its values through `OracleValueConverters` and
`TableSchemaBuilder`, with the connector properties the pipeline sets (`lob.enabled`, `interval.handling.mode=string`,
`time.precision.mode=microseconds`). Then the product's runner, Spark and apply. One table holds a column of every
type; its rows hold each type's minimum, maximum, full-precision fractions, time zones, Unicode and NULL; they are
inserted, updated (an update that leaves the LOBs alone carries Debezium's placeholder for them, and the destination
keeps their values) and deleted, and every value is compared in PostgreSQL with the Python value expected. Then
columns are added, dropped, retyped and renamed by DDL text.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest

from tests.helpers.scripted_source import new_scripted_pipeline
from tests.integration.test_sqlserver_types import assert_rows, dest_rows

pytestmark = pytest.mark.integration

TABLE = "DEBEZIUM.ALL_TYPES"
QUOTED = '"DEBEZIUM"."ALL_TYPES"'
UTC = timezone.utc
EVERY_BYTE = bytes(range(256))


def q(text: str) -> str:
    """An Oracle string literal as LogMiner writes it."""
    return "'" + text.replace("'", "''") + "'"


def unistr(text: str) -> str:
    """A national-character literal as LogMiner writes it: UTF-16 code units as \\XXXX."""
    units = text.encode("utf-16-be")
    return "UNISTR('" + "".join(f"\\{units[i]:02X}{units[i + 1]:02X}" for i in range(0, len(units), 2)) + "')"


def hextoraw(data: bytes) -> str:
    return f"HEXTORAW('{data.hex().upper()}')"


def to_date(text: str) -> str:
    return f"TO_DATE('{text}', 'YYYY-MM-DD HH24:MI:SS')"


def to_timestamp(text: str) -> str:
    return f"TO_TIMESTAMP('{text}')"


def to_timestamp_tz(text: str) -> str:
    return f"TO_TIMESTAMP_TZ('{text}')"


@dataclass(frozen=True)
class Case:
    """One column: its DDL, destination type, and per row the redo literal and the Python value read back."""

    name: str
    ddl: str
    pg_type: str
    low: tuple[str, Any]
    high: tuple[str, Any]
    other: tuple[str, Any]
    lob: bool = False
    read_as: str = "{}"


def num(text: str, kind: type = Decimal) -> tuple[str, Any]:
    return q(text), kind(text)


CASES = [
    Case("N1", "NUMBER(1)", "smallint", num("-9", int), num("9", int), num("0", int)),
    Case("N4", "NUMBER(4,0)", "smallint", num("-9999", int), num("9999", int), num("1", int)),
    Case("N9", "NUMBER(9)", "integer", num("-999999999", int), num("999999999", int), num("-1", int)),
    Case("N18", "NUMBER(18)", "bigint", num("-999999999999999999", int), num("999999999999999999", int),
         num("0", int)),
    Case("N38", "NUMBER(38)", "numeric(38,0)", num("-" + "9" * 38), num("9" * 38), num("1")),
    Case("INTEGER_C", "INTEGER", "numeric(38,0)", num("-" + "9" * 38), num("9" * 38), num("42")),
    Case("NPS", "NUMBER(12,4)", "numeric(12,4)", num("-99999999.9999"), num("99999999.9999"), num("0.0001")),
    Case("NNEG", "NUMBER(10,-2)", "bigint", num("-999999999900", int), num("999999999900", int),
         num("12345600", int)),
    Case("NFREE", "NUMBER", "numeric", num("-1234567890123456789012345678.0123456789"),
         num("99999999999999999999999999999999999999" + "0" * 88), num("0." + "0" * 129 + "1")),
    Case("FL", "FLOAT", "numeric", num("-12345678901234567890123456789012345678"),
         num("1.2345678901234567890123456789012345678"), num("0.1")),
    Case("FL10", "FLOAT(10)", "numeric", num("-123.4"), num("999"), num("0.001")),
    # real and double read back as float8: the stored value itself, not its shortest text.
    Case("BF", "BINARY_FLOAT", "real", (q("-3.40282347E+038"), -3.4028234663852886e38),
         (q("3.40282347E+038"), 3.4028234663852886e38), (q("1.17549435E-038"), 1.1754943508222875e-38),
         read_as="{}::float8"),
    Case("BD", "BINARY_DOUBLE", "double precision", (q("-1.7976931348623157E+308"), -1.7976931348623157e308),
         (q("1.7976931348623157E+308"), 1.7976931348623157e308), (q("2.2250738585072014E-308"), 2.2250738585072014e-308)),
    Case("DT", "DATE", "timestamp(0) without time zone", (to_date("0001-01-01 00:00:00"), datetime(1, 1, 1)),
         (to_date("9999-12-31 23:59:59"), datetime(9999, 12, 31, 23, 59, 59)),
         (to_date("2024-02-29 13:14:15"), datetime(2024, 2, 29, 13, 14, 15))),
    Case("TS", "TIMESTAMP", "timestamp(6) without time zone",
         (to_timestamp("0001-01-01 00:00:00.000000"), datetime(1, 1, 1)),
         (to_timestamp("9999-12-31 23:59:59.999999"), datetime(9999, 12, 31, 23, 59, 59, 999999)),
         (to_timestamp("1969-12-31 23:59:59.999999"), datetime(1969, 12, 31, 23, 59, 59, 999999))),
    Case("TS0", "TIMESTAMP(0)", "timestamp(0) without time zone",
         (to_timestamp("0001-01-01 00:00:00"), datetime(1, 1, 1)),
         (to_timestamp("9999-12-31 23:59:59"), datetime(9999, 12, 31, 23, 59, 59)),
         (to_timestamp("2024-02-29 12:00:00"), datetime(2024, 2, 29, 12))),
    Case("TS9", "TIMESTAMP(9)", "timestamp(6) without time zone",
         (to_timestamp("0001-01-01 00:00:00.000000001"), datetime(1, 1, 1)),
         (to_timestamp("9999-12-31 23:59:59.999999999"), datetime(9999, 12, 31, 23, 59, 59, 999999)),
         (to_timestamp("2262-04-11 23:47:16.854775808"), datetime(2262, 4, 11, 23, 47, 16, 854775))),
    Case("TSTZ", "TIMESTAMP(9) WITH TIME ZONE", "timestamp(6) with time zone",
         (to_timestamp_tz("0001-01-01 00:00:00.000000000 -12:00"), datetime(1, 1, 1, 12, tzinfo=UTC)),
         (to_timestamp_tz("9999-12-31 23:59:59.999999999 +14:00"),
          datetime(9999, 12, 31, 9, 59, 59, 999999, tzinfo=UTC)),
         (to_timestamp_tz("2024-03-01 00:00:00.999999999 +05:30"),
          datetime(2024, 2, 29, 18, 30, 0, 999999, tzinfo=UTC))),
    Case("TSLTZ", "TIMESTAMP WITH LOCAL TIME ZONE", "timestamp(6) with time zone",
         (to_timestamp_tz("1970-01-01 00:00:00.000000 +00:00"), datetime(1970, 1, 1, tzinfo=UTC)),
         (to_timestamp_tz("9999-12-31 23:59:59.999999 +00:00"), datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
         (to_timestamp_tz("2024-02-29 12:00:00.5 -08:00"), datetime(2024, 2, 29, 20, 0, 0, 500000, tzinfo=UTC))),
    # Intervals read back as PostgreSQL's text (IntervalStyle postgres): years and months are no timedelta.
    # PostgreSQL's interval holds -2^31 .. 2^31-1 months: Oracle's YEAR(9) beyond that is refused by the apply.
    Case("IYM", "INTERVAL YEAR(9) TO MONTH", "interval",
         ("TO_YMINTERVAL('-178956970-08')", "-178956970 years -8 mons"),
         ("TO_YMINTERVAL('+178956970-07')", "178956970 years 7 mons"), ("TO_YMINTERVAL('+01-02')", "1 year 2 mons"),
         read_as="{}::text"),
    Case("IDS", "INTERVAL DAY(9) TO SECOND(6)", "interval",
         ("TO_DSINTERVAL('-999999999 23:59:59.999999')", "-999999999 days -23:59:59.999999"),
         ("TO_DSINTERVAL('+999999999 23:59:59.999999')", "999999999 days 23:59:59.999999"),
         ("TO_DSINTERVAL('+03 04:05:06.000001')", "3 days 04:05:06.000001"), read_as="{}::text"),
    Case("C10", "CHAR(10)", "character(10)", num(" " * 9 + "a", str), num("~" * 10, str), num("ab c      ", str)),
    Case("NC5", "NCHAR(5)", "character(5)", (unistr("é    "), "é    "), (unistr("ĉ€ßøÿ"), "ĉ€ßøÿ"),
         (unistr("a    "), "a    ")),
    Case("VC", "VARCHAR2(4000)", "character varying(4000)", num("x", str), num("y" * 4000, str),
         num("tab\tnew\nline\\back 'quote' \"dq\" ø€😀", str)),
    Case("VCC", "VARCHAR2(10 CHAR)", "character varying(10)", num("-", str), num("😀" * 10, str), num("ø", str)),
    Case("NVC", "NVARCHAR2(20)", "character varying(20)", (unistr("-"), "-"), (unistr("😀" * 10), "😀" * 10),
         (unistr("naïve ÆØÅ ∑ 中文"), "naïve ÆØÅ ∑ 中文")),
    Case("RW", "RAW(16)", "bytea", (hextoraw(b"\0"), b"\0"), (hextoraw(b"\xff" * 16), b"\xff" * 16),
         (hextoraw(b"\x00\x01\xfe\xff"), b"\x00\x01\xfe\xff")),
    Case("CL", "CLOB", "text", num("c", str), num("line 1\nline\t2 \\ back\r\n" + "ø€😀" * 300, str),
         num("clob", str), lob=True),
    Case("NCL", "NCLOB", "text", (unistr("n"), "n"), (unistr("ø€😀" * 100), "ø€😀" * 100), (unistr("nclob"), "nclob"),
         lob=True),
    Case("BL", "BLOB", "bytea", (hextoraw(b"\0"), b"\0"), (hextoraw(EVERY_BYTE * 4), EVERY_BYTE * 4),
         (hextoraw(b"blob"), b"blob"), lob=True),
]
NAMES = [case.name for case in CASES]


def value(case: Case, which: str | None) -> Any:
    return None if which is None else getattr(case, which)[1]


def literal(case: Case, which: str | None) -> str:
    return "NULL" if which is None else getattr(case, which)[0]


def insert(key: int, which: str | None) -> str:
    columns = ",".join(f'"{name}"' for name in ["ID", *NAMES])
    values = ",".join([q(str(key)), *(literal(case, which) for case in CASES)])
    return f"insert into {QUOTED}({columns}) values ({values});"


def condition(key: int, which: str | None) -> str:
    """The WHERE clause LogMiner writes: every column but the LOBs (supplemental logging does not log them)."""
    parts = [f'"ID" = {q(str(key))}']
    for case in CASES:
        if not case.lob:
            parts.append(f'"{case.name}" IS NULL' if which is None else f'"{case.name}" = {literal(case, which)}')
    return " and ".join(parts)


def update_without_lobs(key: int, old: str | None, new: str) -> str:
    sets = ", ".join(f'"{case.name}" = {literal(case, new)}' for case in CASES if not case.lob)
    return f"update {QUOTED} set {sets} where {condition(key, old)};"


def delete(key: int, which: str | None) -> str:
    return f"delete from {QUOTED} where {condition(key, which)};"


def expected(key: int, which: str | None, lobs: str | None = "same") -> dict[str, Any]:
    row = {"id": key}
    for case in CASES:
        row[case.name.lower()] = value(case, lobs if case.lob and lobs != "same" else which)
    return row


def test_every_oracle_type_is_exact_through_the_connectors_code(destination_pg, spark, tmp_path, monkeypatch):
    pipe = new_scripted_pipeline("oracle", destination_pg, tmp_path, monkeypatch, tables=[TABLE])
    script = pipe.script
    columns = ", ".join(f'"{case.name}" {case.ddl}' for case in CASES)
    script.ddl(TABLE, f'CREATE TABLE {QUOTED} ("ID" NUMBER(9) NOT NULL PRIMARY KEY, {columns})')
    with script.transaction():
        script.redo(TABLE, insert(1, "low"))
        script.redo(TABLE, insert(2, "high"))
        script.redo(TABLE, insert(3, "other"))
    script.redo(TABLE, insert(4, None))
    script.redo(TABLE, insert(5, "low"))
    # LogMiner leaves an untouched LOB out of an UPDATE: Debezium sends its placeholder, the destination keeps it.
    script.redo(TABLE, update_without_lobs(3, "other", "high"))
    script.redo(TABLE, delete(5, "low"))
    pipe.sync()

    types = pipe.dest_columns("all_types")
    assert types == {"id": "integer", **{case.name.lower(): case.pg_type for case in CASES}}
    assert pipe.dest_primary_key("all_types") == ["id"]
    read_as = {case.name.lower(): case.read_as for case in CASES}
    names = ["id", *(name.lower() for name in NAMES)]
    assert_rows(dest_rows(pipe, "all_types", names, read_as),
                [expected(1, "low"), expected(2, "high"), expected(3, "high", lobs="other"), expected(4, None)])

    # DDL text: a column added, one dropped, one retyped, one renamed (its values kept).
    script.ddl(TABLE, f'ALTER TABLE {QUOTED} ADD ("ADDED" VARCHAR2(10))')
    script.ddl(TABLE, "alter table debezium.all_types drop column n4")  # unquoted: Oracle's names in upper case
    script.ddl(TABLE, f'ALTER TABLE {QUOTED} MODIFY ("N9" NUMBER(18))')
    script.ddl(TABLE, 'ALTER TABLE "DEBEZIUM"."ALL_TYPES" RENAME COLUMN "NPS" TO "NPS_RENAMED"')
    where = condition(1, "low").replace('"NPS" =', '"NPS_RENAMED" =').replace(
        f'"N4" = {literal(CASES[NAMES.index("N4")], "low")} and ', "")
    script.redo(TABLE, f"""update {QUOTED} set "ADDED" = 'añadido', "N9" = '999999999999999999' """
                       f"""where {where} and "ADDED" IS NULL;""")
    pipe.sync()

    types = pipe.dest_columns("all_types")
    assert "n4" not in types and "nps" not in types
    assert (types["n9"], types["added"], types["nps_renamed"]) == ("bigint", "character varying(10)", "numeric(12,4)")
    assert pipe.dest_query("SELECT id, n9, added, nps_renamed, cl FROM debezium.all_types ORDER BY id") == [
        (1, 999999999999999999, "añadido", Decimal("-99999999.9999"), "c"),
        (2, 999999999, None, Decimal("99999999.9999"), value(CASES[NAMES.index("CL")], "high")),
        (3, 999999999, None, Decimal("99999999.9999"), "clob"), (4, None, None, None, None)]
