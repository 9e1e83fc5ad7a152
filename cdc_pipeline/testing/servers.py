"""Throwaway MariaDB and PostgreSQL servers for tests, the demo and benchmarks.

Each server listens on a free TCP port on 127.0.0.1, keeps its data, socket, configuration and log in
one temporary directory, and is stopped by its context manager or, at the latest, when the Python
process exits. The temporary directory is removed on stop unless ``CDC_KEEP_SERVERS=1``. Missing
server binaries are installed with apt-get (Debian, as root).

A server built with ``stop_at_exit=False`` and ``remove_on_stop=False`` outlives the process (the
demo's servers do); a later process adopts it with ``attach()`` and may then ``stop()`` it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pwd
import shutil
import signal
import socket as socket_module
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import quote

import psycopg
from psycopg import sql

if TYPE_CHECKING:
    import pymysql

logger = logging.getLogger(__name__)

LOOPBACK_HOST = "127.0.0.1"
KEEP_SERVERS_ENV = "CDC_KEEP_SERVERS"
START_TIMEOUT_SECONDS = 60
STOP_TIMEOUT_SECONDS = 30
POSTGRES_OS_USER = "postgres"
POSTGRES_INSTALL_ROOT = Path("/usr/lib/postgresql")
MARIADB_PACKAGES = ["mariadb-server", "mariadb-client"]
POSTGRES_PACKAGES = ["postgresql"]
CAPTURE_USER_HOSTS = ("%", "127.0.0.1", "localhost")
GRANT_CAPTURE_PRIVILEGES = (
    "GRANT SELECT, RELOAD, SHOW DATABASES, REPLICATION SLAVE, REPLICATION CLIENT, BINLOG MONITOR, LOCK TABLES "
    "ON *.* TO %s@%s"
)
# sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
MAX_UNIX_SOCKET_PATH = 107
LOG_TAIL_LINES = 40
INITIAL_ROOT_PASSWORD = ""
MYSQL_ACCESS_DENIED = 1045

_running_servers: dict[int, MariaDbServer | PostgresServer] = {}
_apt_index_updated = False


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket_module.socket(socket_module.AF_INET, socket_module.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK_HOST, 0))
        return probe.getsockname()[1]


def ensure_mariadb_installed() -> None:
    """Install the MariaDB server and client Debian packages when mariadbd is missing; fast when present."""
    if _mariadb_executables() is not None:
        return
    logger.info("MariaDB binaries not found; installing %s", " ".join(MARIADB_PACKAGES))
    _apt_install(MARIADB_PACKAGES)
    if _mariadb_executables() is None:
        raise RuntimeError("mariadbd or mariadb-install-db is still missing after installing MariaDB packages")


def ensure_postgres_installed() -> None:
    """Install the PostgreSQL Debian package when initdb is missing and make sure the postgres OS user exists."""
    if _postgres_bin_dir() is None:
        logger.info("PostgreSQL binaries not found; installing %s", " ".join(POSTGRES_PACKAGES))
        _apt_install(POSTGRES_PACKAGES)
        if _postgres_bin_dir() is None:
            raise RuntimeError(f"no PostgreSQL bin directory under {POSTGRES_INSTALL_ROOT} after installing")
    if _running_as_root():
        _ensure_postgres_os_user()


def start_mariadb(base_dir: Path | None = None, tls: bool = False) -> MariaDbServer:
    """Start a MariaDB server in a new temporary directory (under base_dir if given) on a free port."""
    work_dir = _make_work_dir("mariadb-", base_dir)
    server = MariaDbServer(
        port=free_port(),
        datadir=work_dir / "data",
        socket=work_dir / "mariadb.sock",
        tls=tls,
        remove_on_stop=True,
    )
    return server.start()


def start_postgres(base_dir: Path | None = None, logical: bool = False, tls: bool = False) -> PostgresServer:
    """Start a PostgreSQL server in a new temporary directory (under base_dir if given) on a free port."""
    work_dir = _make_work_dir("postgres-", base_dir)
    server = PostgresServer(port=free_port(), datadir=work_dir / "data", logical=logical, tls=tls,
                            remove_on_stop=True)
    return server.start()


def start_source(source_type: str, base_dir: Path | None = None) -> MariaDbServer | PostgresServer:
    """Start a source server of a bench's source type (`mariadb`, `postgres`): MariaDB, or PostgreSQL with logical
    decoding for capture."""
    starts = {"mariadb": lambda: start_mariadb(base_dir), "postgres": lambda: start_postgres(base_dir, logical=True)}
    return starts[source_type]()


@dataclass
class MariaDbServer:
    """A mariadbd process with binary logging in ROW format; its files live in the parent of datadir."""

    port: int
    datadir: Path
    socket: Path
    root_password: str = ""
    host: str = LOOPBACK_HOST
    # TLS only: a self-signed certificate for the host (`ca_file`), and TCP connections without TLS refused.
    tls: bool = False
    remove_on_stop: bool = False
    stop_at_exit: bool = True
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _attached_pid: int | None = field(default=None, init=False, repr=False)

    @property
    def work_dir(self) -> Path:
        """The directory holding datadir, the configuration file, the socket, the pid file and the log."""
        return self.datadir.parent

    @property
    def ca_file(self) -> Path:
        """The server's self-signed certificate: the root a client verifies it with (`tls` servers)."""
        return self.work_dir / "server.crt"

    @property
    def config_file(self) -> Path:
        """The my.cnf the server is started with (no other option file is read)."""
        return self.work_dir / "my.cnf"

    @property
    def log_file(self) -> Path:
        """The server's error log (its standard output and error)."""
        return self.work_dir / "mariadb.log"

    @property
    def pid_file(self) -> Path:
        """The file mariadbd writes its process id to while it runs."""
        return self.work_dir / "mariadb.pid"

    @property
    def pid(self) -> int | None:
        """The mariadbd process id while this object runs or has attached to the server, else None."""
        if self._process is not None:
            return self._process.pid
        return self._attached_pid

    def start(self) -> MariaDbServer:
        """Initialise datadir, start mariadbd and wait until it accepts connections; does nothing if running.

        Raises RuntimeError with the tail of the server log when the server does not accept connections
        within 60 seconds.
        """
        if self.pid is not None:
            return self
        ensure_mariadb_installed()
        executables = _mariadb_executables()
        if executables is None:
            raise RuntimeError("MariaDB binaries not found; call ensure_mariadb_installed()")
        mariadbd, install_db = executables
        _check_socket_path(self.socket)
        self.datadir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        try:
            self._install_system_tables(install_db)
            self._spawn(mariadbd)
            _register(self)
            self._wait_until_ready(INITIAL_ROOT_PASSWORD)
            self._remove_anonymous_users()
            if self.root_password:
                self._set_root_password()
        except Exception as error:
            log_tail = _tail(self.log_file)
            self.stop()
            if self.remove_on_stop:
                _remove_work_dir(self.work_dir)
            raise RuntimeError(f"MariaDB on port {self.port} did not start: {error}\n{log_tail}") from error
        logger.info("MariaDB started on %s:%d (datadir %s)", self.host, self.port, self.datadir)
        return self

    def attach(self) -> MariaDbServer:
        """Adopt the mariadbd already running from this work_dir (started by another process); does nothing if running.

        Raises RuntimeError when the pid file names no live process or the server does not accept
        connections on its socket.
        """
        if self.pid is not None:
            return self
        pid = _read_pid(self.pid_file)
        if pid is None or not _process_is_alive(pid):
            raise RuntimeError(f"no MariaDB process running from {self.work_dir} (pid file {self.pid_file})")
        import pymysql

        try:
            socket_module.create_connection((self.host, self.port), timeout=5).close()
            self._connect(None).close()
        except (OSError, pymysql.MySQLError) as error:
            raise RuntimeError(f"MariaDB pid {pid} on port {self.port} does not accept connections: {error}") from error
        self._attached_pid = pid
        _register(self)
        logger.info("attached to MariaDB on %s:%d (pid %d)", self.host, self.port, pid)
        return self

    def stop(self) -> None:
        """Shut the server down cleanly, killing it after 30 s, and remove its files; does nothing if stopped."""
        process, self._process = self._process, None
        attached_pid, self._attached_pid = self._attached_pid, None
        _unregister(self)
        if process is None and attached_pid is None:
            return
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                logger.warning("MariaDB on port %d did not stop in %d s; killing it", self.port, STOP_TIMEOUT_SECONDS)
                process.kill()
                process.wait()
        if attached_pid is not None:
            _terminate_pid(attached_pid, f"MariaDB on port {self.port}")
        logger.info("MariaDB on port %d stopped", self.port)
        if self.remove_on_stop:
            _remove_work_dir(self.work_dir)

    def restart(self, while_down: Callable[[], None] | None = None) -> None:
        """Shuts the server down cleanly (open connections are cut), calls while_down, starts it again: same port,
        data and binlog."""
        process = self._process
        if process is None or process.poll() is not None:
            raise RuntimeError(f"MariaDB on port {self.port} is not running (or was not started by this object)")
        process.terminate()
        process.wait(timeout=STOP_TIMEOUT_SECONDS)
        try:
            if while_down is not None:
                while_down()
        finally:
            executables = _mariadb_executables()
            assert executables is not None, "the binaries of the server that just ran"
            self._spawn(executables[0])
            self._wait_until_ready(self.root_password)
        logger.info("MariaDB on port %d restarted", self.port)

    def _spawn(self, mariadbd: Path) -> None:
        with open(self.log_file, "ab") as log:
            self._process = subprocess.Popen(
                [str(mariadbd), f"--defaults-file={self.config_file}"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.work_dir,
                start_new_session=True,
            )

    def execute(self, sql: str | list[str], database: str | None = None) -> None:
        """Run one statement or a list of statements as root, in autocommit mode."""
        statements = [sql] if isinstance(sql, str) else sql
        with self._connect(database) as connection, connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)

    def query(self, sql: str, database: str | None = None) -> list[tuple]:
        """Run one statement as root and return its rows."""
        with self._connect(database) as connection, connection.cursor() as cursor:
            cursor.execute(sql)
            return list(cursor.fetchall())

    def connect(self, database: str | None = None) -> pymysql.connections.Connection:
        """Open a root connection over the unix socket in autocommit mode, for parameterised statements; close it."""
        return self._connect(database)

    def create_capture_user(self, user: str, password: str) -> None:
        """Create (or replace) user at '%', '127.0.0.1' and 'localhost' with the privileges binlog capture needs."""
        with self._connect(None) as connection, connection.cursor() as cursor:
            for host in CAPTURE_USER_HOSTS:
                cursor.execute("CREATE OR REPLACE USER %s@%s IDENTIFIED BY %s", (user, host, password))
                cursor.execute(GRANT_CAPTURE_PRIVILEGES, (user, host))

    def __enter__(self) -> MariaDbServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _connect(self, database: str | None, password: str | None = None) -> pymysql.connections.Connection:
        """Connect as root over the unix socket, with root_password unless another password is given."""
        try:
            import pymysql
        except ImportError as error:
            raise RuntimeError("MariaDbServer.execute/query need PyMySQL (pip install 'cdc-pipeline[dev]')") from error
        return pymysql.connect(
            unix_socket=str(self.socket),
            user="root",
            password=self.root_password if password is None else password,
            database=database,
            autocommit=True,
            charset="utf8mb4",
            connect_timeout=5,
        )

    def _write_config(self) -> None:
        settings = {
            "datadir": self.datadir,
            "port": self.port,
            "bind-address": self.host,
            "socket": self.socket,
            "pid-file": self.pid_file,
            "tmpdir": self.work_dir,
            "server_id": 1,
            "log_bin": self.datadir / "mariadb-bin",
            "binlog_format": "ROW",
            "binlog_row_image": "FULL",
            "expire_logs_days": 1,
            "character-set-server": "utf8mb4",
            "collation-server": "utf8mb4_general_ci",
            "innodb_buffer_pool_size": "64M",
            "innodb_log_file_size": "32M",
            "innodb_flush_log_at_trx_commit": 2,
            "sync_binlog": 0,
            # Rows of values of many MB (the large-values load tests, the bench): MariaDB refuses a row, or makes
            # NULL a string (REPEAT, CONCAT), larger than this.
            "max_allowed_packet": "1G",
        }
        if _running_as_root():
            settings["user"] = "root"
        if self.tls:
            key = self.work_dir / "server.key"
            if not self.ca_file.exists():
                _run_command(_certificate_command(self.host, key, self.ca_file), cwd=self.work_dir)
            # Connections over the socket count as secure: root's stay as they are.
            settings.update({"ssl_cert": self.ca_file, "ssl_key": key, "require_secure_transport": "ON"})
        lines = ["[mysqld]", *(f"{name} = {value}" for name, value in settings.items())]
        self.config_file.write_text("\n".join(lines) + "\n")

    def _install_system_tables(self, install_db: Path) -> None:
        # "normal" gives a passwordless root@localhost usable over the socket whatever OS user we run as.
        command = [
            str(install_db),
            f"--defaults-file={self.config_file}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ]
        if _running_as_root():
            command.append("--user=root")
        _run_command(command, cwd=self.work_dir, timeout=START_TIMEOUT_SECONDS)

    def _wait_until_ready(self, password: str) -> None:
        import pymysql

        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            if self._process is None or self._process.poll() is not None:
                raise RuntimeError("mariadbd exited")
            try:
                self._connect(None, password=password).close()
                return
            except pymysql.err.OperationalError as error:
                if error.args and error.args[0] == MYSQL_ACCESS_DENIED:
                    raise
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no connection after {START_TIMEOUT_SECONDS} s") from None
                time.sleep(0.1)

    def _remove_anonymous_users(self) -> None:
        # mariadb-install-db creates ''@'localhost' and ''@'<hostname>', which match before a named user's '%' entry.
        with self._connect(None, password=INITIAL_ROOT_PASSWORD) as connection, connection.cursor() as cursor:
            cursor.execute("SELECT User, Host FROM mysql.user WHERE User = ''")
            for user, host in cursor.fetchall():
                cursor.execute("DROP USER %s@%s", (user, host))

    def _set_root_password(self) -> None:
        with self._connect(None, password=INITIAL_ROOT_PASSWORD) as connection, connection.cursor() as cursor:
            cursor.execute("SELECT Host FROM mysql.user WHERE User = 'root'")
            for (host,) in cursor.fetchall():
                cursor.execute("ALTER USER 'root'@%s IDENTIFIED BY %s", (host, self.root_password))


@dataclass
class PostgresServer:
    """A PostgreSQL cluster with trust authentication, run by the postgres OS user when we are root."""

    port: int
    datadir: Path
    superuser: str = "postgres"
    host: str = LOOPBACK_HOST
    logical: bool = False
    # TLS only: a self-signed certificate for the host (`ca_file`), and TCP connections without TLS refused.
    tls: bool = False
    remove_on_stop: bool = False
    stop_at_exit: bool = True
    _running: bool = field(default=False, init=False, repr=False)

    @property
    def ca_file(self) -> Path:
        """The server's self-signed certificate: the root a client verifies it with (`tls` servers)."""
        return self.datadir / "server.crt"

    @property
    def work_dir(self) -> Path:
        """The directory holding datadir, the unix socket and the server log."""
        return self.datadir.parent

    @property
    def log_file(self) -> Path:
        """The server log written by pg_ctl -l."""
        return self.work_dir / "postgresql.log"

    @property
    def pid(self) -> int | None:
        """The postmaster's process id from postmaster.pid, or None when the file is missing or unreadable."""
        return _read_pid(self.datadir / "postmaster.pid")

    def start(self) -> PostgresServer:
        """Initialise datadir and start the server with pg_ctl -w; does nothing if running.

        Raises RuntimeError with the tail of the server log when pg_ctl cannot start the server within
        60 seconds.
        """
        if self._running:
            return self
        ensure_postgres_installed()
        _check_socket_path(self.work_dir / f".s.PGSQL.{self.port}")
        self._prepare_work_dir()
        try:
            self._initdb()
            self._write_settings()
            _register(self)
            self._running = True
            self._pg_ctl(
                ["start", "-w", "-t", str(START_TIMEOUT_SECONDS), "-l", str(self.log_file)],
                timeout=START_TIMEOUT_SECONDS + 10,
            )
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
            log_tail = _tail(self.log_file)
            self.stop()
            if self.remove_on_stop:
                _remove_work_dir(self.work_dir)
            raise RuntimeError(f"PostgreSQL on port {self.port} did not start: {error}\n{log_tail}") from error
        logger.info("PostgreSQL started on %s:%d (datadir %s)", self.host, self.port, self.datadir)
        return self

    def attach(self) -> PostgresServer:
        """Adopt the cluster already running from this datadir (started by another process); does nothing if running.

        Raises RuntimeError when postmaster.pid names no live process or the server does not accept connections.
        """
        if self._running:
            return self
        pid = self.pid
        if pid is None or not _process_is_alive(pid):
            raise RuntimeError(f"no PostgreSQL postmaster running from {self.datadir}")
        try:
            psycopg.connect(self.dsn(), connect_timeout=5).close()
        except psycopg.Error as error:
            raise RuntimeError(f"PostgreSQL pid {pid} on port {self.port} does not accept connections: {error}") from error
        self._running = True
        _register(self)
        logger.info("attached to PostgreSQL on %s:%d (pid %d)", self.host, self.port, pid)
        return self

    def stop(self) -> None:
        """Stop with pg_ctl -m fast, falling back to immediate and then SIGKILL, and remove its files; idempotent."""
        was_running, self._running = self._running, False
        _unregister(self)
        if not was_running:
            return
        if (self.datadir / "postmaster.pid").exists():
            self._shut_down()
        logger.info("PostgreSQL on port %d stopped", self.port)
        if self.remove_on_stop:
            _remove_work_dir(self.work_dir)

    def restart(self) -> None:
        """Restarts the running server (pg_ctl restart -m fast: open connections are cut), same port and data."""
        if not self._running:
            raise RuntimeError(f"PostgreSQL on port {self.port} is not running")
        self._pg_ctl(["restart", "-w", "-m", "fast", "-t", str(START_TIMEOUT_SECONDS), "-l", str(self.log_file)],
                     timeout=START_TIMEOUT_SECONDS + STOP_TIMEOUT_SECONDS + 10)
        logger.info("PostgreSQL on port %d restarted", self.port)

    def dsn(self, dbname: str = "postgres", user: str | None = None, password: str | None = None) -> str:
        """Return a libpq URI for a TCP connection to dbname, as user (the superuser by default)."""
        credentials = quote(user or self.superuser, safe="")
        if password is not None:
            credentials += ":" + quote(password, safe="")
        return f"postgresql://{credentials}@{self.host}:{self.port}/{quote(dbname, safe='')}"

    def execute(self, sql: str | list[str], dbname: str = "postgres") -> None:
        """Run one statement or a list of statements as the superuser, in autocommit mode."""
        statements = [sql] if isinstance(sql, str) else sql
        with psycopg.connect(self.dsn(dbname), autocommit=True) as connection:
            for statement in statements:
                connection.execute(statement)

    def query(self, sql: str, dbname: str = "postgres") -> list[tuple]:
        """Run one statement as the superuser and return its rows."""
        with psycopg.connect(self.dsn(dbname), autocommit=True) as connection:
            return connection.execute(sql).fetchall()

    def create_database(self, name: str) -> None:
        """Create database name; does nothing if it already exists."""
        with psycopg.connect(self.dsn(), autocommit=True) as connection:
            exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if exists is None:
                connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def drop_database(self, name: str) -> None:
        """Drop database name, ending its connections; does nothing if it does not exist."""
        with psycopg.connect(self.dsn(), autocommit=True) as connection:
            connection.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _prepare_work_dir(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if not _running_as_root():
            return
        _grant_traverse_to_ancestors(self.work_dir)
        owner = pwd.getpwnam(POSTGRES_OS_USER)
        os.chown(self.work_dir, owner.pw_uid, owner.pw_gid)

    def _initdb(self) -> None:
        base_command = [
            str(self._bin("initdb")),
            "-D", str(self.datadir),
            "-U", self.superuser,
            "-A", "trust",
            "-E", "UTF8",
            "--no-sync",
        ]  # fmt: skip
        try:
            self._run_as_server_user([*base_command, "--locale=C.UTF-8"])
        except RuntimeError:
            logger.info("initdb with locale C.UTF-8 failed; retrying with locale C")
            shutil.rmtree(self.datadir, ignore_errors=True)
            self._run_as_server_user([*base_command, "--locale=C"])

    def _write_settings(self) -> None:
        settings = {
            "listen_addresses": _conf_string(self.host),
            "port": self.port,
            "unix_socket_directories": _conf_string(str(self.work_dir)),
            "fsync": "off",
            "full_page_writes": "off",
            "synchronous_commit": "off",
            "shared_buffers": "128MB",
            "max_connections": 100,
        }
        if self.logical:
            settings.update(wal_level="logical", max_replication_slots=10, max_wal_senders=10)
        if self.tls:
            self._make_certificate()
            settings.update(ssl="on", ssl_cert_file=_conf_string(str(self.ca_file)),
                            ssl_key_file=_conf_string(str(self.datadir / "server.key")))
            (self.datadir / "pg_hba.conf").write_text(
                "local all all trust\n"
                f"hostssl all all {self.host}/32 trust\n"
                f"hostssl replication all {self.host}/32 trust\n"
                "hostnossl all all all reject\n")
        lines = ["", "# throwaway server settings written by cdc_pipeline.testing.servers"]
        lines += [f"{name} = {value}" for name, value in settings.items()]
        with open(self.datadir / "postgresql.conf", "a", encoding="utf-8") as config:
            config.write("\n".join(lines) + "\n")

    def _shut_down(self) -> None:
        for mode in ("fast", "immediate"):
            try:
                self._pg_ctl(
                    ["stop", "-w", "-m", mode, "-t", str(STOP_TIMEOUT_SECONDS)], timeout=STOP_TIMEOUT_SECONDS + 10
                )
                return
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                logger.warning("pg_ctl stop -m %s failed for port %d: %s", mode, self.port, error)
        self._kill_postmaster()

    def _kill_postmaster(self) -> None:
        postmaster_pid = self.pid
        if postmaster_pid is None:
            logger.warning("could not kill PostgreSQL on port %d: no readable postmaster.pid", self.port)
            return
        try:
            os.kill(postmaster_pid, signal.SIGKILL)
            logger.warning("killed PostgreSQL postmaster %d on port %d", postmaster_pid, self.port)
        except OSError as error:
            logger.warning("could not kill PostgreSQL on port %d: %s", self.port, error)

    def _pg_ctl(self, arguments: list[str], timeout: float) -> None:
        self._run_as_server_user([str(self._bin("pg_ctl")), "-D", str(self.datadir), "-s", *arguments], timeout)

    def _make_certificate(self) -> None:
        key = self.datadir / "server.key"
        self._run_as_server_user(_certificate_command(self.host, key, self.ca_file))
        self._run_as_server_user(["chmod", "600", str(key)])

    def _run_as_server_user(self, command: list[str], timeout: float | None = None) -> None:
        if _running_as_root():
            owner = pwd.getpwnam(POSTGRES_OS_USER)
            identity: dict[str, Any] = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}
        else:
            identity = {}
        _run_command(command, cwd=self.work_dir, timeout=timeout, **identity)

    @staticmethod
    def _bin(program: str) -> Path:
        bin_dir = _postgres_bin_dir()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL binaries not found; call ensure_postgres_installed()")
        return bin_dir / program


def _mariadb_executables() -> tuple[Path, Path] | None:
    mariadbd = _find_executable("mariadbd")
    install_db = _find_executable("mariadb-install-db")
    if mariadbd is None or install_db is None:
        return None
    return mariadbd, install_db


def _find_executable(name: str) -> Path | None:
    found = shutil.which(name)
    if found:
        return Path(found)
    for directory in ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"):
        candidate = Path(directory) / name
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _postgres_bin_dir() -> Path | None:
    """The bin directory of the newest PostgreSQL under /usr/lib/postgresql, else the one holding pg_ctl on PATH."""
    candidates = [path for path in POSTGRES_INSTALL_ROOT.glob("*/bin") if (path / "initdb").exists()]
    if candidates:
        return max(candidates, key=lambda path: _version_key(path.parent.name))
    pg_ctl = shutil.which("pg_ctl")
    return Path(pg_ctl).parent if pg_ctl else None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def _certificate_command(host: str, key: Path, certificate: Path) -> list[str]:
    """openssl making a self-signed certificate for `host` (an IP address) and its key."""
    return ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={host}",
            "-addext", f"subjectAltName=IP:{host},DNS:localhost", "-keyout", str(key), "-out", str(certificate)]


