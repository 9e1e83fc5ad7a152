"""Destination types the pipeline did not create: domains, enums, enum arrays, citext, hstore, composites.

The conversion of such a column follows its type's category in the destination catalog (a domain's base
type first); a value the type refuses fails the batch with the column, both types, the value and the event's
source position, and nothing of the batch is applied.
"""

from __future__ import annotations

import re
from decimal import Decimal

import psycopg
import pytest
from psycopg import sql
from pyspark.sql import types as T

from cdc_pipeline.catalog import destination_table
from cdc_pipeline.convert.dml import apply_error, copy_line, plan_columns
from cdc_pipeline.decode.events import DATA_CHANGE, FieldSpec, event_ref
from tests.helpers.spark import get_spark

pytestmark = pytest.mark.integration

_STRING_MAP = T.MapType(T.StringType(), T.StringType())


def has_extension(dsn: str, name: str) -> bool:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = %s", (name,)).fetchone() is not None


def field(name: str, connect_type: str, logical: str | None = None) -> FieldSpec:
    return FieldSpec(name=name, type=connect_type, logical=logical, parameters={}, optional=True)


@pytest.fixture
def dest_dsn(destination_pg, request) -> str:
    database = f"dest_types_{request.node.name}".lower()[:60]
    destination_pg.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(database)).as_string())
    destination_pg.create_database(database)
    return destination_pg.dsn(database)


def test_each_category_receives_the_form_its_type_reads(dest_dsn: str) -> None:
    extensions = [name for name in ("citext", "hstore") if has_extension(dest_dsn, name)]
    fields = [
        field("id", "int32"),
        field("amount", "boolean"),
        field("wait", "int64", "io.debezium.time.MicroTime"),
        field("mood", "string", "io.debezium.data.Enum"),
        field("moods", "string", "io.debezium.data.EnumSet"),
        field("pair", "string"),
    ]
    values = {"id": "1", "amount": "true", "wait": str(-(26 * 3600 + 1) * 1_000_000), "mood": "sad",
              "moods": "sad,happy", "pair": '(7,"x y")', "name": "Ärger", "attrs": '"a"=>"1", "b"=>NULL'}
    column_types = {"id": "integer", "amount": "amount_flag", "wait": "wait_span", "mood": "mood", "moods": "mood[]",
                    "pair": "pair"}
    if "citext" in extensions:
        fields.append(field("name", "string"))
        column_types["name"] = "citext"
    if "hstore" in extensions:
        fields.append(field("attrs", "string"))
        column_types["attrs"] = "hstore"
    with psycopg.connect(dest_dsn, autocommit=True) as conn:
        for name in extensions:
            conn.execute(sql.SQL("CREATE EXTENSION {}").format(sql.Identifier(name)))
        conn.execute("CREATE DOMAIN amount_flag AS numeric(1,0) NOT NULL")
        conn.execute("CREATE DOMAIN wait_span AS interval")
        conn.execute("CREATE TYPE mood AS ENUM ('happy', 'sad')")
        conn.execute("CREATE TYPE pair AS (n integer, label text)")
        conn.execute(sql.SQL("CREATE TABLE t ({})").format(sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(pg_type)) for name, pg_type in column_types.items())))
        with conn.cursor() as cur:
            destination = destination_table(cur, "public", "t")
            assert destination is not None
            columns = plan_columns(fields, destination.columns, str, connector="c", table="db.t",
                                   dest_types=destination.types)
            frame = get_spark().createDataFrame([(values,)], T.StructType([T.StructField("after", _STRING_MAP)]))
            line = frame.select(copy_line("after", columns).alias("line")).first().line
            with cur.copy(sql.SQL("COPY t ({}) FROM STDIN").format(
                    sql.SQL(", ").join(sql.Identifier(column.dest_name) for column in columns))) as copy:
                copy.write(line + "\n")
            row = cur.execute("""SELECT amount, wait = interval '-26:00:01', mood::text, moods::text[], (pair).n,
                                        (pair).label FROM t""").fetchone()
            assert row == (Decimal(1), True, "sad", ["sad", "happy"], 7, "x y")
            if "citext" in extensions:
                assert cur.execute("SELECT name = 'ärger' FROM t").fetchone() == (True,)
            if "hstore" in extensions:
                hstore_row = cur.execute("SELECT attrs -> 'a', attrs ? 'b', attrs -> 'b' FROM t").fetchone()
                assert hstore_row == ("1", True, None)
    assert {column.dest_name: column.input_type for column in columns}["amount"] == "numeric(1,0)"


