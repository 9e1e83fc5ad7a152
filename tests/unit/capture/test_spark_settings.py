"""The Spark settings a run starts its session with: the connectors file's cluster plus what the pipeline adds."""

from __future__ import annotations

import os
import subprocess
from types import MappingProxyType

import pytest

from cdc_pipeline.capture.runner import executor_jars, runner_classpath
from cdc_pipeline.capture.spark import DEFAULT_CONF, DRIVER_JIT_OPTIONS, spark_settings
from cdc_pipeline.config import SparkConfig


def test_the_file_s_master_and_conf_win_over_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_JVM_ARCHIVE", "off")
    spark = SparkConfig(master="spark://10.0.0.5:7077",
                        conf=MappingProxyType({"spark.driver.memory": "6g", "spark.executor.memory": "4g"}))

    settings = spark_settings(spark)

    assert settings["spark.master"] == "spark://10.0.0.5:7077"
    assert settings["spark.driver.memory"] == "6g" and settings["spark.executor.memory"] == "4g"
    assert settings["spark.sql.session.timeZone"] == DEFAULT_CONF["spark.sql.session.timeZone"]
    assert settings["spark.driver.extraClassPath"] == os.pathsep.join(map(str, runner_classpath()))
    assert settings["spark.jars"] == ",".join(map(str, executor_jars()))
    assert settings["spark.driver.extraJavaOptions"] == DRIVER_JIT_OPTIONS


def test_the_pipeline_adds_its_jars_and_options_to_the_file_s_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_JVM_ARCHIVE", "off")
    spark = SparkConfig(master="local[2]", conf=MappingProxyType({
        "spark.jars": "/opt/udfs.jar", "spark.driver.extraClassPath": "/opt/agent.jar",
        "spark.driver.extraJavaOptions": "-Duser.timezone=UTC"}))

    settings = spark_settings(spark, {"spark.app.name": "a-test"})

    assert settings["spark.jars"] == ",".join(["/opt/udfs.jar", *map(str, executor_jars())])
    assert settings["spark.driver.extraClassPath"] == os.pathsep.join(["/opt/agent.jar", *map(str, runner_classpath())])
    assert settings["spark.driver.extraJavaOptions"] == f"{DRIVER_JIT_OPTIONS} -Duser.timezone=UTC"
    assert settings["spark.app.name"] == "a-test"


def test_the_file_s_compiler_and_collector_options_come_last_so_the_jvm_takes_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_JVM_ARCHIVE", "off")
    spark = SparkConfig(conf=MappingProxyType({"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=4 -XX:+UseG1GC"}))

    options = spark_settings(spark)["spark.driver.extraJavaOptions"].split()

    assert options.index("-XX:TieredStopAtLevel=4") > options.index("-XX:TieredStopAtLevel=1")
    # A JVM given two collectors does not start ("Multiple garbage collectors selected"): the file's replaces ours.
    assert "-XX:+UseG1GC" in options and "-XX:+UseSerialGC" not in options
    started = subprocess.run(["java", *options, "-version"], capture_output=True, text=True)
    assert started.returncode == 0, started.stderr


@pytest.mark.integration
def test_the_driver_jvm_runs_with_the_client_compiler_and_the_serial_collector(spark) -> None:
    jvm = spark._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    collectors = [bean.getName() for bean in jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()]

    assert "-XX:TieredStopAtLevel=1" in arguments
    assert collectors == ["Copy", "MarkSweepCompact"]