def _apt_install(packages: list[str]) -> None:
    global _apt_index_updated
    if not _running_as_root():
        raise RuntimeError(f"missing {' '.join(packages)}; installing needs root (apt-get)")
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not _apt_index_updated:
        _run_command(["apt-get", "update", "-q"], env=environment, timeout=600)
        _apt_index_updated = True
    _run_command(["apt-get", "install", "-y", "-q", *packages], env=environment, timeout=1800)


def _ensure_postgres_os_user() -> None:
    try:
        pwd.getpwnam(POSTGRES_OS_USER)
    except KeyError:
        logger.info("creating OS user %s", POSTGRES_OS_USER)
        _run_command(["useradd", "--system", "--user-group", "--no-create-home", POSTGRES_OS_USER])


def _run_command(command: list[str], timeout: float | None = None, **options: Any) -> None:
    """Run command with stdin closed and output captured; raise RuntimeError with the output if it fails."""
    logger.debug("running %s", " ".join(command))
    result = subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False, **options
    )
    if result.returncode != 0:
        output = "\n".join((result.stdout + result.stderr).strip().splitlines()[-LOG_TAIL_LINES:])
        raise RuntimeError(f"{Path(command[0]).name} exited with {result.returncode}:\n{output}")


def _running_as_root() -> bool:
    return os.geteuid() == 0


