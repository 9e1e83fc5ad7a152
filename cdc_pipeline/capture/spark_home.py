"""The driver's Spark home: the Spark PySpark launches (its own, or `SPARK_HOME`'s) without Spark's machine-learning
library (MLlib) and the jars only it uses.

Spark's SQL session loads every `SparkSessionExtensionsProvider` on the driver classpath when it is made, and MLlib
ships one: it registers MLlib's SQL functions through Scala reflection, which loads MLlib, Breeze and their math
libraries. On a cold driver JVM that is most of the session's start (0.9-1.0 s of 1.0-1.1 s on 2 cores, with the
class archive mapped), for functions the pipeline never calls. Nothing else in the driver reads those jars.

The home is a directory of links under the cache directory (`spark-home-<key>`, the key made of the source home and
its jars, with their sizes and times): every entry of the source home linked as it is, except `jars`, whose links
leave out MLlib's. PySpark launches the driver from it once `SPARK_HOME` names it (`use`). Executors of a cluster
run their own Spark home, untouched.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Iterable

log = logging.getLogger(__name__)

SPARK_HOME_ENV = "SPARK_HOME"
CACHE_DIR_ENV = "CDC_JVM_ARCHIVE_DIR"
# A file in each home this module makes: a SPARK_HOME naming one (a child process of a run inherits it) is used as it is.
MARKER = ".cdc-pipeline-driver-spark-home"
# MLlib and the jars only it uses (Breeze, Spire and its Typelevel libraries, the netlib BLAS/LAPACK/ARPACK
# wrappers, JTransforms), by artifact name.
LEFT_OUT = re.compile(r"^(spark-mllib(-local)?_[\d.]+|breeze(-macros)?_[\d.]+|spire(-[a-z]+)?_[\d.]+|algebra_[\d.]+"
                      r"|cats-kernel_[\d.]+|arpack(_combined_all)?|blas|lapack|JTransforms|JLargeArrays)-\d")
KEPT_HOMES = 5


def source_home() -> Path:
    """The Spark home PySpark would launch: `SPARK_HOME`'s when it names one (a home this module made names its
    source), else PySpark's own."""
    given = os.environ.get(SPARK_HOME_ENV)
    if given:
        home = Path(given)
        marker = home / MARKER
        return Path(marker.read_text().strip()) if marker.is_file() else home
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_jars(home: Path | None = None) -> list[Path]:
    """The Spark jars of the driver's classpath: those of `home` (default: the source home) that are kept."""
    jars_dir = (home or source_home()) / "jars"
    return [jar for jar in sorted(jars_dir.glob("*.jar")) if not LEFT_OUT.match(jar.name)]


def files_key(files: Iterable[Path], head: str = "") -> str:
    """20 hex digits naming `head` and these files as they are now: each by its path, size and modification time
    (a file that is not there counts as "missing"), so that a changed file makes another key."""
    parts = [head] if head else []
    for path in files:
        try:
            stat = path.stat()
            stamp = f"{stat.st_size}:{stat.st_mtime_ns}"
        except OSError:
            stamp = "missing"
        parts.append(f"{path.resolve()}:{stamp}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _key(home: Path) -> str:
    return files_key(sorted((home / "jars").glob("*.jar")), head=str(home.resolve()))


def cache_dir() -> Path:
    """Where the driver's Spark homes and the JVM class archives are kept."""
    return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "cdc-pipeline")


def driver_home() -> Path:
    """The driver's Spark home for the source home, made (and old ones removed) when it is not there yet. Raises
    OSError when it cannot be made."""
    source = source_home()
    home = cache_dir() / f"spark-home-{_key(source)}"
    if (home / MARKER).is_file():
        return home
    home.parent.mkdir(parents=True, exist_ok=True)
    partial = home.with_name(f"{home.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        for entry in sorted(source.iterdir()):
            if entry.name != "jars":
                (partial / entry.name).symlink_to(entry.resolve())
        (partial / "jars").mkdir()
        for jar in spark_jars(source):
            (partial / "jars" / jar.name).symlink_to(jar.resolve())
        (partial / MARKER).write_text(f"{source}\n")
        try:
            partial.rename(home)
        except OSError:
            if not (home / MARKER).is_file():  # not another process's home made meanwhile
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    _prune(home.parent, home)
    return home


def _prune(directory: Path, current: Path) -> None:
    """Keeps the newest homes (other checkouts and PySpark versions each have their own key)."""
    homes = sorted((path for path in directory.glob("spark-home-*")
                    if path != current and not path.name.endswith(".partial") and (path / MARKER).is_file()),
                   key=lambda path: path.stat().st_mtime, reverse=True)
    for stale in homes[KEPT_HOMES - 1:]:
        shutil.rmtree(stale, ignore_errors=True)


def use() -> Path | None:
    """Points `SPARK_HOME` at the driver's Spark home, so that the driver JVM PySpark launches next starts from it;
    returns it, or None (the source home kept, with a warning) when it cannot be made."""
    try:
        home = driver_home()
    except OSError as exc:
        log.warning("the driver's Spark home without MLlib could not be made under %s (%s): the Spark session starts "
                    "about a second slower", cache_dir(), exc)
        return None
    os.environ[SPARK_HOME_ENV] = str(home)
    return home
