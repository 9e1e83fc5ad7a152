"""A pipeline server started for the runs that find none configured: Dagster's runs of `sync_<name>` ask for one
(`ensure`) when CDC_PIPELINE_SERVER names none, so that the runs of many connectors share one warm driver JVM instead
of starting one each.

One server per connectors file and build: the first run that finds none starts `cdc-pipeline serve` in its own
session (it outlives the run, and Dagster's code servers), with a fresh token, and waits until it answers; runs that
ask meanwhile wait for the same server (a lock per connectors file), and every later run has its cycle served there.
The server stops once no cycle has run for `CDC_PIPELINE_AUTO_SERVE_IDLE_SECONDS` (900), and a run after that
starts another. A server of another build of the same connectors file (the runner's jar or the package's code
changed, or the environment the file names: a secret, a Spark setting) is stopped and a new one started, so that no
run is served by code or secrets older than its own.

Its files live in a directory of the user's alone (CDC_PIPELINE_RUNTIME_DIR, else $XDG_RUNTIME_DIR/cdc-pipeline,
else /tmp/cdc-pipeline-<uid>; made 0700, refused when another user owns it or may enter it): the socket (0600), the
token (0600, never logged), the server's pid and its log. The server has the environment of the run that started
it. `CDC_PIPELINE_AUTO_SERVE=0` turns this off: runs then go cold, each in its own process, as `cdc-pipeline sync`
does.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Mapping

from cdc_pipeline.capture.runner import RUNNER_JAR
from cdc_pipeline.capture.spark_home import files_key
from cdc_pipeline.errors import CdcError
from cdc_pipeline.ops.pipeline_server import SERVER_ENV, TOKEN_ENV, serves

log = logging.getLogger(__name__)

AUTO_SERVE_ENV = "CDC_PIPELINE_AUTO_SERVE"  # "0" (or false, no, off): runs without a configured server go cold
RUNTIME_DIR_ENV = "CDC_PIPELINE_RUNTIME_DIR"
IDLE_EXIT_ENV = "CDC_PIPELINE_AUTO_SERVE_IDLE_SECONDS"
DEFAULT_IDLE_EXIT_SECONDS = 900.0
START_WAIT_SECONDS = 180.0  # how long a run waits for the server it started (or another run starts) to answer
FAILED_RETRY_SECONDS = 600.0  # after a start failed, runs are tagged as starting their own JVM for this long
SOCKET_PATH_LIMIT = 107  # bytes of a Unix socket's path (sun_path, its terminating NUL aside)
STOP_WAIT_SECONDS = 150.0  # how long a server of another build gets to end its cycles (each as a pause does)
# Variables of the environment a server's cycles depend on beside those the connectors file names.
_ENVIRONMENT = re.compile(r"^(CDC_|SPARK_|PYSPARK_|JAVA_HOME$|HADOOP_)")
_NAMED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def enabled(environment: Mapping[str, str] | None = None) -> bool:
    """Whether runs without a configured server have one started for them (CDC_PIPELINE_AUTO_SERVE of this process's
    environment, or of `environment`; default on)."""
    value = (os.environ if environment is None else environment).get(AUTO_SERVE_ENV, "1")
    return value.strip().lower() not in ("0", "false", "no", "off")


def runtime_dir() -> Path:
    """The directory of the started servers' files, made if missing; refused unless this user alone may use it."""
    given = os.environ.get(RUNTIME_DIR_ENV)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    directory = Path(given) if given else Path(xdg) / "cdc-pipeline" if xdg else \
        Path("/tmp") / f"cdc-pipeline-{os.getuid()}"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    stat = directory.lstat()
    if stat.st_uid != os.getuid() or stat.st_mode & 0o077 or directory.is_symlink():
        raise CdcError(f"the pipeline servers' directory {directory} must be a directory of this user alone (mode "
                       f"0700): set {RUNTIME_DIR_ENV} to another")
    return directory


def build_key(config_path: str) -> str:
    """Names what a server's cycles depend on beside the connectors file's text: the runner's jar, the package's
    code, and the values of the environment variables the file names and of CDC_*, SPARK_*, JAVA_HOME (hashed)."""
    try:
        named = set(_NAMED.findall(Path(config_path).read_text()))
    except OSError:
        named = set()
    names = sorted(named | {name for name in os.environ if _ENVIRONMENT.match(name)} - {SERVER_ENV, TOKEN_ENV})
    environment = hashlib.sha256("\n".join(f"{name}={os.environ.get(name, '')}" for name in names).encode())
    code = sorted(PACKAGE_DIR.rglob("*.py"))
    return files_key([RUNNER_JAR, *code], head=f"{sys.executable}\n{environment.hexdigest()}")[:12]


def ensure(config_path: str) -> tuple[str, str] | None:
    """The socket and token of the started server of this connectors file and build, starting it when none answers;
    None when this is turned off or no server could be had (the run then goes cold, saying why)."""
    if not enabled():
        return None
    try:
        return _ensure(config_path)
    except (OSError, CdcError) as exc:
        message = exc.message if isinstance(exc, CdcError) else str(exc)
        log.warning("no pipeline server could be started (%s): the run goes cold, in its own process", message)
        return None


def will_serve(config_path: str) -> bool:
    """Whether a Dagster run of this process's environment would have its cycle served: by the server
    CDC_PIPELINE_SERVER names (it answers), or, when that names none, by the server started for this connectors
    file and build (it answers, or a run can start it: its directory and socket path do, and no start of it failed
    in the last FAILED_RETRY_SECONDS)."""
    if os.environ.get(SERVER_ENV):
        return serves()
    if not enabled():
        return False
    try:
        stem = _stem(config_path)
    except (OSError, CdcError):
        return False
    try:
        return time.time() - stem.with_suffix(".failed").stat().st_mtime >= FAILED_RETRY_SECONDS
    except FileNotFoundError:
        return True
    except OSError:
        return False


