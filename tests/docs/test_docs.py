"""The docs check: every `cdc-pipeline` command in the README's and docs' shell blocks is one the CLI accepts, every
relative link reaches a file and, with an anchor, one of its headings, and the README stays short."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

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
