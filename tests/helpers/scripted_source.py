"""SQL Server and Oracle connectors of one test, fed by a script instead of a server: the runner's test source set
(`ScriptedSourceConnector`, cdc_pipeline/capture/debezium_runner/src/test/java/.../scripted/, in a jar of its own,
`debezium-runner-scripted.jar`, never in the runner's) replays the script through Debezium's own SQL Server and
Oracle classes inside the real embedded engine, so the events a test applies are made by the connectors' code: value
converters and `TableSchemaBuilder` on column definitions as the JDBC driver reports them, the connector's
schema-change emitter and Debezium's `tableChanges` serializer, its offset context and source struct, and for Oracle
the LogMiner DML parser on redo SQL text and the Oracle DDL parser on DDL text. Everything after the engine is the
product's: the runner's serializer, the fetch cycle, Spark and the apply.

Usage (tests/integration/test_scripted_source.py shows both sources)::

    pipe = new_scripted_pipeline("sqlserver", destination_pg, tmp_path, monkeypatch)
    script = pipe.script
    script.create_table("dbo.items", [sqlserver_column("id", "int", optional=False),
                                      sqlserver_column("price", "decimal", 10, 2)], primary_key=["id"])
    with script.transaction():                   # one commit LSN for both changes
        script.insert("dbo.items", {"id": 1, "price": java("java.math.BigDecimal", "1.50")})
        script.update("dbo.items", {"id": 1, "price": ...}, {"id": 1, "price": ...})
    pipe.sync()                                  # appends the new steps to the script, then one fetch cycle
    pipe.dest_rows("items")
    offset = pipe.stored_offset()                # ... more steps, pipe.sync() ...
    pipe.set_stored_offset(offset)               # a crash before the offset's flush: the next run re-delivers
    pipe.write_config(redeliver=2)               # or: the next run replays the 2 steps before its stored offset

    ora = new_scripted_pipeline("oracle", destination_pg, tmp_path, monkeypatch)
    ora.script.ddl("DEBEZIUM.T", 'CREATE TABLE "DEBEZIUM"."T" ("ID" NUMBER(9) PRIMARY KEY, "D" DATE)')
    ora.script.redo("DEBEZIUM.T", redo)          # redo: SQL_REDO text, e.g.
    #   insert into "DEBEZIUM"."T"("ID","D") values ('1',TO_DATE('2024-01-02 03:04:05', 'YYYY-MM-DD HH24:MI:SS'));
    ora.script.ddl("DEBEZIUM.T", 'ALTER TABLE "DEBEZIUM"."T" ADD "N" NUMBER(5,0)')   # ALTER tableChanges

Oracle values are the redo text itself, as LogMiner writes it; an UPDATE whose SET and WHERE leave a LOB column out
gives that column Debezium's unavailable-value placeholder (LogMinerDmlParser, with lob.enabled).

Values of SQL Server rows are the Java objects mssql-jdbc's `getObject` returns (the connector reads time as
`getTimestamp`): plain JSON for String/Boolean/Integer/Long/Double and null, `java(CLASS, TEXT)` for any other class
(java.lang.Short, java.math.BigDecimal, java.sql.Timestamp "2024-01-02 03:04:05.1234567", java.sql.Date,
microsoft.sql.DateTimeOffset "2024-01-02 03:04:05.1234567 +05:30", ...), `hexbytes(b"...")` for byte[].
Positions grow by themselves: SQL Server change/commit LSNs, Oracle SCNs and transaction ids; a script appended
between runs continues them.

The scripted jar goes on the driver classpath of the test process and of the `sync` processes it starts when this
module is imported (`put_scripted_jar_on_driver_classpath`): the test process's one driver JVM takes its classpath
when it starts, and pytest imports every test module that uses the harness while it collects, before any test starts
that JVM. A run of tests that use no scripted source leaves the classpath as production has it.

Re-delivery, two ways. `set_stored_offset` moves the engine's stored offset back while the destination keeps what it
applied: exactly a crash between a batch's commit and the offset's flush; the connector resumes from the older offset
and the pipeline must skip what it applied. `write_config(redeliver=N)` makes the task replay the N steps before its
stored offset with the offsets they had, while the stored offset (which the pipeline reads as where the engine
resumed) stays: a state the real connector never makes, so the pipeline may take an event at exactly that offset
for a new one (SQL Server's ordering does); use it for the runner, `set_stored_offset` for exactly-once tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from cdc_pipeline.capture.runner import RUNNER_DIR
from cdc_pipeline.config import load_config
from cdc_pipeline.testing.servers import PostgresServer
from tests.helpers.destination import DestinationChecks

SCRIPTED_CONNECTOR = "io.cdcpipeline.runner.scripted.ScriptedSourceConnector"
SCRIPTED_JAR = RUNNER_DIR / "target" / "debezium-runner-scripted.jar"
SCRIPTED_SOURCES = RUNNER_DIR / "src" / "test" / "java"
# What `make test` runs to build the scripted jar: the test source set compiled and packaged, the runner's jar untouched
# (the JVM class archive is keyed by it).
SCRIPTED_JAR_BUILD = ["mvn", "-q", "-B", "test-compile", "jar:test-jar@scripted-jar"]
# Spark's launcher appends this to the driver JVM's classpath, after Spark's own jars: the class archive built for
# the runner's classpath (`cdc-pipeline jvm-archive`) still maps, that classpath being the start of this one. A jar
# named by spark.driver.extraClassPath would come first, and the JVM would refuse the archive (a second slower start).
SPARK_APPENDED_CLASSPATH_ENV = "SPARK_DIST_CLASSPATH"
SQLSERVER_DATABASE = "testdb"
# A step's time of change (the source struct's ts_ms): this, plus a second for each position.
SCRIPT_EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)
ORACLE_DATABASE = "ORCLPDB1"

# DATA_TYPE (java.sql.Types, and microsoft.sql.Types for datetimeoffset) of each SQL Server type as mssql-jdbc's
# DatabaseMetaData.getColumns reports it (sp_columns_100's ODBC types, mapped by the driver).
SQLSERVER_JDBC_TYPES: dict[str, int] = {
    "bit": -7, "tinyint": -6, "smallint": 5, "int": 4, "bigint": -5, "decimal": 3, "numeric": 2,
    "smallmoney": 3, "money": 3, "real": 7, "float": 8, "date": 91, "time": 92, "datetime": 93,
    "smalldatetime": 93, "datetime2": 93, "datetimeoffset": -155, "char": 1, "varchar": 12, "text": -1,
    "nchar": -15, "nvarchar": -9, "ntext": -16, "binary": -2, "varbinary": -3, "image": -4, "timestamp": -2,
    "uniqueidentifier": 1, "xml": -16, "hierarchyid": -3, "geometry": -3, "geography": -3, "sql_variant": -150,
}


def build_scripted_jar() -> Path:
    """The scripted sources' jar, built with Maven when it is missing or older than its sources (`make test` builds it
    first); returns its path."""
    sources = [RUNNER_DIR / "pom.xml", *SCRIPTED_SOURCES.rglob("*.java")]
    if SCRIPTED_JAR.is_file() and SCRIPTED_JAR.stat().st_mtime >= max(source.stat().st_mtime for source in sources):
        return SCRIPTED_JAR
    result = subprocess.run(SCRIPTED_JAR_BUILD, cwd=RUNNER_DIR, capture_output=True, text=True)
    assert result.returncode == 0, f"the Maven build of the scripted sources' jar failed:\n{result.stdout[-4000:]}" \
                                   f"{result.stderr[-4000:]}"
    SCRIPTED_JAR.touch()  # Maven leaves a jar of unchanged classes as it was
    return SCRIPTED_JAR


def put_scripted_jar_on_driver_classpath() -> None:
    """Appends the scripted jar to the classpath of the driver JVMs this process and its children start next; does
    nothing if it is there already."""
    jar = str(build_scripted_jar())
    appended = os.environ.get(SPARK_APPENDED_CLASSPATH_ENV, "")
    if jar not in appended.split(os.pathsep):
        os.environ[SPARK_APPENDED_CLASSPATH_ENV] = os.pathsep.join(part for part in (appended, jar) if part)


put_scripted_jar_on_driver_classpath()


def java(java_class: str, text: str) -> dict[str, str]:
    """A value of that Java class, made from its text by the harness (`ScriptValues`)."""
    return {"java": java_class, "value": text}


def hexbytes(data: bytes) -> dict[str, str]:
    """A byte[] value."""
    return {"hex": data.hex()}


def sqlserver_column(name: str, type_name: str, length: int | None = None, scale: int | None = None, *,
                     optional: bool = True, auto_incremented: bool = False, default: str | None = None,
                     jdbc_type: int | None = None) -> dict[str, Any]:
    """A column as mssql-jdbc's `getColumns` describes it (COLUMN_SIZE as `length`, DECIMAL_DIGITS as `scale`,
    COLUMN_DEF as `default`, e.g. "((0))"); `jdbc_type` defaults to the driver's DATA_TYPE of `type_name`."""
    column: dict[str, Any] = {"name": name, "typeName": type_name,
                              "jdbcType": SQLSERVER_JDBC_TYPES[type_name.removesuffix(" identity")]
                              if jdbc_type is None else jdbc_type,
                              "optional": optional, "autoIncremented": auto_incremented}
    if length is not None:
        column["length"] = length
    if scale is not None:
        column["scale"] = scale
    if default is not None:
        column["default"] = default
    return column


