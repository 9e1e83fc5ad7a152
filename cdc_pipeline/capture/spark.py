"""The Spark session the pipeline runs on, with the Debezium runner on the driver classpath."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from py4j.protocol import Py4JNetworkError
from pyspark import SparkConf, SparkContext
from pyspark.sql import DataFrame, SparkSession

from cdc_pipeline.capture import jvm_archive, spark_home
from cdc_pipeline.config import DRIVER_MEMORY, THIRD_PARTY_WARNINGS_ENV, SparkConfig
from cdc_pipeline.errors import RunnerError
from cdc_pipeline.capture.runner import JAVA_PACKAGE, FetchedBatch, executor_jars, java_class, runner_classpath

log = logging.getLogger(__name__)

_ENGINE_CONFIG_LOGGER = "io.debezium.embedded"

DEFAULT_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
    # Compiled code kept per JVM: a group's steps compile one filter and one projection per table version, and a
    # schema of hundreds of tables would evict them from Spark's default of 100 every group.
    "spark.sql.codegen.cache.maxEntries": "2000",
}


DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
# The driver JVM lives for one run (seconds to minutes) on a few cores: the client compiler alone and the serial
# collector cost far less CPU than C2's compilations and G1's threads return in so short a life (docs/decisions.md,
# "The driver JVM's compiler and collector"). Options of the connectors file's spark.driver.extraJavaOptions come
# after these, so the JVM takes theirs (a collector they select replaces ours); executors of a cluster keep their own.
#
# A driver out of heap ends at once (exit code 3) rather than go on with a thread of Spark's or Debezium's dead: the
# run then fails naming what it was doing and the setting to raise (`driver_death`), where it could hang.
DRIVER_JIT_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError"
DRIVER_CLASSPATH = "spark.driver.extraClassPath"
JARS = "spark.jars"
APP_NAME = "cdc-pipeline"


# A JVM refuses to start with two collectors selected, so a collector the connectors file names replaces ours.
_COLLECTOR_OPTION = re.compile(r"-XX:\+Use\w*GC\b")


def _driver_jit_options(given: str | None) -> str:
    """DRIVER_JIT_OPTIONS, without the serial collector when `given` (the file's options) selects a collector."""
    if given and _COLLECTOR_OPTION.search(given):
        return _COLLECTOR_OPTION.sub("", DRIVER_JIT_OPTIONS).strip()
    return DRIVER_JIT_OPTIONS


def spark_settings(spark: SparkConfig | None = None, conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole Spark configuration of a run: the pipeline's defaults, the connectors file's `spark:` section (its
    master and conf), `conf`, and what the pipeline adds to them: the runner's jars on the driver classpath (set when
    the driver JVM starts), the jars executors need (`spark.jars`: the runner's COPY writers and the two JDBC
    drivers, so any master works), the driver's compiler and collector (`DRIVER_JIT_OPTIONS`, before any given
    options, which win) and the class archive's JVM options (a shorter start).

    The CLI and Dagster's Spark resource both start their session from it. Raises RunnerError when the runner is
    not built."""
    spark = spark or SparkConfig()
    jars = runner_classpath()
    settings = {**DEFAULT_CONF, DRIVER_MEMORY: f"{spark.default_driver_memory_mb}m", "spark.master": spark.master,
                "spark.app.name": APP_NAME, **spark.conf, **(conf or {})}
    given = settings.get(DRIVER_JAVA_OPTIONS)
    settings[DRIVER_JAVA_OPTIONS] = " ".join(part for part in (_driver_jit_options(given), given) if part)
    additions = {
        DRIVER_CLASSPATH: (os.pathsep.join(str(jar) for jar in jars), os.pathsep),
        JARS: (",".join(str(jar) for jar in executor_jars()), ","),
        # The driver JVM maps the class archive built by `cdc-pipeline jvm-archive`, if there is one.
        DRIVER_JAVA_OPTIONS: (jvm_archive.java_options(jars), " "),
    }
    for key, (value, separator) in additions.items():
        if value:
            settings[key] = separator.join(part for part in (settings.get(key), value) if part)
    return settings


def build_spark_session(spark: SparkConfig | None = None, *, conf: Mapping[str, str] | None = None) -> SparkSession:
    """Returns the Spark session for the pipeline (`spark_settings`), starting it if this process runs none.

    Works with any master; only the driver runs Debezium. When a session already runs in this process it is
    reused: the driver classpath can only be set when the JVM starts.
    """
    return _session_of(spark_settings(spark, conf))


def _launch_environment(settings: Mapping[str, str]) -> None:
    """What the driver JVM PySpark launches next is started with: a local master's address, and the driver's Spark
    home (`spark_home`: Spark without MLlib, whose session extension costs a second of every start)."""
    if settings["spark.master"].startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if SparkContext._gateway is None:
        spark_home.use()


def _session_of(settings: Mapping[str, str]) -> SparkSession:
    _LAUNCHED.setdefault(DRIVER_MEMORY, settings.get(DRIVER_MEMORY, ""))
    _launch_environment(settings)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    return prepare_session(builder.getOrCreate())


# What the driver JVM of this process was started with (its heap), for the error of its death.
_LAUNCHED: dict[str, str] = {}
# What each thread of the run asks of the JVM now (`working_on`), named by the error of its death.
_WORK: dict[int, str] = {}
# The exit codes of a driver JVM out of heap: Spark's on an OutOfMemoryError in a task (SparkExitCode.OOM), the
# JVM's under -XX:+ExitOnOutOfMemoryError.
OUT_OF_MEMORY_EXIT_CODES = (52, 3)


@contextmanager
def working_on(what: str) -> Iterator[None]:
    """Names the work of this thread that uses the driver JVM (a group's tables and events, a load's chunks): an
    error of the JVM's death names it (`driver_death`)."""
    thread = threading.get_ident()
    before = _WORK.get(thread)
    _WORK[thread] = what
    try:
        yield
    finally:
        if before is None:
            _WORK.pop(thread, None)
        else:
            _WORK[thread] = before