def test_a_pre_created_table_of_user_types_replicates_and_a_refused_value_fails_the_batch(pipeline) -> None:
    from cdc_pipeline.ops.cli import main

    with_citext = has_extension(pipeline.dest_dsn, "citext")
    pipeline.source([
        """CREATE TABLE items (id INT PRIMARY KEY, mood ENUM('happy', 'sad', 'angry'), price DECIMAL(10,2),
                               name VARCHAR(50), tags SET('a', 'b', 'c'))""",
        "INSERT INTO items VALUES (1, 'happy', 9.99, 'Alice', 'a,c'), (2, 'sad', 0.01, 'BOB', ''), "
        "(3, NULL, NULL, NULL, NULL)",
    ])
    def in_schema(name: str) -> sql.Identifier:
        return sql.Identifier(pipeline.source_db, name)

    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        if with_citext:
            conn.execute("CREATE EXTENSION citext")
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(pipeline.source_db)))
        conn.execute(sql.SQL("CREATE TYPE {} AS ENUM ('happy', 'sad')").format(in_schema("mood")))
        conn.execute(sql.SQL("CREATE TYPE {} AS ENUM ('a', 'b', 'c')").format(in_schema("tag")))
        conn.execute(sql.SQL("CREATE DOMAIN {} AS numeric(10,2) CHECK (VALUE > 0)").format(in_schema("price")))
        conn.execute(sql.SQL("CREATE TABLE {} (id integer PRIMARY KEY, mood {}, price {}, name {}, tags {}[])").format(
            in_schema("items"), in_schema("mood"), in_schema("price"), sql.SQL("citext" if with_citext else "text"),
            in_schema("tag")))
    types_before = column_types(pipeline)

    pipeline.sync()

    assert column_types(pipeline) == types_before, "the destination keeps the types its owner chose"
    rows = pipeline.dest_query(sql.SQL("SELECT id, mood::text, price, name::text, tags::text[] FROM {} ORDER BY id")
                               .format(sql.Identifier(pipeline.source_db, "items")))
    assert rows == [(1, "happy", Decimal("9.99"), "Alice", ["a", "c"]), (2, "sad", Decimal("0.01"), "BOB", []),
                    (3, None, None, None, None)]
    if with_citext:
        found = pipeline.dest_query(sql.SQL("SELECT id FROM {} WHERE name = 'bob'").format(
            sql.Identifier(pipeline.source_db, "items")))
        assert found == [(2,)]

    pipeline.source(["INSERT INTO items VALUES (4, 'sad', 1.00, 'carol', 'b')",
                     "INSERT INTO items VALUES (5, 'angry', 2.00, 'dave', 'b')",
                     "UPDATE items SET price = 5.00 WHERE id = 1"])
    assert main(["sync", pipeline.name]) == 1

    error = pipeline.dest_query("SELECT last_error FROM cdc.connector_state WHERE connector = %s",
                                (pipeline.name,))[0][0]
    assert f"connector '{pipeline.name}'" in error and f"table '{pipeline.source_db}.items'" in error
    assert "column 'mood'" in error and "'angry'" in error
    assert re.search(r"source type [^,]*\bstring io\.debezium\.data\.Enum\b", error)
    assert f"destination type {pipeline.source_db}.mood (an enum)" in error
    failed_at = re.search(r"'file': '(mariadb-bin\.\d+)', 'pos': '(\d+)', 'row': '(\d+)'", error)
    assert failed_at is not None, "the error names the source position of the refused value"
    ids = pipeline.dest_query(sql.SQL("SELECT id, price FROM {} ORDER BY id").format(
        sql.Identifier(pipeline.source_db, "items")))
    assert ids == [(1, Decimal("9.99")), (2, Decimal("0.01")), (3, None)], "nothing of the failed batch is applied"

    with psycopg.connect(pipeline.dest_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER TYPE {} ADD VALUE 'angry'").format(sql.Identifier(pipeline.source_db, "mood")))
    pipeline.sync()

    rows = pipeline.dest_query(sql.SQL("SELECT id, mood::text, price FROM {} WHERE id IN (1, 4, 5) ORDER BY id")
                               .format(sql.Identifier(pipeline.source_db, "items")))
    assert rows == [(1, "happy", Decimal("5.00")), (4, "sad", Decimal("1.00")), (5, "angry", Decimal("2.00"))]
    last_applied = pipeline.dest_query("SELECT source_position FROM cdc.applied_positions WHERE connector = %s",
                                       (pipeline.name,))[0][0]
    assert failed_at[1] == last_applied["file"] and int(failed_at[2]) < int(last_applied["pos"]), \
        "the error names the event with the refused value, not the last event of its batch"


def column_types(pipeline) -> dict[str, str]:
    rows = pipeline.dest_query(
        """SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
           WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum""",
        (f'"{pipeline.source_db}"."items"',))
    return dict(rows)


def copy_error(dsn: str, table: str, columns, lines: list[str]) -> psycopg.Error:
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        with pytest.raises(psycopg.Error) as caught:
            with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(
                    sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(c.dest_name) for c in columns))) as copy:
                copy.write("".join(line + "\n" for line in lines))
    return caught.value


