"""The bench's peer: pg_chameleon 2.0.21 replicating the bench's MariaDB table into PostgreSQL, timed.

pg_chameleon is installed from PyPI into a virtualenv of its own (it needs `mysql-replication<1.0`), in the
home of the OS user that runs it: it refuses to run as root, so when the bench runs as root the peer runs as
the system user `cdcbench` (created with `useradd` if missing), through `runuser`. Its configuration is the
`config-example.yml` that `chameleon set_configuration_files` copies, as a user starts from, with only the
connections, the schema mapping and the table list filled in, and the log sent to standard output so that
`init_replica` and `start_replica` run in the foreground of the process the bench times.

Two measurements, each on a destination database of its own (`<database>_chameleon`):
- `measure_initial_load`: `create_replica_schema`, `add_source`, then `init_replica` timed (the process's start
  included), as the bench times a fresh `cdc-pipeline sync` process;
- `PeerBacklog`: `init_replica` before the backlog is made, then `start_replica` timed until the destination
  equals the source (polled with the bench's fingerprint of `items`), then `stop_replica`.

Testing support only: the engine never imports this module.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Sequence

import psycopg
import yaml
from psycopg import sql

from cdc_pipeline.testing.servers import MariaDbServer, PostgresServer

log = logging.getLogger(__name__)

PEER_NAME = "pg_chameleon"
PEER_VERSION = "2.0.21"
PEER_REQUIREMENTS = (f"pg_chameleon=={PEER_VERSION}", "mysql-replication<1.0")
PEER_OS_USER = "cdcbench"
PEER_PYTHON = "python3.11"
VENV_RELATIVE_PATH = Path(".cache/cdc-pipeline/pg_chameleon-venv")
SOURCE_NAME = "bench"
CONFIG_NAME = "bench"
# The destination PostgreSQL trusts local TCP connections; pg_chameleon's connection string needs a non-empty one.
DESTINATION_PASSWORD = "trusted"
INSTALL_TIMEOUT_SECONDS = 900
COMMAND_TIMEOUT_SECONDS = 3600
POLL_SECONDS = 0.5
# Between polls, at least this many times the poll's own duration: the fingerprint scans the whole table, and
# polling must not take the destination's CPU from the peer it times.
POLL_SPACING = 9
OUTPUT_TAIL_LINES = 30


def chameleon_config(example: dict[str, Any], source: dict[str, Any], destination: dict[str, Any],
                     schema: str, tables: Sequence[str]) -> dict[str, Any]:
    """pg_chameleon's configuration: its example's settings, the MySQL source named `SOURCE_NAME` replicating
    `tables` of `schema` into the destination schema of the same name, the log on standard output.

    `source` holds host, port, user and password; `destination` the same and database. Every other setting
    (batch sizes, copy mode, memory, sleep loop) keeps the example's value, the one a user starts from."""
    template = example["sources"]["mysql"]
    config = {key: value for key, value in example.items() if key not in ("sources", "fillfactor")}
    config["log_dest"] = "stdout"
    config["pg_conn"] = {**example["pg_conn"], **{key: str(value) for key, value in destination.items()}}
    mysql = {key: value for key, value in template.items()
             if key not in ("limit_tables", "skip_tables", "grant_select_to", "skip_events")}
    mysql["db_conn"] = {**template["db_conn"], **{key: str(value) for key, value in source.items()}}
    mysql["schema_mappings"] = {schema: schema}
    mysql["limit_tables"] = [f"{schema}.{table}" for table in tables]
    mysql["skip_tables"] = []
    mysql["grant_select_to"] = []
    mysql["skip_events"] = {"insert": [], "delete": [], "update": []}
    config["sources"] = {SOURCE_NAME: mysql}
    return config