# py4j loses its connection as soon as the dying JVM closes its sockets, before the process has ended: an error of a
# lost connection waits this long for the process's exit code.
DEATH_WAIT_SECONDS = 10.0


def driver_exit_code(wait: float = 0.0) -> int | None:
    """The exit code of this process's driver JVM once it ended (waiting up to `wait` seconds for its end), else None
    (also when it runs elsewhere)."""
    process = getattr(SparkContext._gateway, "proc", None)
    if process is None:
        return None
    try:
        return process.wait(timeout=wait) if wait else process.poll()
    except subprocess.TimeoutExpired:
        return None


def _lost_connection(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from, is py4j's or the socket's lost connection to the JVM."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, (ConnectionError, Py4JNetworkError)):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def out_of_memory_advice(apply_batch_mb: int | None = None) -> str:
    """What to raise when the driver JVM runs out of heap."""
    heap = _LAUNCHED.get(DRIVER_MEMORY) or "Spark's default"
    return (f"raise spark.driver.memory (it was {heap}) in the connectors file's `spark: conf:`"
            + (f", or lower the connector's apply_batch_mb (it was {apply_batch_mb}), which sizes the stream's "
               "buffers" if apply_batch_mb is not None else "")
            + "; an updated row of tens of MB needs a heap of tens of times its size (docs/configuration.md, "
              "\"Memory\")")


def driver_death(error: BaseException, connector: str, apply_batch_mb: int | None = None) -> RunnerError | None:
    """The error to report instead of `error` when the driver JVM ended under it (py4j then says only "Connection
    refused"): how it ended (out of memory: what to raise), and what the run was doing. None while the JVM runs."""
    code = driver_exit_code(DEATH_WAIT_SECONDS if _lost_connection(error) else 0.0)
    if code is None:
        return None
    doing = "; and ".join(dict.fromkeys(_WORK.values()))
    while_doing = f" while {doing}" if doing else ""
    if code in OUT_OF_MEMORY_EXIT_CODES:
        return RunnerError(f"the Spark driver JVM ran out of memory{while_doing} and ended (exit code {code}): "
                           + out_of_memory_advice(apply_batch_mb), connector=connector)
    return RunnerError(f"the Spark driver JVM ended with exit code {code}{while_doing} ({type(error).__name__}: "
                       f"{str(error).strip()[:200]}); its log is above", connector=connector)


class SparkStart:
    """A Spark session on its way: the driver JVM is launched at once and the session is built in a background
    thread, so that what needs the JVM alone (the Debezium runner: its engine's start and schema snapshot take
    seconds) starts while Spark's context and SQL session are made, on the other core.

    Once the session is built, the thread runs a small job of the JVM alone (`_warm_up`): a run's first job pays
    for loading and compiling Spark's scheduler and task classes, about half a second of a core, which this moves off
    the first chunk or group, while the Debezium engine takes its schema snapshot.

    `_jvm` waits for the JVM only; `session()` for the whole session. A failure to start is raised by either.
    """

    def __init__(self, spark: SparkConfig | None = None, *, conf: Mapping[str, str] | None = None) -> None:
        self._settings = spark_settings(spark, conf)
        self._session: SparkSession | None = None
        self._error: BaseException | None = None
        self._jvm_ready = threading.Event()
        self._session_ready = threading.Event()
        self._thread = threading.Thread(target=self._start, name="spark-start", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            _launch_environment(self._settings)
            if SparkContext._gateway is None:
                conf = SparkConf()  # no JVM yet: the settings go to spark-submit, which launches it
                for key, value in self._settings.items():
                    conf.set(key, value)
                SparkContext._ensure_initialized(conf=conf)
            prepare_jvm(SparkContext._jvm)
            self._jvm_ready.set()
            self._session = _session_of(self._settings)
        except BaseException as exc:  # noqa: BLE001 - raised in the thread that waits for it
            self._error = exc
        finally:
            self._jvm_ready.set()
            self._session_ready.set()
        if self._session is not None:
            _warm_up(self._session)

    @property
    def _jvm(self) -> Any:
        """The driver JVM's view, once it runs (the session may still be on its way)."""
        self._jvm_ready.wait()
        jvm = SparkContext._jvm
        if jvm is None:
            self._thread.join()
            raise self._error or RuntimeError("the Spark driver JVM did not start")
        return jvm

    def session(self) -> SparkSession:
        """The Spark session, once built."""
        self._session_ready.wait()
        if self._error is not None:
            raise self._error
        assert self._session is not None
        return self._session


def _warm_up(session: SparkSession) -> None:
    """Runs a job of one task per core that only counts (no Python worker, no data): the scheduler's and the
    executor's classes are loaded and their first calls made. A run's own job may start meanwhile, and a session
    stopped under it ends it: its failure is no run's."""
    try:
        parallelism = session.sparkContext.defaultParallelism
        getattr(session._jvm, f"{JAVA_PACKAGE}.SourceChunkCopier").chunks(session._jsc, parallelism).count()
    except Exception as exc:  # noqa: BLE001 - a warm-up only
        log.debug("the Spark warm-up job did not run: %s", exc)


def prepare_session(session: SparkSession) -> SparkSession:
    """Sets the log levels of Spark and of the runner, and keeps third-party warnings quiet unless asked for; done
    again on a session already prepared, it changes nothing."""
    session.sparkContext.setLogLevel(os.environ.get("CDC_SPARK_LOG_LEVEL", "WARN"))
    prepare_jvm(session._jvm)
    return session


def prepare_jvm(jvm: Any) -> None:
    """The runner's log level, and third-party warnings kept quiet unless asked for: what the runner needs before
    its engine starts (also before the Spark session exists)."""
    set_runner_log_level(jvm, os.environ.get("CDC_RUNNER_LOG_LEVEL", "INFO"))
    if not os.environ.get(THIRD_PARTY_WARNINGS_ENV):
        # ANTLR's version warnings (Debezium's DDL parser against Spark's ANTLR runtime) say nothing a user can act on.
        getattr(jvm, f"{JAVA_PACKAGE}.QuietStderr").install()


def set_runner_log_level(jvm: Any, level: str) -> None:
    """Sets the log level of Debezium and the runner; an explicit level also gets past Spark's shell filter."""
    levels = java_class(jvm, "org.apache.logging.log4j.Level")
    log4j_level = levels.toLevel(level)
    configurator = java_class(jvm, "org.apache.logging.log4j.core.config.Configurator")
    for logger in ("io.debezium", "io.cdcpipeline"):
        configurator.setLevel(logger, log4j_level)
    if log4j_level.isLessSpecificThan(levels.INFO):
        # Debezium's embedded engine writes its whole configuration, passwords included, at DEBUG.
        configurator.setLevel(_ENGINE_CONFIG_LOGGER, levels.INFO)


def batch_dataframe(spark: SparkSession, batch: FetchedBatch) -> DataFrame:
    """The batch's data-change rows as a DataFrame (`ChangeBatch.rowType`: seq, schema, op, before, after), made on the
    JVM side from the runner's rows, which are Spark's own (`UnsafeRow`): nothing is parsed.

    The rows are spread over the default parallelism as an RDD: a local relation would be converted on the driver,
    one row at a time, by the optimizer, instead of in parallel tasks.
    """
    return rows_dataframe(spark, batch.data_rows(), batch.bytes)


# A task of a batch's rows holds about this many bytes of them at most (while rows are not larger): a task carries
# its rows, serialized, and the driver holds that copy and the task's own while it runs.
PARTITION_BYTES = 8 << 20


def rows_dataframe(spark: SparkSession, rows: Any, size: int = 0) -> DataFrame:
    """A DataFrame of a Java list of the runner's rows (`ChangeBatch.rowType`), over the default parallelism, or
    over more tasks when the rows hold more than PARTITION_BYTES a task (`size`: their bytes)."""
    count = rows.size()
    partitions = max(spark.sparkContext.defaultParallelism, min(count, -(-size // PARTITION_BYTES)))
    rdd = spark._jsc.parallelize(rows, partitions).rdd()
    row_type = java_class(spark._jvm, f"{JAVA_PACKAGE}.ChangeBatch").rowType()
    return DataFrame(spark._jsparkSession.internalCreateDataFrame(rdd, row_type, False), spark)


def collect_lines(frame: DataFrame) -> list[str]:
    """The values of a one-string-column DataFrame, collected in the JVM and handed to Python as one text.

    Much cheaper than `collect()`, which pickles a Row per value; the values must hold no newline (COPY text
    lines escape theirs).
    """
    jvm: Any = frame.sparkSession._jvm
    values = getattr(frame._jdf, "as")(java_class(jvm, "org.apache.spark.sql.Encoders").STRING()).collectAsList()
    if values.isEmpty():
        return []
    return java_class(jvm, "java.lang.String").join("\n", values).split("\n")
