"""The SQL Server tests' server: pymssql's connections answered from the recorded answers."""

from __future__ import annotations

import pymssql
import pytest

from tests.fixtures.recorded import recorded_server


@pytest.fixture
def server(monkeypatch):
    """pymssql's connections answered from a scenario of the recorded answers."""
    return recorded_server(monkeypatch, pymssql, "sqlserver")