@dataclass
class Chameleon:
    """pg_chameleon installed for `user`, run with the configuration `CONFIG_NAME` in that user's home."""

    user: str
    home: Path
    executable: Path
    run_as_other_user: bool

    def run(self, command: str, timeout: float = COMMAND_TIMEOUT_SECONDS) -> str:
        """Run `chameleon <command>` for the bench's source in the foreground; its output, or RuntimeError."""
        result = subprocess.run(self.command(command), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=timeout, check=False, cwd=self.home)
        output = result.stdout + result.stderr
        if result.returncode or _reports_failure(output):
            raise RuntimeError(f"{PEER_NAME} {command} (source {SOURCE_NAME}) failed with exit code "
                               f"{result.returncode}:\n{_tail(output)}")
        return output

    def start(self, command: str, output: IO[str]) -> subprocess.Popen:
        """Start `chameleon <command>` in the background, its output (its log) into the file `output`."""
        return subprocess.Popen(self.command(command), stdin=subprocess.DEVNULL, stdout=output,
                                stderr=subprocess.STDOUT, text=True, cwd=self.home)

    def command(self, command: str) -> list[str]:
        arguments = [str(self.executable), command, "--config", CONFIG_NAME]
        if command not in ("set_configuration_files", "create_replica_schema"):
            arguments += ["--source", SOURCE_NAME]
        return ["runuser", "-u", self.user, "--", *arguments] if self.run_as_other_user else arguments

    @property
    def config_dir(self) -> Path:
        return self.home / ".pg_chameleon" / "configuration"

    def configure(self, source: MariaDbServer, source_user: str, source_password: str,
                  destination: PostgresServer, dest_database: str, schema: str, tables: Sequence[str]) -> Path:
        """Write `<CONFIG_NAME>.yml` from the example `set_configuration_files` copies; its path."""
        self.run("set_configuration_files")
        example = yaml.safe_load((self.config_dir / "config-example.yml").read_text())
        config = chameleon_config(
            example, {"host": source.host, "port": source.port, "user": source_user, "password": source_password},
            {"host": destination.host, "port": destination.port, "user": destination.superuser,
             "password": DESTINATION_PASSWORD, "database": dest_database}, schema, tables)
        path = self.config_dir / f"{CONFIG_NAME}.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        if self.run_as_other_user:
            entry = pwd.getpwnam(self.user)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        return path

    def prepare(self, source: MariaDbServer, source_user: str, source_password: str, destination: PostgresServer,
                dest_database: str, schema: str, tables: Sequence[str]) -> float:
        """The destination database, the configuration, the replica schema and the source added; the wall seconds
        of `create_replica_schema` and `add_source`."""
        destination.create_database(dest_database)
        self.configure(source, source_user, source_password, destination, dest_database, schema, tables)
        started = time.monotonic()
        self.run("create_replica_schema")
        self.run("add_source")
        return time.monotonic() - started

    def init_replica(self) -> float:
        """`init_replica` in the foreground; its wall seconds (the process's start included)."""
        started = time.monotonic()
        self.run("init_replica")
        return time.monotonic() - started


def ensure_chameleon() -> Chameleon:
    """pg_chameleon in its virtualenv, for a user other than root; installs it (and the user) if missing."""
    running_as_root = os.geteuid() == 0
    if running_as_root:
        _ensure_os_user(PEER_OS_USER)
        user = PEER_OS_USER
    else:
        user = pwd.getpwuid(os.geteuid()).pw_name
    home = Path(pwd.getpwnam(user).pw_dir)
    venv = home / VENV_RELATIVE_PATH
    executable = venv / "bin" / "chameleon"
    as_user = ["runuser", "-u", user, "--"] if running_as_root else []
    if not executable.exists():
        log.info("installing %s into %s", " ".join(PEER_REQUIREMENTS), venv)
        # The user's own PATH lookup: an interpreter under root's home (pyenv) is out of its reach.
        _run([*as_user, PEER_PYTHON, "-m", "venv", "--clear", str(venv)], cwd=home)
        _run([*as_user, str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *PEER_REQUIREMENTS],
             cwd=home)
    return Chameleon(user=user, home=home, executable=executable, run_as_other_user=running_as_root)


def installed_versions(chameleon: Chameleon) -> dict[str, str]:
    """The versions of pg_chameleon and of the libraries it reads MySQL with, as pip reports them."""
    python = chameleon.executable.parent / "python"
    output = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                            check=True).stdout
    wanted = {"pg-chameleon", "pg_chameleon", "mysql-replication", "pymysql", "psycopg2-binary"}
    return {item["name"]: item["version"] for item in json.loads(output) if item["name"].lower() in wanted}


def measure_initial_load(source: MariaDbServer, destination: PostgresServer, source_user: str, source_password: str,
                         database: str, table: str = "items") -> dict[str, Any]:
    """pg_chameleon's `init_replica` copying `database`.`table` into `<database>_chameleon`: its wall time and
    rate, the wall time of the commands before it (`create_replica_schema`, `add_source`), and whether the copy
    equals the source (the bench's fingerprint)."""
    from cdc_pipeline.testing.bench import same_items

    chameleon = ensure_chameleon()
    dest_database = f"{database}_chameleon"
    setup_seconds = chameleon.prepare(source, source_user, source_password, destination, dest_database, database,
                                      [table])
    seconds = chameleon.init_replica()
    with psycopg.connect(destination.dsn(dest_database)) as connection:
        rows = connection.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(database, table))
                                  ).fetchone()[0]
    return {"peer": f"{PEER_NAME} {PEER_VERSION}", "versions": installed_versions(chameleon), "rows": int(rows),
            "seconds": round(seconds, 2), "rows_per_second": round(rows / seconds),
            "setup_seconds": round(setup_seconds, 2), "exact": same_items(source, destination, database, dest_database)}