def sqlserver_lsn(number: int) -> str:
    """The LSN text Debezium's `Lsn.valueOf` reads: three hex parts, the number in the middle one."""
    return f"00000025:{number:08x}:0001"


@dataclass
class Script:
    """The steps of one connector's script (JSON Lines, appended by `write`), with positions that grow."""

    path: Path
    source: str
    pending: list[dict[str, Any]] = field(default_factory=list)
    position: int = 100
    transaction_number: int = 0
    _open: list[dict[str, Any]] | None = None

    # --- SQL Server ---
    def create_table(self, table: str, columns: list[dict[str, Any]], primary_key: list[str] | tuple = (),
                     capture: str | None = None) -> None:
        """A new capture instance of a table: its CREATE schema change (SQL Server's, with no DDL text)."""
        self._schema("create", table, columns, primary_key, capture)

    def alter_table(self, table: str, columns: list[dict[str, Any]], primary_key: list[str] | tuple = (),
                    capture: str | None = None) -> None:
        """A new capture instance replacing the table's: its ALTER schema change with the whole new definition."""
        self._schema("alter", table, columns, primary_key, capture)

    def _schema(self, kind: str, table: str, columns: list[dict[str, Any]], primary_key: Any, capture: str | None) -> None:
        lsn = sqlserver_lsn(self._next())
        step = {"schema": kind, "table": table, "commit_lsn": lsn, "change_lsn": lsn, "columns": columns,
                "primaryKey": list(primary_key)}
        if capture:
            step["capture"] = capture
        self.pending.append(step)

    def insert(self, table: str, after: dict[str, Any]) -> None:
        self._change({"op": "c", "table": table, "after": after})

    def update(self, table: str, before: dict[str, Any], after: dict[str, Any]) -> None:
        self._change({"op": "u", "table": table, "before": before, "after": after})

    def delete(self, table: str, before: dict[str, Any]) -> None:
        self._change({"op": "d", "table": table, "before": before})

    # --- Oracle ---
    def ddl(self, table: str, text: str) -> None:
        """DDL text as LogMiner gives it (parsed by Debezium's OracleDdlParser), committed on its own."""
        scn = str(self._next())
        self.transaction_number += 1
        self.pending.append({"ddl": text, "table": table, "scn": scn, "commit_scn": scn,
                             "txid": f"{self.transaction_number:016x}"})

    def redo(self, table: str, sql_redo: str) -> None:
        """One LogMiner SQL_REDO row (parsed by Debezium's LogMinerDmlParser)."""
        self._change({"redo": sql_redo, "table": table})

    # --- both ---
    def quiet(self) -> str:
        """A quiet stretch: the source's log went on to a later position with no change of a captured table (SQL Server:
        the max LSN an iteration read; Oracle: where a mining window ended). Returns that position, which the
        connector's heartbeat carries."""
        number = self._next()
        if self.source == "sqlserver":
            position = sqlserver_lsn(number)
            self.pending.append({"quiet": True, "commit_lsn": position})
        else:
            position = str(number)
            self.pending.append({"quiet": True, "scn": position})
        return position

    # --- transactions and the file ---
    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """The changes made inside commit together: one commit LSN (SQL Server) or commit SCN and id (Oracle)."""
        assert self._open is None, "transactions do not nest"
        self._open = []
        try:
            yield
            self._commit(self._open)
        finally:
            self._open = None

    def _change(self, step: dict[str, Any]) -> None:
        step = {**step, **self._change_position()}
        if self._open is None:
            self._commit([step])
        else:
            self._open.append(step)

    def _change_position(self) -> dict[str, str]:
        number = self._next()
        return {"change_lsn": sqlserver_lsn(number)} if self.source == "sqlserver" else {"scn": str(number)}

    def _commit(self, steps: list[dict[str, Any]]) -> None:
        commit = self._next()
        self.transaction_number += 1
        for step in steps:
            if self.source == "sqlserver":
                step["commit_lsn"] = sqlserver_lsn(commit)
            else:
                step["commit_scn"] = str(commit)
                step["txid"] = f"{self.transaction_number:016x}"
        self.pending.extend(steps)

    def _next(self) -> int:
        self.position += 1
        return self.position

    def write(self) -> None:
        """Appends the steps made since the last write to the script file; each step's `ts` is its position's time."""
        with self.path.open("a") as out:
            for step in self.pending:
                if "ts" not in step:
                    number = (int(step["commit_lsn"].split(":")[1], 16) if "commit_lsn" in step
                              else int(step.get("commit_scn", step["scn"])))
                    step["ts"] = (SCRIPT_EPOCH + timedelta(seconds=number)).isoformat().replace("+00:00", "Z")
                out.write(json.dumps(step) + "\n")
        self.pending.clear()


