"""Object mapping rules with a real MariaDB source: mapped table, column and type names in CREATE, ALTER and DML,
transforms run in the destination, a failing transform, a reload that renames and retypes, the attribute view;
and a PostgreSQL source, whose tables derive from its events.

One MariaDB connector serves the module and its tests run in order, each going on from the state the one before
left.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import psycopg
import pytest


from cdc_pipeline.ops.cli import main
from cdc_pipeline.config import load_config
from cdc_pipeline.ops.row_counts import compare_row_counts
from tests.helpers.mariadb_source import Pipeline, new_pipeline

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def mapped(mariadb, destination_pg, spark, tmp_path_factory) -> Pipeline:
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield new_pipeline(mariadb, destination_pg, tmp_path_factory.mktemp("objmap"), monkeypatch)


def objmap(pipeline: Pipeline, *args: str) -> int:
    return main(["objmap", args[0], pipeline.name, *args[1:]])


def column_types(pipeline: Pipeline, schema: str, table: str) -> dict[str, str]:
    rows = pipeline.dest_query(
        """SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
           WHERE attrelid = to_regclass(format('%%I.%%I', %s::text, %s::text)) AND attnum > 0 AND NOT attisdropped
           ORDER BY attnum""", (schema, table))
    return dict(rows)


def table_exists(pipeline: Pipeline, schema: str, table: str) -> bool:
    return pipeline.dest_query("SELECT to_regclass(format('%%I.%%I', %s::text, %s::text)) IS NOT NULL",
                               (schema, table))[0][0]


def raised_by_ten_percent(value: Decimal | None) -> Decimal | None:
    return None if value is None else (value * Decimal("1.1")).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


def expected_staff(pipeline: Pipeline) -> list[tuple]:
    """The source's employees as the rules map them: name with a suffix, salary raised, the point's SRID and WKB."""
    rows = pipeline.mariadb.query("SELECT id, nm, age, salary, ST_SRID(loc), LOWER(HEX(ST_AsBinary(loc))), dept "
                                  "FROM employee ORDER BY id", database=pipeline.source_db)
    return [(id_, f"{nm}-x", age, raised_by_ten_percent(salary), None if wkb is None else f"{srid}:{wkb}", dept)
            for id_, nm, age, salary, srid, wkb, dept in rows]


def staff_rows(pipeline: Pipeline, table: str = "staff", name_column: str = "full_name") -> list[tuple]:
    return pipeline.dest_query(f"SELECT id, {name_column}, age, salary, loc, dept FROM hr.{table} ORDER BY id")


def test_rules_that_do_not_parse_are_refused_and_not_stored(mapped: Pipeline, capsys) -> None:
    assert objmap(mapped, "add", "column", f"{mapped.source_db}.employee", "x") == 2
    assert objmap(mapped, "add", "transform", f"{mapped.source_db}.employee.nm", "upper(%d); drop table x") == 2
    assert objmap(mapped, "add", "index", f"{mapped.source_db}.employee", "x") == 2

    errors = capsys.readouterr().err
    assert "is not a column (db.table.column)" in errors and "without ';'" in errors
    assert "unknown rule kind 'index'" in errors
    assert objmap(mapped, "list") == 0 and capsys.readouterr().out == ""


def test_names_types_and_transforms_apply_to_snapshot_stream_and_ddl(mapped: Pipeline, capsys) -> None:
    db = mapped.source_db
    mapped.source([
        """CREATE TABLE employee (id INT AUTO_INCREMENT PRIMARY KEY, nm VARCHAR(20) NOT NULL, age SMALLINT,
                                 salary DECIMAL(10,2), loc POINT, dept VARCHAR(10))""",
        "INSERT INTO employee VALUES (1, 'ann', 30, 100.00, ST_PointFromText('POINT(1 2)'), 'ops'), "
        "(2, 'bob', NULL, 12.50, NULL, 'it')",
        "CREATE TABLE notes (body VARCHAR(50), n INT)",
        "INSERT INTO notes VALUES ('a', 1), ('b', 2), ('c', 3)",
    ])
    for rule in (("table", f"{db}.employee", "hr.staff"), ("column", f"{db}.employee.nm", "full_name"),
                 ("datatype", f"{db}.employee.age", "bigint|0"), ("datatype", "point|false", "text|0"),
                 ("transform", f"{db}.employee.salary", "round(%d * 1.1, 2)"),
                 ("transform", f"{db}.employee.nm", "'%d' || '-x'"), ("transform", f"{db}.notes.body", "upper(%d)"),
                 ("transform", f"{db}.employee.loc", "%s || ':' || encode(%w, 'hex')")):
        assert objmap(mapped, "add", *rule) == 0

    mapped.sync()

    assert not table_exists(mapped, db, "employee")
    assert column_types(mapped, "hr", "staff") == {
        "id": "integer", "full_name": "character varying(20)", "age": "bigint", "salary": "numeric(10,2)",
        "loc": "text", "dept": "character varying(10)"}
    assert staff_rows(mapped) == expected_staff(mapped)
    assert staff_rows(mapped)[0][1:5] == (
        "ann-x", 30, Decimal("110.00"), "0:0101000000000000000000f03f0000000000000040")
    assert sorted(mapped.dest_rows("notes")) == [("A", 1), ("B", 2), ("C", 3)]

    mapped.source([
        "INSERT INTO employee VALUES (3, 'cy', 41, 7.77, ST_PointFromText('POINT(3 4)'), 'ops')",
        "UPDATE employee SET salary = 200.00, nm = 'anne' WHERE id = 1",
        "DELETE FROM employee WHERE id = 2",
        "ALTER TABLE employee ADD COLUMN bonus INT",
        "INSERT INTO employee VALUES (4, 'di', 25, 50.00, NULL, 'it', 7)",
        "UPDATE notes SET n = 20 WHERE body = 'b'",
        "DELETE FROM notes WHERE body = 'c'",
        "INSERT INTO notes VALUES ('d', 4)",
    ])
    summary = mapped.sync()

    assert (summary["inserts"], summary["updates"], summary["deletes"], summary["ddls"]) == (3, 2, 2, 1)
    assert column_types(mapped, "hr", "staff")["bonus"] == "integer"
    assert staff_rows(mapped) == expected_staff(mapped)
    assert mapped.dest_query("SELECT bonus FROM hr.staff WHERE id = 4") == [(7,)]
    assert sorted(mapped.dest_rows("notes")) == [("A", 1), ("B", 20), ("D", 4)]

    attributes = mapped.dest_query(
        """SELECT source_table, source_column, source_type, dest_schema, dest_table, dest_column, dest_type, transform
           FROM cdc.objmap_attributes WHERE connector = %s ORDER BY source_table, position""", (mapped.name,))
    assert attributes[:2] == [
        (f"{db}.employee", "id", "INT", "hr", "staff", "id", "integer", None),
        (f"{db}.employee", "nm", "VARCHAR", "hr", "staff", "full_name", "character varying(20)", "'%d' || '-x'"),
    ]
    assert (f"{db}.employee", "loc", "POINT", "hr", "staff", "loc", "text",
            "%s || ':' || encode(%w, 'hex')") in attributes
    assert (f"{db}.employee", "bonus", "INT", "hr", "staff", "bonus", "integer", None) in attributes
    assert (f"{db}.notes", "body", "VARCHAR", db, "notes", "body", "character varying(50)", "upper(%d)") in attributes
    assert objmap(mapped, "show") == 0
    shown = capsys.readouterr().out
    assert f"{db}.employee.salary DECIMAL -> hr.staff.salary numeric(10,2)  transform round(%d * 1.1, 2)" in shown
    # The row-count check names tables as the applier does: by the table rules.
    config = load_config(mapped.config_path)
    counts = compare_row_counts(config.connector(mapped.name), config.destination)
    assert {(count.source_table, count.destination_table, count.matches) for count in counts} == {
        (f"{db}.employee", "hr.staff", True), (f"{db}.notes", f"{db}.notes", True)}


def test_a_failing_transform_fails_the_batch_with_column_value_and_position(mapped: Pipeline) -> None:
    db = mapped.source_db
    mapped.source(["CREATE TABLE ratio (id INT PRIMARY KEY, d INT)", "INSERT INTO ratio VALUES (1, 4), (2, 0)",
                   "UPDATE employee SET dept = 'sales' WHERE id = 3"])
    assert objmap(mapped, "add", "transform", f"{db}.ratio.d", "100 / %d") == 0

    assert main(["sync", mapped.name]) == 1

    error = mapped.dest_query("SELECT last_error FROM cdc.connector_state WHERE connector = %s", (mapped.name,))[0][0]
    assert "the transform '100 / %d' of column 'd'" in error and "failed on the value '0'" in error
    assert "division by zero" in error and f"connector '{mapped.name}'" in error
    assert f"table '{db}.ratio'" in error and "'file': 'mariadb-bin." in error
    assert not table_exists(mapped, db, "ratio") or mapped.dest_rows("ratio") == [], "the batch was rolled back"
    assert mapped.dest_query("SELECT dept FROM hr.staff WHERE id = 3") == [("ops",)], "nothing after it applied"

    # Under the skip strategy the event whose transform fails is set aside; the rest of the batch applies.
    mapped.write_config(error_strategy="skip")
    assert main(["sync", mapped.name]) == 0
    assert mapped.dest_rows("ratio") == [(1, 25)]
    assert mapped.dest_query("SELECT dept FROM hr.staff WHERE id = 3") == [("sales",)]
    letters = mapped.dest_query("SELECT error FROM cdc.dead_letters WHERE connector = %s AND status = 'pending'",
                                (mapped.name,))
    assert len(letters) == 1 and "division by zero" in letters[0][0]

    assert objmap(mapped, "del", "transform", f"{db}.ratio.d") == 0
    assert main(["dead-letters", "retry", mapped.name]) == 0
    assert mapped.dest_rows("ratio") == [(1, 25), (2, 0)], "the dead letter applied once the rule is gone"
    mapped.write_config()


def test_reload_renames_the_table_and_a_column_and_retypes_with_the_data_kept(mapped: Pipeline) -> None:
    db = mapped.source_db
    before = staff_rows(mapped)
    for rule in (("table", f"{db}.employee", "hr.personnel"), ("column", f"{db}.employee.nm", "name_text"),
                 ("datatype", f"{db}.employee.age", "integer|0")):
        assert objmap(mapped, "add", *rule) == 0
    with psycopg.connect(mapped.dest_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE hr.personnel (id integer)")

    assert objmap(mapped, "reload") == 2, "a rename onto an existing table is refused"
    assert column_types(mapped, "hr", "staff")["full_name"] == "character varying(20)", "and nothing changed"

    with psycopg.connect(mapped.dest_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE hr.personnel")
    assert objmap(mapped, "reload") == 0

    assert not table_exists(mapped, "hr", "staff")
    assert column_types(mapped, "hr", "personnel") == {
        "id": "integer", "name_text": "character varying(20)", "age": "integer", "salary": "numeric(10,2)",
        "loc": "text", "dept": "character varying(10)", "bonus": "integer"}
    assert staff_rows(mapped, "personnel", "name_text") == before
    assert mapped.dest_query(
        """SELECT dest_table, dest_column, dest_type FROM cdc.objmap_attributes
           WHERE connector = %s AND source_column IN ('nm', 'age') ORDER BY position""", (mapped.name,)) == [
        ("personnel", "name_text", "character varying(20)"), ("personnel", "age", "integer")]

    mapped.source("INSERT INTO employee VALUES (5, 'eve', 52, 10.00, NULL, 'hr', NULL)")
    mapped.sync()

    assert staff_rows(mapped, "personnel", "name_text") == expected_staff(mapped)


def test_a_postgresql_source_table_derived_from_its_events_follows_the_rules(pg_pipeline) -> None:
    db = pg_pipeline.source_db
    pg_pipeline.source(["CREATE TABLE items (id integer PRIMARY KEY, name text NOT NULL, price numeric(12,2))",
                        "INSERT INTO items VALUES (1, 'pen', 1.50), (2, 'ink', 12.00)"])
    for rule in (("table", f"{db}.public.items", "sales.goods"), ("column", "public.items.name", "title"),
                 ("datatype", "public.items.price", "text|0"), ("transform", "public.items.name", "upper(%d)")):
        assert main(["objmap", "add", pg_pipeline.name, *rule]) == 0

    pg_pipeline.sync()
    pg_pipeline.source(["ALTER TABLE items ADD COLUMN qty integer", "INSERT INTO items VALUES (3, 'cap', 3.25, 7)",
                        "UPDATE items SET name = 'pencil' WHERE id = 1"])
    pg_pipeline.sync()

    with psycopg.connect(pg_pipeline.dest_dsn) as conn:
        columns = conn.execute(
            """SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
               WHERE attrelid = 'sales.goods'::regclass AND attnum > 0 AND NOT attisdropped
               ORDER BY attnum""").fetchall()
        rows = conn.execute("SELECT id, title, price, qty FROM sales.goods ORDER BY id").fetchall()
        attributes = conn.execute(
            """SELECT source_table, source_column, dest_schema, dest_table, dest_column, dest_type, transform
               FROM cdc.objmap_attributes WHERE connector = %s ORDER BY position""", (pg_pipeline.name,)).fetchall()
    assert columns == [("id", "integer"), ("title", "text"), ("price", "text"), ("qty", "integer")]
    assert rows == [(1, "PENCIL", "1.50", None), (2, "INK", "12.00", None), (3, "CAP", "3.25", 7)]
    assert attributes[1] == ("public.items", "name", "sales", "goods", "title", "text", "upper(%d)")
    assert [row[4] for row in attributes] == ["id", "title", "price", "qty"]
