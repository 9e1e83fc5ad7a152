"""The driver's Spark home: the Spark PySpark launches, linked as it is, without MLlib's jars."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cdc_pipeline.capture import spark_home

ML_JARS = ["spark-mllib_2.13-4.3.0.jar", "spark-mllib-local_2.13-4.3.0.jar", "breeze_2.13-2.1.0.jar",
           "breeze-macros_2.13-2.1.0.jar", "spire_2.13-0.18.0.jar", "spire-macros_2.13-0.18.0.jar",
           "spire-platform_2.13-0.18.0.jar", "spire-util_2.13-0.18.0.jar", "algebra_2.13-2.8.0.jar",
           "cats-kernel_2.13-2.8.0.jar", "arpack-3.2.0.jar", "arpack_combined_all-0.1.jar", "blas-3.2.0.jar",
           "lapack-3.2.0.jar", "JTransforms-3.1.jar", "JLargeArrays-1.5.jar"]
KEPT_JARS = ["spark-core_2.13-4.3.0.jar", "spark-sql_2.13-4.3.0.jar", "spark-catalyst_2.13-4.3.0.jar",
             "commons-math3-3.6.1.jar", "scala-library-2.13.18.jar", "spark-kubernetes_2.13-4.3.0.jar",
             "spark-yarn_2.13-4.3.0.jar", "spark-connect_2.13-4.3.0.jar", "blast-1.0.jar"]


@pytest.fixture
def source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "spark"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "spark-submit").write_text("#!/bin/sh\n")
    (home / "conf").mkdir()
    (home / "RELEASE").write_text("Spark 4.3.0\n")
    (home / "jars").mkdir()
    for name in [*ML_JARS, *KEPT_JARS]:
        (home / "jars" / name).write_bytes(b"PK")
    monkeypatch.setenv(spark_home.SPARK_HOME_ENV, str(home))
    monkeypatch.setenv(spark_home.CACHE_DIR_ENV, str(tmp_path / "cache"))
    return home


def test_the_driver_home_links_every_entry_and_every_jar_but_mllibs(source: Path):
    home = spark_home.driver_home()

    assert home.parent == source.parent / "cache" and home.name.startswith("spark-home-")
    assert sorted(path.name for path in home.iterdir()) == sorted([spark_home.MARKER, "RELEASE", "bin", "conf", "jars"])
    assert (home / "bin").resolve() == source / "bin" and (home / "bin" / "spark-submit").is_file()
    assert sorted(path.name for path in (home / "jars").iterdir()) == sorted(KEPT_JARS)
    assert all((home / "jars" / name).resolve() == source / "jars" / name for name in KEPT_JARS)
    assert [jar.name for jar in spark_home.spark_jars()] == sorted(KEPT_JARS)
    assert spark_home.driver_home() == home, "made once, then found"


def test_a_process_started_from_the_driver_home_uses_it_as_it_is(source: Path):
    home = spark_home.use()

    assert home is not None and os.environ[spark_home.SPARK_HOME_ENV] == str(home)
    # A child of the run inherits SPARK_HOME: the home names its source, and is not linked again.
    assert spark_home.source_home() == source
    assert spark_home.driver_home() == home
    assert [jar.name for jar in spark_home.spark_jars()] == sorted(KEPT_JARS)


def test_other_jars_make_another_home_and_the_oldest_go(source: Path):
    made = time.time() - 1000
    first = spark_home.driver_home()
    os.utime(first, (made, made))
    homes = [first]
    for number in range(spark_home.KEPT_HOMES + 1):
        (source / "jars" / f"extra-{number}.jar").write_bytes(b"PK")
        homes.append(spark_home.driver_home())
        os.utime(homes[-1], (made + number + 1, made + number + 1))

    assert len(set(homes)) == len(homes), "each set of jars has its own home"
    assert "extra-0.jar" in {path.name for path in (homes[-1] / "jars").iterdir()}
    remaining = sorted(path for path in first.parent.iterdir() if path.name.startswith("spark-home-"))
    assert len(remaining) == spark_home.KEPT_HOMES and homes[-1] in remaining and first not in remaining
    assert (source / "bin" / "spark-submit").is_file() and len(list((source / "jars").iterdir())) > len(KEPT_JARS), \
        "a home removed takes its links, not what they point at"


def test_a_home_that_cannot_be_made_leaves_spark_home_alone(source: Path, tmp_path: Path, monkeypatch, caplog):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv(spark_home.CACHE_DIR_ENV, str(blocked / "cache"))

    assert spark_home.use() is None
    assert os.environ[spark_home.SPARK_HOME_ENV] == str(source)
    assert "without MLlib could not be made" in caplog.text


def test_pysparks_own_jars_left_out_are_mllibs_alone(monkeypatch: pytest.MonkeyPatch):
    import pyspark

    monkeypatch.delenv(spark_home.SPARK_HOME_ENV, raising=False)
    jars = {jar.name for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    left_out = jars - {jar.name for jar in spark_home.spark_jars()}

    assert any(name.startswith("spark-mllib_") for name in left_out)
    assert all(any(name.startswith(prefix) for prefix in ("spark-mllib", "breeze", "spire", "algebra", "cats-kernel",
                                                          "arpack", "blas-", "lapack-", "JTransforms", "JLargeArrays"))
               for name in left_out), left_out
    assert any(name.startswith("spark-sql_") for name in jars - left_out)