@dataclass
class ScriptedPipeline(DestinationChecks):
    """One test's SQL Server or Oracle connector fed by a script, and its destination database."""

    source_type: str
    destination: PostgresServer
    name: str
    dest_db: str
    config_path: Path
    script: Script
    tables: list[str]

    @property
    def dest_dsn(self) -> str:
        return self.destination.dsn(self.dest_db)

    @property
    def dest_schema(self) -> str:
        """The destination schema of the script's tables: their source schema, lower case (`dbo`, `debezium`)."""
        return self.tables[0].split(".")[0].lower()

    def connector_config(self, redeliver: int = 0, **overrides: Any) -> dict[str, Any]:
        """The connector's entry of the connectors file: its type's, with the scripted connector class."""
        debezium = {"connector.class": SCRIPTED_CONNECTOR, "cdc.script.source": self.source_type,
                    "cdc.script.path": str(self.script.path), "cdc.script.redeliver": str(redeliver),
                    **overrides.pop("debezium", {})}
        return {
            "type": self.source_type,
            "hostname": "scripted.invalid",
            "port": 1433 if self.source_type == "sqlserver" else 1521,
            "user": "scripted",
            "password": "${TEST_SOURCE_PASSWORD}",
            "database": SQLSERVER_DATABASE if self.source_type == "sqlserver" else ORACLE_DATABASE,
            "tables": self.tables,
            "idle_timeout_seconds": 2,
            "linger_seconds": 0,  # Dagster runs end caught up, as syncs do (tests/integration/test_linger.py lingers)
            "debezium": debezium,
            **overrides,
        }

    def write_config(self, redeliver: int = 0, **overrides: Any) -> None:
        document = {"destination": {"dsn": "${TEST_DEST_DSN}", "control_schema": "cdc"},
                    "connectors": {self.name: self.connector_config(redeliver, **overrides)}}
        self.config_path.write_text(yaml.safe_dump(document, sort_keys=False))

    def sync(self) -> dict[str, Any]:
        """One fetch cycle of the connector in this process, as `cdc-pipeline sync` runs it after its checks (the
        change check and the preflight would reach for a server: there is none); writes the script first."""
        from cdc_pipeline.cycle import run_cycle
        from tests.helpers.spark import get_spark

        self.script.write()
        config = load_config()
        return run_cycle(config.connector(self.name), config.destination, get_spark())

    def stored_offset(self) -> str:
        """The engine's stored offset (its JSON text in the control schema), for `set_stored_offset`."""
        return self.dest_query("SELECT offset_value FROM cdc.debezium_offsets WHERE connector = %s", (self.name,))[0][0]

    def set_stored_offset(self, offset_value: str) -> None:
        """Puts the engine's stored offset back to an older one and leaves what the destination applied: the state a
        crash between a batch's commit and the offset's flush leaves. The next run resumes from it, as the connector
        does, and re-delivers the changes after it."""
        import psycopg

        with psycopg.connect(self.dest_dsn, autocommit=True) as conn:
            conn.execute("UPDATE cdc.debezium_offsets SET offset_value = %s WHERE connector = %s",
                         (offset_value, self.name))

    def dest_rows(self, table: str) -> list[tuple]:
        """The rows of a destination table (named as the destination names it: `items` for Oracle's ITEMS)."""
        from psycopg import sql

        return self.dest_query(sql.SQL("SELECT * FROM {} ORDER BY 1").format(
            sql.Identifier(self.dest_schema, table)).as_string())


