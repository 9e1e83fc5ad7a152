"""The docs check: every `cdc-pipeline` command in the README's and docs' shell blocks is one the CLI accepts, every
relative link reaches a file and, with an anchor, one of its headings, and the README stays short. The lists the
docs must hold whole are read from the code, so they cannot fall behind it: every request kind is a row of the
requests table (docs/operations.md), and every field of each section of the connectors file is a key of the
annotated file in docs/configuration.md, which the pipeline accepts."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest
import yaml

from cdc_pipeline.config import ConnectorConfig, DestinationConfig, SparkConfig, load_config
from cdc_pipeline.ops import requests
from cdc_pipeline.ops.cli import build_parser
from tests.helpers import PROJECT_ROOT

DOCS = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _shell_lines(path: Path) -> list[str]:
    lines = []
    for block in re.findall(r"```(?:sh|bash)\n(.*?)```", path.read_text(), re.S):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("cdc-pipeline "):
                lines.append(line)
    return lines


def _anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_anchor(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")}


COMMANDS = [(path.name, line) for path in DOCS for line in _shell_lines(path)]


@pytest.mark.parametrize("document, command", COMMANDS)
def test_each_documented_command_is_one_the_cli_accepts(document, command):
    # A synopsis' optional parts (`[--json]`, `[NAME]`) are given, and of its choices (`a|b`) the first.
    words = [word.strip("[]") for word in shlex.split(command)[1:]]
    words = [word.split("|")[0] for word in words if word != "..."]
    try:
        build_parser().parse_args(words)
    except SystemExit as exc:
        pytest.fail(f"{document}: `{command}` is not accepted by the CLI (exit {exc.code})")


def test_the_docs_hold_commands():
    assert len(COMMANDS) >= 10


@pytest.mark.parametrize("path", DOCS, ids=lambda path: path.name)
def test_each_relative_link_reaches_its_file_and_heading(path):
    for target in _LINK.findall(path.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        assert linked.exists(), f"{path.name}: link to {target} reaches no file"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{path.name}: link to {target} reaches no heading of {linked.name}"


def test_the_readme_is_short():
    assert len((PROJECT_ROOT / "README.md").read_text().splitlines()) < 200


def _section(path: Path, heading: str) -> str:
    """The text of a page from a heading to the next heading of the same or a higher level."""
    text = path.read_text()
    start = text.index(heading + "\n")
    level = heading.split(" ", 1)[0]
    end = re.search(rf"^#{{1,{len(level)}}} ", text[start + len(heading):], re.M)
    return text[start:start + len(heading) + end.start()] if end else text[start:]


def documented_request_kinds() -> set[str]:
    """The `kind` column of the requests table: its rows' first cells read `` `cli-command` / `kind` ``."""
    table = _section(PROJECT_ROOT / "docs" / "operations.md", "### Requests")
    return set(re.findall(r"^\| `[a-z-]+` / `([a-z_]+)` \|", table, re.M))


def test_every_request_kind_is_a_row_of_the_requests_table():
    documented = documented_request_kinds()
    missing, unknown = sorted(set(requests.KINDS) - documented), sorted(documented - set(requests.KINDS))
    assert not missing, f"request kinds missing from the requests table of docs/operations.md: {missing}"
    assert not unknown, f"the requests table of docs/operations.md names kinds the code lacks: {unknown}"


CONFIGURATION = PROJECT_ROOT / "docs" / "configuration.md"
# The connector's name is its key under `connectors:`, not one of its fields.
NOT_A_FILE_FIELD = {"name"}


def annotated_file() -> str:
    """The connectors file of docs/configuration.md, every field with its default."""
    match = re.search(r"```yaml\n(.*?)```", CONFIGURATION.read_text(), re.S)
    assert match, "docs/configuration.md holds no yaml block"
    return match.group(1)


def _field_names(section: type) -> set[str]:
    return {field.name for field in dataclasses.fields(section) if field.init} - NOT_A_FILE_FIELD


@pytest.mark.parametrize("section, keys", [
    (DestinationConfig, lambda data: data["destination"]),
    (SparkConfig, lambda data: data["spark"]),
    (ConnectorConfig, lambda data: next(iter(data["connectors"].values()))),
], ids=["destination", "spark", "connector"])
def test_every_field_of_the_connectors_file_is_in_the_annotated_file(section, keys):
    documented = set(keys(yaml.safe_load(annotated_file())))
    missing, unknown = sorted(_field_names(section) - documented), sorted(documented - _field_names(section))
    assert not missing, f"{section.__name__} fields missing from docs/configuration.md: {missing}"
    assert not unknown, f"docs/configuration.md names {section.__name__} fields the code lacks: {unknown}"


def test_the_annotated_file_is_one_the_pipeline_accepts(tmp_path, monkeypatch):
    for variable in re.findall(r"\$\{(\w+)\}", annotated_file()):
        monkeypatch.setenv(variable, "postgresql://writer:secret@127.0.0.1/warehouse")
    path = tmp_path / "connectors.yaml"
    path.write_text(annotated_file())
    assert load_config(path).connectors
