"""Every third-party package the project's code imports is one pyproject.toml declares: the engine's, and the
Dagster layers' (`assets`, `resources`, which run from the checkout on the installed dependencies)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions

from tests.helpers import PROJECT_ROOT

PROJECT_PACKAGES = ("cdc_pipeline", "assets", "resources")


def _imported_modules() -> set[str]:
    """The top-level names of every module the project's packages import (inside functions too)."""
    names = set()
    for package in PROJECT_PACKAGES:
        for path in (PROJECT_ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - set(PROJECT_PACKAGES) - {"__future__"}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    return {_normalized(re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0])
            for requirement in project["dependencies"]}


def test_every_imported_package_is_a_declared_dependency():
    distributions = packages_distributions()
    declared = _declared()
    undeclared = {module: distributions.get(module, ["(not installed)"]) for module in sorted(_imported_modules())
                  if not declared.intersection(map(_normalized, distributions.get(module, [])))}
    assert undeclared == {}, f"imported but not in [project].dependencies: {undeclared}"


def test_the_check_sees_the_imports():
    assert {"psycopg", "pyspark", "dagster", "pydantic", "pymysql", "yaml", "py4j", "pglast"} <= _imported_modules()
