"""Unit tests for cdc_pipeline.sink.merge_round: which staged steps drop superseded changes, and a staged step's
merge statements (one DELETE for its deletes, one upsert per set of columns its changes leave out)."""

from __future__ import annotations

from collections import Counter

from psycopg import sql

from cdc_pipeline.convert.dml import ColumnPlan, converter_for
from cdc_pipeline.decode.events import FieldSpec
from cdc_pipeline.sink.merge_round import StagedStep, drop_superseded_sql, drops_superseded, merge_sql
from cdc_pipeline.sink.plan import DmlStep

STAGING = sql.Identifier("cdc", "_stage_x")


def _column(name: str, pg_type: str = "integer") -> ColumnPlan:
    spec = FieldSpec(name=name, type="int32", logical=None, parameters={}, optional=True)
    convert = converter_for(spec)
    assert convert is not None
    return ColumnPlan(name, name, pg_type, spec, convert)


def _step(*ops: str) -> DmlStep:
    return DmlStep("inventory.items", "schema-1", 1, len(ops), ops=Counter(ops))


def _staged(step: DmlStep, compacted_in_spark: bool) -> StagedStep:
    return StagedStep(step, None, [_column("id")], compacted_in_spark, STAGING)  # type: ignore[arg-type]


def test_only_a_step_with_changes_beyond_inserts_that_spark_did_not_compact_drops_superseded_changes() -> None:
    assert drops_superseded(_staged(_step("c", "u", "d"), compacted_in_spark=False))
    assert not drops_superseded(_staged(_step("c", "r", "c"), compacted_in_spark=False))
    assert not drops_superseded(_staged(_step("c", "u"), compacted_in_spark=True))


def test_a_steps_merge_deletes_once_and_upserts_once_per_set_of_columns_left_out() -> None:
    columns = [_column("id"), _column("n"), _column("note", "text")]
    statements = [statement.as_string() for statement in merge_sql(
        "app", "items", _step("u", "d", "u"), STAGING, 7, columns, columns[:1], {}, ["[]", '["note"]'])]
    assert len(statements) == 3
    assert statements[0].startswith(
        'DELETE FROM "app"."items" AS t USING "cdc"."_stage_x" AS s WHERE s."_cdc_step" = 7')
    assert '("id", "n", "note")' in statements[1] and "DO UPDATE SET \"n\" = EXCLUDED.\"n\", \"note\"" in statements[1]
    assert '("id", "n")' in statements[2] and '"note" = EXCLUDED' not in statements[2]


def test_a_merge_without_deletes_has_no_delete() -> None:
    columns = [_column("id"), _column("n")]
    statements = merge_sql("app", "items", _step("c", "u"), STAGING, 1, columns, columns[:1], {}, ["[]"])
    assert [statement.as_string().split()[0] for statement in statements] == ["INSERT"]


def test_superseded_changes_are_found_by_a_window_over_the_steps_staged_keys() -> None:
    columns = [_column("name", "text"), _column("id")]
    text = drop_superseded_sql(STAGING, 3, [columns[1]], columns).as_string()
    assert 'PARTITION BY "v2"' in text and '"_cdc_step" = 3' in text and "JOIN" not in text
