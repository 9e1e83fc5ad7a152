"""The driver JVM starts from the driver's Spark home: Spark without MLlib, whose session extension is not loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError

from cdc_pipeline.capture import spark_home


def test_the_driver_runs_spark_without_mllib(spark):
    jvm = spark._jvm
    home = Path(jvm.java.lang.System.getenv("SPARK_HOME"))
    classpath = jvm.java.lang.System.getProperty("java.class.path")

    assert (home / spark_home.MARKER).is_file()
    assert f"{home}/jars/spark-sql_" in classpath and "spark-mllib" not in classpath and "breeze" not in classpath
    with pytest.raises(Py4JJavaError, match="ClassNotFoundException"):
        jvm.java.lang.Class.forName("org.apache.spark.sql.ml.InternalFunctionRegistration")
    # The runner's classes and Spark's SQL functions are all there.
    assert spark.sql("SELECT concat_ws('-', 'a', 'b') AS v").collect()[0].v == "a-b"
    jvm.java.lang.Class.forName("io.cdcpipeline.runner.DebeziumRunner")