def test_the_spark_ui_is_turned_on_from_the_spark_section(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from cdc_pipeline.config import parse_config

    monkeypatch.setenv("CDC_JVM_ARCHIVE", "off")
    document = {"destination": {"dsn": "postgresql://u@h/d"}, "connectors": {"c": {
        "type": "mariadb", "hostname": "h", "user": "u", "password": "p", "database": "d"}}}

    off = spark_settings(parse_config(document, tmp_path / "c.yaml").spark)
    on = spark_settings(parse_config({**document, "spark": {"ui": True}}, tmp_path / "c.yaml").spark)
    moved = spark_settings(parse_config({**document, "spark": {"ui": True, "ui_port": 4050}}, tmp_path / "c.yaml").spark)
    conf_wins = spark_settings(SparkConfig(ui=True, conf=MappingProxyType({"spark.ui.port": "4099"})))

    assert off["spark.ui.enabled"] == "false"
    assert (on["spark.ui.enabled"], on["spark.ui.port"]) == ("true", "4040")
    assert moved["spark.ui.port"] == "4050" and conf_wins["spark.ui.port"] == "4099"


def test_the_driver_heap_is_sized_from_the_largest_group_of_the_file_s_connectors_unless_the_file_sets_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from cdc_pipeline.config import parse_config

    monkeypatch.setenv("CDC_JVM_ARCHIVE", "off")
    connector = {"type": "mariadb", "hostname": "h", "user": "u", "password": "p", "database": "d"}
    document = {"destination": {"dsn": "postgresql://u@h/d"}, "connectors": {"c": connector}}

    assert spark_settings(parse_config(document, tmp_path / "c.yaml").spark)["spark.driver.memory"] == "1536m"
    wide = {**document, "connectors": {"c": connector, "docs": {**connector, "database": "docs", "apply_batch_mb": 128}}}
    assert spark_settings(parse_config(wide, tmp_path / "c.yaml").spark)["spark.driver.memory"] == "2560m"
    set_by_file = {**wide, "spark": {"conf": {"spark.driver.memory": "6g"}}}
    assert spark_settings(parse_config(set_by_file, tmp_path / "c.yaml").spark)["spark.driver.memory"] == "6g"


def test_a_driver_out_of_heap_ends_at_once() -> None:
    assert "-XX:+ExitOnOutOfMemoryError" in DRIVER_JIT_OPTIONS.split()


def test_a_driver_jvm_that_ended_out_of_heap_is_reported_with_what_the_run_did_and_what_to_raise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from pyspark import SparkContext

    from cdc_pipeline.capture import spark as spark_module

    exit_code: list[int | None] = [None]
    # The code the process ends with while the error's handler waits for it (py4j loses its connection first).
    ending: list[int | None] = [None]

    def wait(timeout: float) -> int:
        code = exit_code[0] if exit_code[0] is not None else ending[0]
        if code is None:
            raise subprocess.TimeoutExpired("java", timeout)
        return code

    monkeypatch.setattr(SparkContext, "_gateway",
                        SimpleNamespace(proc=SimpleNamespace(poll=lambda: exit_code[0], wait=wait)))
    monkeypatch.setattr(spark_module, "DEATH_WAIT_SECONDS", 0.01)
    monkeypatch.setitem(spark_module._LAUNCHED, "spark.driver.memory", "1536m")
    refused = ConnectionRefusedError(111, "Connection refused")

    assert spark_module.driver_death(refused, "docs") is None  # the JVM runs: py4j's error stands
    ending[0] = 3
    assert "ran out of memory" in str(spark_module.driver_death(refused, "docs"))  # it ends just after the error
    assert spark_module.driver_death(ValueError("not the connection"), "docs") is None  # no wait for other errors
    ending[0] = None

    exit_code[0] = 52
    with spark_module.working_on("applying events 41-44 of app.docs"):
        error = spark_module.driver_death(refused, "docs", apply_batch_mb=64)
    assert error is not None and error.connector == "docs"
    text = str(error)
    assert "ran out of memory while applying events 41-44 of app.docs" in text
    assert "spark.driver.memory (it was 1536m)" in text and "apply_batch_mb (it was 64)" in text
    assert "Connection refused" not in text

    exit_code[0] = 137
    assert "ended with exit code 137" in str(spark_module.driver_death(refused, "docs"))
