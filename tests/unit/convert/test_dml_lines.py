"""Unit tests for cdc_pipeline.convert.dml_lines: the line Spark's tasks stage per change, built once per table
version, and shared by tables of one shape."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from cdc_pipeline.convert.dml import ColumnPlan, converter_for
from cdc_pipeline.convert.dml_lines import DmlLines, stage_line
from cdc_pipeline.decode.events import FieldSpec
from tests.helpers.spark import get_spark

_STRING_MAP = T.MapType(T.StringType(), T.StringType())


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return get_spark()


def _column(name: str, connect_type: str, pg_type: str) -> ColumnPlan:
    spec = FieldSpec(name=name, type=connect_type, logical=None, parameters={}, optional=True)
    convert = converter_for(spec)
    assert convert is not None
    return ColumnPlan(name, name, pg_type, spec, convert)


def test_a_staged_line_has_its_header_then_the_values_and_a_delete_only_its_key(spark: SparkSession) -> None:
    columns = [_column("id", "int32", "integer"), _column("note", "string", "text")]
    frame = spark.createDataFrame(
        [(5, "u", {"id": "1", "note": "old"}, {"id": "1", "note": "a\tb"}),
         (6, "d", {"id": "2", "note": "gone"}, None)],
        T.StructType([T.StructField("seq", T.LongType()), T.StructField("op", T.StringType()),
                      T.StructField("before", _STRING_MAP), T.StructField("after", _STRING_MAP)]))
    lines = [row.line for row in frame.select(stage_line(columns, columns[:1], None).alias("line")).collect()]
    assert lines == ["u\t0\t[]\t5\t1\ta\\tb", "d\t0\t[]\t6\t2\t\\N"]


def test_a_line_is_built_once_per_table_version(spark: SparkSession) -> None:
    lines = DmlLines()
    columns = [_column("id", "int32", "integer"), _column("note", "string", "text")]
    assert lines.stage(columns, columns[:1], None) is lines.stage(list(columns), columns[:1], None)
    assert lines.merge(columns, columns[:1], None) is not lines.stage(columns, columns[:1], None)


def test_tables_of_one_shape_share_one_staged_line(spark: SparkSession) -> None:
    lines = DmlLines()
    items = [_column("id", "int32", "integer"), _column("note", "string", "text")]
    orders = [_column("order_id", "int32", "integer"), _column("comment", "string", "text")]
    other_shape = [_column("id", "int32", "integer"), _column("blob", "bytes", "bytea")]
    _, items_text = lines.shared_stage(items, items[:1], None)
    _, orders_text = lines.shared_stage(orders, orders[:1], None)
    _, other_text = lines.shared_stage(other_shape, other_shape[:1], None)
    assert items_text == orders_text != other_text
