"""Unit tests for cdc_pipeline.sink.table_writes: names in statements with parameters, an upsert's action."""

from __future__ import annotations

from cdc_pipeline.sink.table_writes import on_conflict, param_identifier


def test_a_percent_in_a_name_reaches_psycopg_doubled_in_a_statement_with_parameters() -> None:
    assert param_identifier("app", "50% off").as_string() == '"app"."50%% off"'


def test_an_upsert_updates_the_written_columns_beside_the_key_or_does_nothing() -> None:
    assert on_conflict(["id"], ["id"]).as_string() == "DO NOTHING"
    assert on_conflict(["id", "n"], ["id"]).as_string() == 'DO UPDATE SET "n" = EXCLUDED."n"'