def test_a_refused_value_is_traced_to_its_column_event_and_source_position(dest_dsn: str) -> None:
    with psycopg.connect(dest_dsn, autocommit=True) as conn:
        conn.execute("CREATE DOMAIN code AS varchar(300) CHECK (VALUE NOT LIKE 'bad%')")
        conn.execute("CREATE DOMAIN amount AS numeric(12,2) NOT NULL")
        conn.execute("CREATE TABLE t (id integer, code code, amount amount)")
        with conn.cursor() as cur:
            destination = destination_table(cur, "public", "t")
    assert destination is not None
    fields = [field("id", "int32"), field("code", "string"),
              field("amount", "string", "org.apache.kafka.connect.data.Decimal")]
    columns = plan_columns(fields, destination.columns, str, connector="c", table="db.t", dest_types=destination.types)
    long_bad = "bad" + "x\ty" * 60
    events = [(10, "c", {"id": "1", "code": "fine", "amount": "1.50"}),
              (11, "u", {"id": "2", "code": long_bad, "amount": "2.00"}),
              (12, "c", {"id": "3", "code": "ok", "amount": None}),
              (13, "c", {"id": "4", "code": long_bad, "amount": "4.00"})]
    schema = T.StructType([
        T.StructField("seq", T.LongType()), T.StructField("op", T.StringType()),
        T.StructField("source_table", T.StringType()), T.StructField("before", _STRING_MAP),
        T.StructField("after", _STRING_MAP), T.StructField("source", _STRING_MAP)])
    frame = get_spark().createDataFrame(
        [(seq, op, "db.t", None, after, {"file": "bin.000007", "pos": str(seq * 100), "row": "0"})
         for seq, op, after in events], schema)
    lines = [row.line for row in frame.orderBy("seq").select(copy_line("after", columns).alias("line")).collect()]
    refs = {seq: event_ref({"seq": seq, "kind": DATA_CHANGE, "op": op, "table": "db.t",
                            "source": {"file": "bin.000007", "pos": seq * 100, "row": 0}})
            for seq, op, _ in events}

    refused = apply_error(copy_error(dest_dsn, "t", columns, lines), frame, columns, connector="c", table="db.t",
                          target="public.t", seqs=(10, 13), position={"pos": "1300"}, refs=refs)
    assert refused.connector == "c" and refused.table == "db.t"
    assert refused.position == {"file": "bin.000007", "pos": "1100", "row": "0"}
    assert "column 'code' (source type string, destination type code (a domain over character varying(300)))" \
        in refused.message
    assert "(cut short) of event 11 of the batch (op u) and later ones" in refused.message
    assert 'violates check constraint "code_check"' in refused.message

    null_refused = apply_error(copy_error(dest_dsn, "t", columns, [lines[0], lines[2]]), frame, columns,
                               connector="c", table="db.t", target="public.t", seqs=(10, 13), position=None,
                               refs=refs)
    assert "column 'amount'" in null_refused.message
    assert "the value NULL of event 12 of the batch" in null_refused.message
    assert null_refused.position == {"file": "bin.000007", "pos": "1200", "row": "0"}
