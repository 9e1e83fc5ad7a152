"""The MariaDB/MySQL connectors the source's tests read."""

from __future__ import annotations

from pathlib import Path

from cdc_pipeline.config import ConnectorConfig, parse_config


def connector_of(kind: str) -> ConnectorConfig:
    config = parse_config({"destination": {"dsn": "postgresql://cdc@localhost/warehouse"},
                           "connectors": {"m": {"type": kind, "hostname": "localhost", "user": "cdc",
                                                "password": "secret", "database": "shop"}}}, Path("x.yaml"))
    return config.connector("m")