def new_scripted_pipeline(source_type: str, destination_pg: PostgresServer, tmp_path: Path,
                          monkeypatch: pytest.MonkeyPatch, tables: list[str] | None = None) -> ScriptedPipeline:
    """A scripted connector of `source_type` ("sqlserver" or "oracle") with its own destination database and
    connectors file, its environment set through `monkeypatch`; `tables` are its `tables` (schema.table)."""
    assert source_type in ("sqlserver", "oracle")
    suffix = uuid.uuid4().hex[:8]
    default_tables = ["dbo.items"] if source_type == "sqlserver" else ["DEBEZIUM.ITEMS"]
    script = Script(tmp_path / f"{source_type}_{suffix}.jsonl", source_type)
    script.path.touch()
    pipe = ScriptedPipeline(source_type, destination_pg, name=f"{source_type[:3]}_{suffix}", dest_db=f"dst_{suffix}",
                            config_path=tmp_path / "connectors.yaml", script=script, tables=tables or default_tables)
    destination_pg.create_database(pipe.dest_db)
    pipe.write_config()
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir(exist_ok=True)
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("CDC_PIPELINE_CONFIG", str(pipe.config_path))
    monkeypatch.setenv("TEST_SOURCE_PASSWORD", "unused-by-the-script")
    monkeypatch.setenv("TEST_DEST_DSN", pipe.dest_dsn)
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
    return pipe
