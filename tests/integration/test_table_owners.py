"""One destination table, one writer: a second connector (its own connectors file, on the same destination) whose
tables map onto a table the first connector writes is refused, naming both, before it writes or empties anything.

Shards of one database on two servers (`shop` on `eu` and on `us`) map to one destination schema by default; here
both sources live on the test's one MariaDB server, and the second connector's `destination_schema` names the
first one's schema, which is the same overlap.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cdc_pipeline.errors import TableOwnerError
from cdc_pipeline.ops.cli import main, run_sync
from tests.helpers.mariadb_source import CAPTURE_PASSWORD, Pipeline

pytestmark = pytest.mark.integration

ORDERS = "CREATE TABLE orders (id INT PRIMARY KEY, item VARCHAR(20))"


def _second_connector(pipeline: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                      **fields: str) -> tuple[str, str]:
    """A second MariaDB connector in a connectors file of its own, on the first one's destination database, made
    the current configuration; returns its name and source database."""
    name, database = f"{pipeline.name}_us", f"{pipeline.source_db}_us"
    pipeline.mariadb.execute(f"CREATE DATABASE `{database}`")
    connector = {"type": "mariadb", "hostname": "127.0.0.1", "port": pipeline.mariadb.port, "user": "dbz",
                 "password": CAPTURE_PASSWORD, "database": database, "idle_timeout_seconds": 2, **fields}
    path = tmp_path / "us.yaml"
    path.write_text(yaml.safe_dump({"destination": {"dsn": pipeline.dest_dsn, "control_schema": "cdc"},
                                    "connectors": {name: connector}}))
    monkeypatch.setenv("CDC_PIPELINE_CONFIG", str(path))
    return name, database


def test_a_second_connector_never_empties_the_first_ones_table(pipeline, tmp_path, monkeypatch):
    pipeline.source([ORDERS, "INSERT INTO orders VALUES (1, 'eu-1'), (2, 'eu-2'), (3, 'eu-3')"])
    pipeline.sync()
    name, database = _second_connector(pipeline, tmp_path, monkeypatch, destination_schema=pipeline.dest_schema)
    pipeline.mariadb.execute([ORDERS, "INSERT INTO orders VALUES (1, 'us-1')"], database=database)

    with pytest.raises(TableOwnerError) as refused:
        run_sync(name)

    message = str(refused.value)
    assert pipeline.name in message and name in message and f"{pipeline.dest_schema}.orders" in message
    pipeline.assert_same("orders")


def test_a_table_rule_onto_another_connectors_table_is_refused(pipeline, tmp_path, monkeypatch, capsys):
    pipeline.source([ORDERS, "INSERT INTO orders VALUES (1, 'eu-1')"])
    pipeline.sync()
    name, database = _second_connector(pipeline, tmp_path, monkeypatch)
    target = f"{pipeline.dest_schema}.orders"

    assert main(["objmap", "add", name, "table", f"{database}.orders", target]) == 2

    error = capsys.readouterr().err
    assert pipeline.name in error and name in error and target in error
    assert main(["objmap", "list", name]) == 0 and capsys.readouterr().out == "", "the rule was not stored"
    # A rule written straight into the control schema (the operator role may) is refused when the run reads it.
    pipeline.dest_query("INSERT INTO cdc.objmap (connector, kind, source_object, destination_object) "
                        "VALUES (%s, 'table', %s, %s) RETURNING 1", (name, f"{database}.orders", target))
    pipeline.mariadb.execute([ORDERS, "INSERT INTO orders VALUES (1, 'us-1')"], database=database)

    with pytest.raises(TableOwnerError, match=f"{pipeline.name}.*{name}"):
        run_sync(name)
    pipeline.assert_same("orders")
