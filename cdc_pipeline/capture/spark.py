"""The Spark session the pipeline runs on, with the Debezium runner on the driver classpath."""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from pyspark.sql import DataFrame, SparkSession

from cdc_pipeline.capture import jvm_archive
from cdc_pipeline.config import THIRD_PARTY_WARNINGS_ENV
from cdc_pipeline.capture.runner import JAVA_PACKAGE, FetchedBatch, executor_jars, runner_classpath

log = logging.getLogger(__name__)

_ENGINE_CONFIG_LOGGER = "io.debezium.embedded"

DEFAULT_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
}


DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
MASTER_ENV = "CDC_SPARK_MASTER"
DEFAULT_MASTER = "local[*]"


def default_master() -> str:
    """The Spark master runs use unless told otherwise: `CDC_SPARK_MASTER`, else local[*]."""
    return os.environ.get(MASTER_ENV) or DEFAULT_MASTER


def build_spark_session(master: str | None = None, conf: Mapping[str, str] | None = None,
                        app_name: str = "cdc-pipeline") -> SparkSession:
    """Returns the Spark session for the pipeline, starting it with the runner's jars on the driver classpath.

    Works with any master; only the driver runs Debezium; executors get the runner jar (its bulk snapshot writer)
    and the two JDBC drivers (`spark.jars`). When a session
    already runs in this process it is reused: the driver classpath can only be set when the JVM starts.
    """
    master = master or default_master()
    jars = runner_classpath()
    classpath = os.pathsep.join(str(jar) for jar in jars)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {**DEFAULT_CONF, **(conf or {})}
    archive_options = jvm_archive.java_options(jars)
    if archive_options:
        # The driver JVM maps the class archive (built by `cdc-pipeline jvm-archive`): a shorter start.
        settings[DRIVER_JAVA_OPTIONS] = f"{settings.get(DRIVER_JAVA_OPTIONS, '')} {archive_options}".strip()
    for key, value in settings.items():
        builder = builder.config(key, value)
    builder = builder.config("spark.driver.extraClassPath", classpath)
    # The bulk snapshot's tasks read the source and write the destination through JDBC, on whatever executors
    # the master gives: Spark ships these jars to them.
    builder = builder.config("spark.jars", ",".join(str(jar) for jar in executor_jars()))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("CDC_SPARK_LOG_LEVEL", "WARN"))
    set_runner_log_level(session, os.environ.get("CDC_RUNNER_LOG_LEVEL", "INFO"))
    if not os.environ.get(THIRD_PARTY_WARNINGS_ENV):
        # ANTLR's version warnings (Debezium's DDL parser against Spark's ANTLR runtime) say nothing a user can act on.
        getattr(session._jvm, f"{JAVA_PACKAGE}.QuietStderr").install()
    return session


def set_runner_log_level(session: SparkSession, level: str) -> None:
    """Sets the log level of Debezium and the runner; an explicit level also gets past Spark's shell filter."""
    jvm: Any = session._jvm
    log4j_level = jvm.org.apache.logging.log4j.Level.toLevel(level)
    configurator = jvm.org.apache.logging.log4j.core.config.Configurator
    for logger in ("io.debezium", "io.cdcpipeline"):
        configurator.setLevel(logger, log4j_level)
    if log4j_level.isLessSpecificThan(jvm.org.apache.logging.log4j.Level.INFO):
        # Debezium's embedded engine writes its whole configuration, passwords included, at DEBUG.
        configurator.setLevel(_ENGINE_CONFIG_LOGGER, jvm.org.apache.logging.log4j.Level.INFO)


def batch_dataframe(spark: SparkSession, batch: FetchedBatch) -> DataFrame:
    """A one-column (``line``) DataFrame of the batch's data-change lines, made on the JVM side from the Java list.

    The lines are spread over the default parallelism as an RDD: a local relation would be converted on the
    driver, one row at a time, by the optimizer, instead of in parallel tasks.
    """
    jvm: Any = spark._jvm
    rdd = spark._jsc.parallelize(batch.data_lines(), spark.sparkContext.defaultParallelism).rdd()
    dataset = spark._jsparkSession.createDataset(rdd, jvm.org.apache.spark.sql.Encoders.STRING())
    return DataFrame(dataset.toDF(), spark).withColumnRenamed("value", "line")


def collect_lines(frame: DataFrame) -> list[str]:
    """The values of a one-string-column DataFrame, collected in the JVM and handed to Python as one text.

    Much cheaper than `collect()`, which pickles a Row per value; the values must hold no newline (COPY text
    lines escape theirs).
    """
    jvm: Any = frame.sparkSession._jvm
    values = getattr(frame._jdf, "as")(jvm.org.apache.spark.sql.Encoders.STRING()).collectAsList()
    if values.isEmpty():
        return []
    return jvm.java.lang.String.join("\n", values).split("\n")
