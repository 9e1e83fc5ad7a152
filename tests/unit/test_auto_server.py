"""The server started for Dagster's runs (`auto_server`): where its files may live, what names its build, and a run
that cannot have one going cold with the reason."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from cdc_pipeline.errors import CdcError
from cdc_pipeline.ops import auto_server


def test_it_is_on_unless_the_environment_turns_it_off(monkeypatch):
    monkeypatch.delenv(auto_server.AUTO_SERVE_ENV, raising=False)
    assert auto_server.enabled()
    for off in ("0", "false", "No", " off "):
        assert not auto_server.enabled({auto_server.AUTO_SERVE_ENV: off})
    assert auto_server.enabled({auto_server.AUTO_SERVE_ENV: "1"})


def test_its_directory_is_of_this_user_alone(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv(auto_server.RUNTIME_DIR_ENV, str(shared))
    with pytest.raises(CdcError, match="of this user alone"):
        auto_server.runtime_dir()
    made = tmp_path / "made"
    monkeypatch.setenv(auto_server.RUNTIME_DIR_ENV, str(made))
    assert auto_server.runtime_dir() == made and made.stat().st_mode & 0o777 == 0o700


def test_its_build_names_the_environment_the_connectors_file_names(tmp_path, monkeypatch):
    config = tmp_path / "connectors.yaml"
    config.write_text("destination: {dsn: '${SOME_DSN}'}\nconnectors: {}\n")
    monkeypatch.setenv("SOME_DSN", "postgresql://a")
    first = auto_server.build_key(str(config))
    monkeypatch.setenv("UNRELATED_VARIABLE", "x")
    assert auto_server.build_key(str(config)) == first
    monkeypatch.setenv("SOME_DSN", "postgresql://b")
    assert auto_server.build_key(str(config)) != first
    monkeypatch.setenv("SOME_DSN", "postgresql://a")
    monkeypatch.setenv("SPARK_DRIVER_MEMORY", "2g")
    assert auto_server.build_key(str(config)) != first


def test_a_socket_path_too_long_leaves_the_run_cold_saying_why(tmp_path, monkeypatch, caplog):
    deep = tmp_path / ("d" * 120)
    monkeypatch.setenv(auto_server.RUNTIME_DIR_ENV, str(deep))
    monkeypatch.delenv(auto_server.AUTO_SERVE_ENV, raising=False)
    config = tmp_path / "connectors.yaml"
    config.write_text("connectors: {}\n")
    with caplog.at_level(logging.WARNING, logger=auto_server.__name__):
        assert auto_server.ensure(str(config)) is None
    assert "longer than a Unix socket's 107 bytes" in caplog.text and auto_server.RUNTIME_DIR_ENV in caplog.text
    assert not list(Path(deep).glob("*.pid"))


def test_runs_are_tagged_served_unless_a_start_failed_lately(tmp_path, monkeypatch):
    # Short: a Unix socket's path is 107 bytes at most, and pytest's temporary paths run long (under xdist longer).
    servers = Path(tempfile.mkdtemp(prefix="cdc-servers-"))
    monkeypatch.setenv(auto_server.RUNTIME_DIR_ENV, str(servers))
    monkeypatch.delenv(auto_server.AUTO_SERVE_ENV, raising=False)
    monkeypatch.delenv("CDC_PIPELINE_SERVER", raising=False)
    config = tmp_path / "connectors.yaml"
    config.write_text("connectors: {}\n")
    assert auto_server.will_serve(str(config))
    failed = auto_server._stem(str(config)).with_suffix(".failed")
    failed.touch()
    assert not auto_server.will_serve(str(config))
    old = time.time() - auto_server.FAILED_RETRY_SECONDS - 1
    os.utime(failed, (old, old))
    assert auto_server.will_serve(str(config))
    monkeypatch.setenv(auto_server.AUTO_SERVE_ENV, "0")
    assert not auto_server.will_serve(str(config))
    shutil.rmtree(servers)
