"""The wheel works: built from the project and installed into a fresh virtual environment, it runs `cdc-pipeline
sync` against throwaway servers from its own files (the engine and the Debezium runner's jars come from the
installed package, not from the checkout); it installs no `assets` or `resources` package, and the Dagster
workspace still loads them from the checkout.

The environments: each Python that CDC_WHEEL_PYTHONS names (paths separated by spaces; `make wheel-test` names
3.11, 3.12 and 3.13 where they are found) gets a virtual environment with the wheel and its dependencies from the
package index. Without it, the tests' own Python gets one with the wheel alone, the dependencies taken from the
tests' environment through a `.pth` line (fast, and no index needed); the wheel's own files still come first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from cdc_pipeline.testing.servers import MariaDbServer, PostgresServer
from tests.helpers import PROJECT_ROOT
from tests.helpers.mariadb_source import new_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.wheel]

PYTHONS_ENV = "CDC_WHEEL_PYTHONS"
# What the wheel is built from (pyproject.toml names no other file); copied, so the build leaves the checkout clean.
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "cdc_pipeline")
INSTALL_TIMEOUT_SECONDS = 1800
SYNC_TIMEOUT_SECONDS = 600


def _pythons() -> list[str]:
    return os.environ.get(PYTHONS_ENV, "").split() or [sys.executable]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built as `pip install .` builds it (the build backend in an isolated environment)."""
    work = tmp_path_factory.mktemp("wheel")
    (work / "project").mkdir()
    for name in BUILD_INPUTS:
        source = PROJECT_ROOT / name
        if source.is_dir():
            shutil.copytree(source, work / "project" / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, work / "project" / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "dist"),
                    str(work / "project")], check=True, timeout=INSTALL_TIMEOUT_SECONDS)
    [built] = (work / "dist").glob("cdc_pipeline-*.whl")
    return built


def _environment(venv: Path) -> dict[str, str]:
    """The environment of a command run from the virtual environment: its bin first, nothing of the checkout."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(venv)}


def _install(python: str, wheel: Path, venv: Path) -> None:
    """A virtual environment of `python` with the wheel installed (see the module's docstring)."""
    if Path(python).resolve() == Path(sys.executable).resolve():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                        "--no-deps", "--no-index", str(wheel)], check=True, timeout=INSTALL_TIMEOUT_SECONDS)
        site_packages = subprocess.run([str(venv / "bin" / "python"), "-c",
                                        "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       check=True, capture_output=True, text=True).stdout.strip()
        tests_site = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
        (Path(site_packages) / "cdc_pipeline_test_dependencies.pth").write_text("\n".join(tests_site) + "\n")
    else:
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], check=True,
                       timeout=INSTALL_TIMEOUT_SECONDS, env=_environment(venv))


_WHERE_FROM = """
import importlib.util, json, sys
import cdc_pipeline
from cdc_pipeline.capture.runner import runner_classpath
print(json.dumps({"version": list(sys.version_info[:2]), "package": cdc_pipeline.__file__,
                  "classpath": [str(jar) for jar in runner_classpath()],
                  "layers": [name for name in ("assets", "resources") if importlib.util.find_spec(name)]}))
"""


@pytest.mark.parametrize("python", _pythons(), ids=lambda python: Path(python).name)
def test_the_installed_wheel_syncs_a_connector(python: str, wheel: Path, mariadb: MariaDbServer,
                                               destination_pg: PostgresServer, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch):
    venv = tmp_path / "venv"
    _install(python, wheel, venv)
    env = _environment(venv)
    outside = tmp_path / "elsewhere"
    outside.mkdir()

    found = json.loads(subprocess.run([str(venv / "bin" / "python"), "-c", _WHERE_FROM], cwd=outside, env=env,
                                      check=True, capture_output=True, text=True).stdout)
    wanted = subprocess.run([python, "-c", "import sys; print(list(sys.version_info[:2]))"], check=True,
                            capture_output=True, text=True).stdout
    assert found["version"] == json.loads(wanted), found
    assert Path(found["package"]).is_relative_to(venv), found
    assert found["classpath"] and all(Path(jar).is_relative_to(venv) for jar in found["classpath"]), found
    assert found["layers"] == [], "the wheel installs no `assets` or `resources` package"

    pipe = new_pipeline(mariadb, destination_pg, tmp_path, monkeypatch)
    pipe.source(["CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20))",
                 "INSERT INTO items VALUES (1, 'one'), (2, 'two'), (3, 'three')"])
    env.update(pipe.env)
    run = subprocess.run([str(venv / "bin" / "cdc-pipeline"), "sync", pipe.name], cwd=outside, env=env,
                         capture_output=True, text=True, timeout=SYNC_TIMEOUT_SECONDS)
    assert run.returncode == 0, f"Python {found['version']}: {run.stdout[-3000:]}{run.stderr[-3000:]}"
    assert pipe.dest_rows("items") == [(1, "one"), (2, "two"), (3, "three")]

    # The Dagster code location, from the checkout's top (its `assets` and `resources`) on the installed engine.
    validate = subprocess.run([str(venv / "bin" / "python"), "-m", "dagster", "definitions", "validate", "-w",
                               "workspace.yaml"], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                              timeout=SYNC_TIMEOUT_SECONDS)
    assert validate.returncode == 0, validate.stdout + validate.stderr
