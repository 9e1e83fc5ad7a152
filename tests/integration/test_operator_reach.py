"""What the operator role (`destination.operator_role`) cannot reach: code of its own run as the pipeline's writer
through name resolution, and the replicated values the control schema holds."""

from __future__ import annotations

import psycopg
import pytest

pytestmark = pytest.mark.integration


def _operator(pipeline) -> tuple[str, str]:
    role = f"op_{pipeline.name}"
    pipeline.destination.execute([f"CREATE ROLE {role} LOGIN"])
    pipeline.write_config(destination={"operator_role": role})
    return role, pipeline.destination.dsn(pipeline.dest_db, user=role)


def test_a_function_an_operator_defines_never_runs_as_the_writer(pipeline):
    role, operator_dsn = _operator(pipeline)
    # What every role may do in public on PostgreSQL 14 and older.
    pipeline.destination.execute([f"GRANT CREATE ON SCHEMA public TO {role}"], dbname=pipeline.dest_db)
    pipeline.source(["CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(40))", "INSERT INTO t VALUES (1, 'x')"])
    pipeline.sync()
    with psycopg.connect(operator_dsn, autocommit=True) as operator:
        operator.execute("CREATE TABLE public.ran_as (who text)")
        operator.execute("GRANT INSERT ON public.ran_as TO PUBLIC")
        # A closer match for upper(varchar) than pg_catalog.upper(text), found wherever public is in the path.
        operator.execute("CREATE FUNCTION public.upper(character varying) RETURNS text LANGUAGE sql AS "
                         "$$ INSERT INTO public.ran_as VALUES (current_user); SELECT 'mine' $$")
        operator.execute("INSERT INTO cdc.objmap (connector, kind, source_object, destination_object) VALUES "
                         "(%s, 'transform', %s, 'upper(%%d)')", (pipeline.name, f"{pipeline.source_db}.t.v"))
    try:
        pipeline.source("INSERT INTO t VALUES (2, 'y')")
        pipeline.sync()
        assert pipeline.dest_query("SELECT who FROM public.ran_as") == [], "the operator's function ran"
        assert pipeline.dest_rows("t") == [(1, "x"), (2, "Y")], "upper is the catalog's"
    finally:
        pipeline.destination.execute([f"DROP OWNED BY {role}", f"DROP ROLE {role}"], dbname=pipeline.dest_db)


def test_an_operator_reads_the_state_but_no_replicated_value(pipeline):
    role, operator_dsn = _operator(pipeline)
    pipeline.source(["CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(40))", "INSERT INTO t VALUES (1, 'x')"])
    pipeline.sync()
    # A value the destination refuses: the run fails and its error names the value.
    pipeline.destination.execute([f'ALTER TABLE "{pipeline.source_db}".t ADD CHECK (v <> \'private-4821\')'],
                                 dbname=pipeline.dest_db)
    pipeline.source("INSERT INTO t VALUES (2, 'private-4821')")
    with pytest.raises(Exception):
        pipeline.sync()
    assert "private-4821" in pipeline.dest_query("SELECT last_error FROM cdc.connector_state")[0][0]
    try:
        with psycopg.connect(operator_dsn, autocommit=True) as operator:
            state = operator.execute("SELECT connector, state, stage, updated_at FROM cdc.connector_state").fetchall()
            assert [row[0] for row in state] == [pipeline.name]
            operator.execute("SELECT connector, source_table, estimated_rows, planned, finished_at "
                             "FROM cdc.bulk_load_tables").fetchall()
            for statement in ("SELECT last_error FROM cdc.connector_state", "SELECT * FROM cdc.connector_state",
                              "SELECT next_lower FROM cdc.bulk_load_tables"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    operator.execute(statement)
    finally:
        pipeline.destination.execute([f"DROP OWNED BY {role}", f"DROP ROLE {role}"], dbname=pipeline.dest_db)
