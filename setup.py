"""The wheel carries the Java half of the Debezium runner built: before the package's files are collected, the
runner's Maven build runs when its jar or dependency jars are missing or older than its sources (what `make runner`
does). An editable install leaves that to `make runner`. Everything else is in pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

RUNNER_DIR = Path(__file__).resolve().parent / "cdc_pipeline" / "capture" / "debezium_runner"
RUNNER_JAR = RUNNER_DIR / "target" / "debezium-runner.jar"
RUNNER_LIB = RUNNER_DIR / "target" / "lib"


def runner_outdated() -> bool:
    """Whether the runner's jar or its dependency jars are missing, or the jar is older than a source."""
    if not RUNNER_JAR.is_file() or not any(RUNNER_LIB.glob("*.jar")):
        return True
    sources = [RUNNER_DIR / "pom.xml", *(RUNNER_DIR / "src" / "main").rglob("*.java")]
    return RUNNER_JAR.stat().st_mtime < max(source.stat().st_mtime for source in sources)


class BuildPyWithRunner(build_py):
    """`build_py` that builds the Debezium runner first (Maven and a JDK needed then)."""

    def run(self) -> None:
        if not self.editable_mode and runner_outdated():
            if shutil.which("mvn") is None:
                raise SystemExit(f"the Debezium runner in {RUNNER_DIR} is not built and Maven (mvn) is not on the "
                                 "PATH: install Maven and a JDK 17, or run `make runner` first")
            subprocess.run(["mvn", "-q", "-B", "package", "-Dmaven.test.skip=true"], cwd=RUNNER_DIR, check=True)
            self.__dict__.pop("data_files", None)  # collected again, with the jars just built
        super().run()


setup(cmdclass={"build_py": BuildPyWithRunner})