def _make_work_dir(prefix: str, base_dir: Path | None) -> Path:
    if base_dir is not None:
        base_dir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base_dir))


def _grant_traverse_to_ancestors(path: Path) -> None:
    """Let other users (the postgres OS user) pass through path's ancestors, e.g. pytest's 0700 tmp dirs."""
    for ancestor in path.resolve().parents:
        mode = ancestor.stat().st_mode
        if not mode & stat.S_IXOTH:
            logger.info("adding o+x to %s so the %s user can reach its data directory", ancestor, POSTGRES_OS_USER)
            ancestor.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def _check_socket_path(socket_path: Path) -> None:
    if len(str(socket_path)) > MAX_UNIX_SOCKET_PATH:
        raise RuntimeError(f"unix socket path too long ({len(str(socket_path))} > {MAX_UNIX_SOCKET_PATH}): {socket_path}")


def _conf_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _tail(log_file: Path) -> str:
    try:
        lines = log_file.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {log_file})"
    return "\n".join(lines[-LOG_TAIL_LINES:])


def _read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _process_is_alive(pid: int) -> bool:
    """Tell whether pid is a running process; a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        # /proc/<pid>/stat is "pid (comm) state ..."; comm may hold spaces and parentheses.
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def end_process_group(process: subprocess.Popen, wait_seconds: float = 30) -> None:
    """Ends a child started in its own session (a daemon, a pipeline server) and what it started: SIGTERM to its
    process group, SIGKILL after `wait_seconds`, then SIGKILL to what is left of the group (a daemon's run workers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=wait_seconds)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _terminate_pid(pid: int, description: str) -> None:
    """Send SIGTERM to a process that is not our child and wait for it to exit, killing it after 30 s."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
    while _process_is_alive(pid):
        if time.monotonic() > deadline:
            logger.warning("%s did not stop in %d s; killing it", description, STOP_TIMEOUT_SECONDS)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        time.sleep(0.1)


def _remove_work_dir(work_dir: Path) -> None:
    if not work_dir.exists():
        return
    if os.environ.get(KEEP_SERVERS_ENV) == "1":
        logger.info("keeping %s because %s=1", work_dir, KEEP_SERVERS_ENV)
        return
    try:
        shutil.rmtree(work_dir)
    except OSError as error:
        logger.warning("could not remove %s: %s", work_dir, error)


def _register(server: MariaDbServer | PostgresServer) -> None:
    if server.stop_at_exit:
        _running_servers[id(server)] = server


def _unregister(server: MariaDbServer | PostgresServer) -> None:
    _running_servers.pop(id(server), None)


@atexit.register
def _stop_running_servers() -> None:
    """Stop every server still running when the interpreter exits (a test was interrupted or forgot to stop)."""
    for server in list(_running_servers.values()):
        try:
            server.stop()
        except Exception:
            logger.exception("could not stop %s at exit", server)
