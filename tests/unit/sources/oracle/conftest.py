"""The Oracle tests' server: python-oracledb's connections answered from the recorded answers."""

from __future__ import annotations

import oracledb
import pytest

from tests.fixtures.recorded import recorded_server


@pytest.fixture
def server(monkeypatch):
    """python-oracledb's connections answered from a scenario of the recorded answers."""
    return recorded_server(monkeypatch, oracledb, "oracle")