def file_key(config_path: str) -> str:
    """Names a connectors file (its resolved path) in the servers' directory."""
    return hashlib.sha256(config_path.encode()).hexdigest()[:12]


def _stem(config_path: str) -> Path:
    """The path of the files of the server of this connectors file and build, without their suffix; refused when its
    socket's path would be too long."""
    stem = runtime_dir() / f"{file_key(config_path)}-{build_key(config_path)}"
    if len(f"{stem}.sock".encode()) > SOCKET_PATH_LIMIT:
        raise CdcError(f"the server's socket {stem}.sock is longer than a Unix socket's {SOCKET_PATH_LIMIT} bytes: "
                       f"set {RUNTIME_DIR_ENV} to a shorter directory")
    return stem


def _ensure(config_path: str) -> tuple[str, str] | None:
    stem = _stem(config_path)
    directory, key = stem.parent, file_key(config_path)
    socket_path, token_path = f"{stem}.sock", stem.with_suffix(".token")
    with _locked(directory / f"{key}.lock"):
        if token_path.exists():
            target = (socket_path, token_path.read_text().strip())
            if serves(server=target):
                return target
        stop_servers(directory, key, keep=stem.name)
        token = secrets.token_hex(16)
        descriptor = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as written:
            written.write(token)
        target = (socket_path, token)
        process = _start(config_path, stem, target)
        deadline = time.monotonic() + START_WAIT_SECONDS
        while not serves(server=target):
            if process.poll() is not None or time.monotonic() >= deadline:
                _end(process.pid)
                stem.with_suffix(".failed").touch()  # runs go cold, tagged so, until FAILED_RETRY_SECONDS passed
                what = f"ended (exit status {process.returncode})" if process.returncode is not None else \
                    f"did not answer within {START_WAIT_SECONDS:.0f} s"
                raise CdcError(f"the pipeline server it started {what}; its log {stem}.log ends: "
                               f"{_tail(stem.with_suffix('.log'))}")
            time.sleep(0.2)
        stem.with_suffix(".failed").unlink(missing_ok=True)
        log.info("started a pipeline server at %s (pid %d) for the runs of %s", socket_path, process.pid, config_path)
        return target


def _start(config_path: str, stem: Path, target: tuple[str, str]) -> subprocess.Popen:
    """Starts `cdc-pipeline serve` in its own session, on this environment with the server's token."""
    environment = {name: value for name, value in os.environ.items() if name != SERVER_ENV}
    environment[TOKEN_ENV] = target[1]
    idle = os.environ.get(IDLE_EXIT_ENV) or str(DEFAULT_IDLE_EXIT_SECONDS)
    with open(stem.with_suffix(".log"), "w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "cdc_pipeline.ops.cli", "serve", "--config", config_path, "--socket", target[0],
             "--idle-exit", idle], env=environment, stdin=subprocess.DEVNULL, stdout=output,
            stderr=subprocess.STDOUT, start_new_session=True, cwd=str(PACKAGE_DIR.parent))
    stem.with_suffix(".pid").write_text(str(process.pid))
    return process


def stop_servers(directory: Path, key: str | None = None, keep: str | None = None) -> list[int]:
    """Stops the started servers whose files are in `directory` (of the connectors file `key` names, all when None)
    but `keep` (a stem): SIGTERM, each cycle ending as a pause does, then SIGKILL after STOP_WAIT_SECONDS; returns
    their pids."""
    stopped = []
    for pid_file in sorted(directory.glob(f"{key or ''}*.pid")):
        if pid_file.stem == keep:
            continue
        pid = _server_pid(pid_file)
        if pid is not None:
            log.info("stopping the pipeline server %s (pid %d)", pid_file.stem, pid)
            _end(pid)
            stopped.append(pid)
        for suffix in (".pid", ".token", ".sock"):
            pid_file.with_suffix(suffix).unlink(missing_ok=True)
    return stopped


def _server_pid(pid_file: Path) -> int | None:
    """The pid in the file, if that process is still the server it names (a pid may have been reused)."""
    try:
        pid = int(pid_file.read_text().strip())
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if f"{pid_file.with_suffix('.sock')}".encode() in command else None


def _end(pid: int) -> None:
    """SIGTERM to the server's session, then SIGKILL once STOP_WAIT_SECONDS passed."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_WAIT_SECONDS
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or _zombie(pid):
            return
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _zombie(pid: int) -> bool:
    try:
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
            os.waitpid(pid, os.WNOHANG)  # a child of this process: reaped
            return True
    except (OSError, IndexError, ChildProcessError):
        return True
    return False


class _locked:
    """An exclusive lock on the file, taken within START_WAIT_SECONDS and STOP_WAIT_SECONDS (a run that holds it may
    stop a server of another build, then start one)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.file = open(self.path, "a")
        deadline = time.monotonic() + START_WAIT_SECONDS + STOP_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self.file.close()
                    raise CdcError(f"another run held {self.path} for {START_WAIT_SECONDS + STOP_WAIT_SECONDS:.0f} s")
                time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:]) or "(empty)"
    except OSError:
        return "(none)"


def servers(directory: Path) -> Iterator[int]:
    """The pids of the started servers running with files in `directory`."""
    for pid_file in sorted(directory.glob("*.pid")):
        pid = _server_pid(pid_file)
        if pid is not None:
            yield pid
