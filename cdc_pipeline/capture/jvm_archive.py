"""A class-data-sharing archive of the driver JVM: the classes a run loads (Spark, the JSON parser, the runner,
Debezium's engine), parsed and verified once and mapped by every later run, so that each run's fixed start is
shorter (see "Spark" in docs/operations.md: the start of a Spark session and its first jobs).

The archive is built by `cdc-pipeline jvm-archive` (`make setup` runs it): a short JVM run that loads those
classes and dumps them when it exits (`-XX:ArchiveClassesAtExit`), written under a temporary name and renamed
once the run ended well, since a JVM refuses to start from a truncated archive. Runs use it only when its key
(the Java binary and every jar of the driver's classpath, with their sizes and times) matches; otherwise they
start as before. `CDC_JVM_ARCHIVE=off` turns it off; `CDC_JVM_ARCHIVE_DIR` moves it (default
`~/.cache/cdc-pipeline`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from cdc_pipeline.capture.spark_home import CACHE_DIR_ENV as ARCHIVE_DIR_ENV, cache_dir, files_key, spark_jars

ARCHIVE_ENV = "CDC_JVM_ARCHIVE"
# The JVM's CDS messages (classes it cannot archive, such as those of signed jars) are not the user's business.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
# Classes of the runner's dependencies a run loads after the session starts; loading them here puts them in.
_RUNNER_CLASSES = (
    "io.cdcpipeline.runner.DebeziumRunner", "io.cdcpipeline.runner.ChangeBatch",
    "io.cdcpipeline.runner.EventSerializer",
    "io.debezium.embedded.async.AsyncEmbeddedEngine", "io.cdcpipeline.runner.MariaDbRunnerConnector",
    "io.debezium.connector.postgresql.PostgresConnector", "org.apache.kafka.connect.json.JsonConverter",
    "org.postgresql.Driver", "org.mariadb.jdbc.Driver",
    # The bulk load's first job: Spark's JDBC source, the COPY writers and the source-reading copier, pgjdbc's COPY.
    "org.apache.spark.sql.execution.datasources.jdbc.JDBCRDD", "org.apache.spark.sql.execution.datasources.jdbc.JDBCRelation",
    "org.apache.spark.sql.execution.datasources.jdbc.JdbcUtils", "org.apache.spark.sql.jdbc.MySQLDialect",
    "io.cdcpipeline.runner.ChunkCopyWriter", "io.cdcpipeline.runner.SourceChunkCopier",
    "io.cdcpipeline.runner.StageCopyWriter",
    "io.cdcpipeline.runner.CopyFeeder", "org.postgresql.copy.CopyManager", "org.postgresql.core.v3.CopyInImpl",
)
# A CREATE TABLE parsed by Debezium's DDL parser, as a MariaDB/MySQL engine's schema snapshot parses its tables: the
# parser's classes are the largest set a run loads (about 700; 0.3 s of one core, cold).
_DDL = "CREATE TABLE t (id INT PRIMARY KEY, name VARCHAR(64) DEFAULT NULL, amount DECIMAL(12,2), created DATETIME(3))"


def enabled() -> bool:
    return os.environ.get(ARCHIVE_ENV, "on").lower() not in ("off", "0", "false", "no")


def archive_path(classpath: list[Path]) -> Path:
    """Where the archive for this Java and this driver classpath lives (its name is their key)."""
    # The java Spark launches: $JAVA_HOME's, else the one on the PATH.
    java_home = os.environ.get("JAVA_HOME")
    java_path = Path(f"{java_home}/bin/java" if java_home else shutil.which("java") or "java").resolve()
    return cache_dir() / f"driver-{files_key([java_path, *classpath, *spark_jars()])}.jsa"


def java_options(classpath: list[Path]) -> str:
    """The driver JVM's options that map the archive, or '' when there is none for this classpath (or it is off)."""
    if not enabled():
        return ""
    archive = archive_path(classpath)
    return f"-XX:SharedArchiveFile={archive} {_QUIET}" if archive.is_file() else ""


def build(timeout_seconds: float = 600) -> tuple[Path, float]:
    """Builds the archive for the current classpath in a child process; returns its path and the seconds taken."""
    from cdc_pipeline.capture.runner import runner_classpath

    archive = archive_path(runner_classpath())
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "cdc_pipeline.capture.jvm_archive", str(partial)], capture_output=True,
                              text=True, timeout=timeout_seconds)
        if done.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
            raise RuntimeError(f"building the JVM class archive failed (exit {done.returncode}): "
                               f"{done.stderr.strip()[-2000:]}")
        partial.replace(archive)
    finally:
        partial.unlink(missing_ok=True)
    _prune(archive.parent)
    return archive, time.monotonic() - started


KEPT_ARCHIVES = 3


def _prune(directory: Path) -> None:
    """Keeps the newest archives (other checkouts and builds each have their own key) and removes the rest: each
    is about 160 MB."""
    archives = sorted(directory.glob("driver-*.jsa"), key=lambda path: path.stat().st_mtime, reverse=True)
    for stale in archives[KEPT_ARCHIVES:]:
        stale.unlink(missing_ok=True)


def _load_classes(partial: str) -> None:
    """The child's work: a session started as runs start it, the kinds of Spark jobs a run has, the runner's
    classes; the JVM writes the archive when it exits."""
    from pyspark.sql import functions as F

    from cdc_pipeline.capture.spark import build_spark_session, rows_dataframe

    os.environ[ARCHIVE_ENV] = "off"
    spark = build_spark_session(conf={"spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={partial} {_QUIET}",
                                      "spark.app.name": "cdc-pipeline-jvm-archive"})
    jvm = spark._jvm
    # A group's rows as the runner hands them over (none: the plan's and the jobs' classes are what is loaded).
    rows = rows_dataframe(spark, jvm.java.util.ArrayList())
    rows.groupBy("op").agg(F.count("*"), F.concat_ws("\n", F.collect_list(F.col("after")["id"]))).collect()
    rows.select(F.to_json(F.struct("seq", "after"))).orderBy("seq").collect()
    for name in _RUNNER_CLASSES:
        jvm.java.lang.Class.forName(name)
    jvm.io.debezium.connector.mariadb.antlr.MariaDbAntlrDdlParser().parse(_DDL, jvm.io.debezium.relational.Tables())
    spark.stop()


if __name__ == "__main__":
    _load_classes(sys.argv[1])