@dataclass
class PeerBacklog:
    """pg_chameleon catching up a backlog: `initialise` before the changes are made (the replica then stopped),
    `catch_up` after, timed from `start_replica` until the destination equals the source."""

    source: MariaDbServer
    destination: PostgresServer
    source_user: str
    source_password: str
    database: str
    chameleon: Chameleon = field(init=False)

    @property
    def dest_database(self) -> str:
        return f"{self.database}_chameleon"

    def initialise(self) -> None:
        self.chameleon = ensure_chameleon()
        self.chameleon.prepare(self.source, self.source_user, self.source_password, self.destination,
                               self.dest_database, self.database, ["items"])
        self.chameleon.init_replica()

    def catch_up(self, changes: int, timeout: float) -> dict[str, Any]:
        """`start_replica` until the destination's `items` equals the source's; the wall seconds (the process's
        start included) and rate, then `stop_replica`."""
        from cdc_pipeline.testing.bench import destination_items_fingerprint, source_items_fingerprint

        wanted = source_items_fingerprint(self.source, self.database)
        started = time.monotonic()
        output = tempfile.TemporaryFile("w+")
        process = self.chameleon.start("start_replica", output)
        try:
            while True:
                polled = time.monotonic()
                found = destination_items_fingerprint(self.destination, self.database, self.dest_database)
                if found == wanted:
                    break
                if process.poll() is not None:
                    raise RuntimeError(f"{PEER_NAME} start_replica (source {SOURCE_NAME}) exited with "
                                       f"{process.returncode} before catching up:\n{_tail(_read(output))}")
                if time.monotonic() - started > timeout:
                    raise RuntimeError(f"{PEER_NAME} had not caught up {changes} changes after {timeout:.0f} s: "
                                       f"source {wanted}, destination {found}")
                time.sleep(max(POLL_SECONDS, POLL_SPACING * (time.monotonic() - polled)))
            seconds = time.monotonic() - started
        finally:
            self._stop(process)
            output.close()
        return {"peer": f"{PEER_NAME} {PEER_VERSION}", "versions": installed_versions(self.chameleon),
                "changes": changes, "seconds": round(seconds, 2), "events_per_second": round(changes / seconds)}

    def _stop(self, process: subprocess.Popen) -> None:
        if process.poll() is None:
            try:
                self.chameleon.run("stop_replica", timeout=120)
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                log.warning("%s stop_replica failed, terminating its process %d: %s", PEER_NAME, process.pid, error)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _ensure_os_user(user: str) -> None:
    try:
        pwd.getpwnam(user)
    except KeyError:
        log.info("creating OS user %s to run %s (it refuses to run as root)", user, PEER_NAME)
        _run(["useradd", "--system", "--user-group", "--create-home", "--shell", "/usr/sbin/nologin", user])


def _run(command: list[str], cwd: Path | None = None) -> None:
    result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=INSTALL_TIMEOUT_SECONDS, check=False, cwd=cwd)
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)} exited with {result.returncode} installing {PEER_NAME}:\n"
                           f"{_tail(result.stdout + result.stderr)}")


def _reports_failure(output: str) -> bool:
    """pg_chameleon reports many failures in its log and exits 0 (`sys.exit()`); daemonize's atexit hook prints a
    harmless `SystemExit: 0` traceback after every foreground command."""
    harmless = output.rstrip().endswith("SystemExit: 0") and output.count("Traceback") == 1
    return " ERROR: " in output or ("Traceback" in output and not harmless)


def _read(output: IO[str]) -> str:
    output.seek(0)
    return output.read()


def _tail(output: str) -> str:
    return "\n".join(output.strip().splitlines()[-OUTPUT_TAIL_LINES:])


def add_initial_load(results: dict[str, Any], source: MariaDbServer, destination: PostgresServer,
                     source_user: str, source_password: str, database: str) -> None:
    """The peer's initial load of the bench's `items`, and cdc-pipeline's bulk rate over it, into `results`."""
    peer = measure_initial_load(source, destination, source_user, source_password, database)
    results["peer"] = peer
    results["bulk_to_peer_ratio"] = round(results["bulk"]["rows_per_second"] / peer["rows_per_second"], 3)


def add_backlog(results: dict[str, Any], peer: PeerBacklog) -> None:
    """The peer's catch-up of the bench's backlog, and cdc-pipeline's rate over it, into `results`."""
    changes = results["changes"]
    caught_up = peer.catch_up(changes, timeout=max(600.0, changes / 100))
    results["peer"] = caught_up
    results["pipeline_to_peer_ratio"] = round(results["events_per_second"] / caught_up["events_per_second"], 3)


def describe_initial_load(load: dict[str, Any]) -> str:
    peer = load["peer"]
    return (f"  peer: {peer['peer']} init_replica:       {peer['rows_per_second']:>9} rows/s ({peer['seconds']} s "
            f"wall, {peer['rows']} rows, after {peer['setup_seconds']} s of create_replica_schema and add_source; "
            f"destination exact: {peer['exact']})  cdc-pipeline bulk / {PEER_NAME} = "
            f"{load['bulk_to_peer_ratio']}")


def describe_backlog(backlog: dict[str, Any]) -> str:
    peer = backlog["peer"]
    return (f"peer: {peer['peer']} start_replica caught up the same backlog (replica stopped while it was made): "
            f"{peer['events_per_second']} changes/s ({peer['seconds']} s wall until the destination equalled the "
            f"source)  cdc-pipeline / {PEER_NAME} = {backlog['pipeline_to_peer_ratio']}")
