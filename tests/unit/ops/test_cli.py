"""The `cdc-pipeline` command's parser: `--config` before or after the subcommand."""

from __future__ import annotations

import pytest

from cdc_pipeline.config import CONFIG_PATH_ENV
from cdc_pipeline.ops.cli import build_parser, main

COMMANDS = [
    ["sync", "shop"],
    ["state"],
    ["pending", "shop", "--json"],
    ["restart", "shop", "always"],
    ["snapshot", "shop", "shop.orders"],
    ["requests", "--serve"],
    ["objmap", "add", "shop", "table", "shop.a", "b"],
    ["dead-letters", "list", "shop"],
    ["jvm-archive"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: " ".join(command[:2]))
def test_config_is_taken_before_and_after_the_subcommand(command):
    assert build_parser().parse_args(["--config", "before.yaml", *command]).config == "before.yaml"
    assert build_parser().parse_args([*command, "--config", "after.yaml"]).config == "after.yaml"
    assert build_parser().parse_args(command).config is None


def test_config_after_the_subcommand_wins_over_the_one_before():
    assert build_parser().parse_args(["--config", "a.yaml", "state", "--config", "b.yaml"]).config == "b.yaml"


def test_the_command_reads_the_file_given_after_the_subcommand(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CONFIG_PATH_ENV, str(tmp_path / "from-the-environment.yaml"))
    missing = tmp_path / "given-after.yaml"

    assert main(["state", "--config", str(missing)]) == 2

    assert f"configuration file {missing} not found" in capsys.readouterr().err
