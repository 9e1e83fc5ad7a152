"""`cdc-pipeline serve`: a long-lived pipeline server that keeps the driver JVM and its Spark session warm between
runs, and runs connectors' fetch cycles for the `cdc-pipeline sync` processes that ask it.

A `sync` whose environment names a server (CDC_PIPELINE_SERVER: the path of its Unix socket) sends it the cycle
(the connector's name, `--linger`, `--start-offset`) with the server's token (CDC_PIPELINE_SERVER_TOKEN), receives
the cycle's log lines as they come, and prints the cycle's summary as a cold run does. A server that is not there
(no socket, nothing listening) leaves the sync to run cold, in its own process, with a warning; a server that
refuses the sync (a wrong token, another connectors file) fails it, saying why.

What holds, the same as for a cold run: a cycle is the one `run_sync` runs (the connector's pending requests
served, the change check, the preflight, the cycle with its run lock); its state, offsets and stats live in the
destination; the offset moves only after the destination's commit. A client that goes away (killed, its
connection closed) ends its cycle as a pause does: at the next cut between source transactions, what was applied
committed and marked complete, nothing else; the next run goes on from there. A server that dies loses nothing:
its cycles' uncommitted groups are rolled back by the destination, and the next runs start from the applied
position (cold, until a server is there again).

The server reads the connectors file named by its own environment (CDC_PIPELINE_CONFIG) for each cycle, so a
connector added or changed is served without a restart; the source and destination secrets are the server's
environment's. The Spark settings (`spark:` of the file) are those of the server's start: a change needs a restart
of the server, as an upgrade of the runner or of Debezium does. The socket is made readable and writable by its
owner alone; the token is compared in constant time.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import queue
import signal
import socket
import socketserver
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from cdc_pipeline.config import CONFIG_PATH_ENV, config_path, load_config
from cdc_pipeline.errors import CdcError
from cdc_pipeline.run_progress import process_started_epoch

log = logging.getLogger(__name__)

SERVER_ENV = "CDC_PIPELINE_SERVER"  # the server's socket, for `cdc-pipeline sync` (and `serve`'s default)
TOKEN_ENV = "CDC_PIPELINE_SERVER_TOKEN"  # the secret a client shows
PROTOCOL_VERSION = 1
REQUEST_LIMIT_BYTES = 1 << 20
# How long a stopping server waits for the cycles it runs to end (each ends as a pause does).
STOP_WAIT_SECONDS = 120.0
LINGER_YIELDS_SECONDS = 1.0  # how often a client asks whether its lingering cycle is to yield
SERVES_TIMEOUT_SECONDS = 2.0  # how long `serves` waits for the server's answer


class ServerRefused(CdcError):
    """The server answered and refused the cycle, or failed it: no cold run follows."""


def served_config_path() -> str:
    """The connectors file a server serves and a client names: this process's, resolved."""
    return str(config_path().resolve())


def _send(stream: Any, message: dict[str, Any]) -> None:
    stream.write((json.dumps(message, default=str) + "\n").encode())
    stream.flush()


class _Forward(logging.Handler):
    """Sends the log records of one cycle's threads (the handler's own, and those named after its connector: the
    run-ahead thread, the progress reporter) to its client, through a queue the handler drains."""

    def __init__(self, thread: threading.Thread, connector: str, lines: queue.Queue) -> None:
        super().__init__(logging.DEBUG)
        self.thread, self.suffix, self.lines = thread, f"-{connector}", lines

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread != self.thread.ident and not record.threadName.endswith(self.suffix):
            return
        try:
            self.lines.put({"log": {"level": record.levelno, "name": record.name,
                                    "message": record.getMessage()}})
        except Exception:  # noqa: BLE001 - a log line lost is no failure of the cycle
            self.handleError(record)


class _CycleHandler(socketserver.StreamRequestHandler):
    server: "PipelineServer"

    def handle(self) -> None:
        try:
            request = json.loads(self.rfile.readline(REQUEST_LIMIT_BYTES) or b"{}")
        except ValueError:
            _send(self.wfile, {"refused": "the request is not JSON"})
            return
        refusal = self.server.refusal(request)
        if refusal is not None:
            log.warning("refused a request: %s", refusal)
            _send(self.wfile, {"refused": refusal})
            return
        if request["command"] == "serves":
            _send(self.wfile, {"serves": True})
            return
        name = str(request["connector"])
        threading.current_thread().name = f"cdc-serve-{name}"
        cancelled = threading.Event()
        self.yields = False  # the client's word: other work waits for the machine (a Dagster run queue)
        self.stands = bool(request.get("stands"))  # ... and: the run stands (streams on between changes)
        watcher = threading.Thread(target=self._watch_client, args=(cancelled,), daemon=True,
                                   name=f"cdc-serve-watch-{name}")
        watcher.start()
        lines: queue.Queue = queue.Queue()
        forward = _Forward(threading.current_thread(), name, lines)
        logging.getLogger().addHandler(forward)
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def cycle() -> None:
            try:
                outcome["result"] = self.server.run(name, request, cancelled, lambda: self.yields,
                                                    (lambda: self.stands) if request.get("standing") else None)
            except Exception as exc:  # noqa: BLE001 - the client reports it, as a cold run would
                from cdc_pipeline.ops.cli import _root_cause

                cause = _root_cause(exc)
                outcome["error"] = str(cause)
                outcome["cdc_error"] = isinstance(cause, CdcError)
                log.warning("the cycle of %s failed: %s", name, cause)
            finally:
                done.set()
                lines.put(None)

        worker = threading.Thread(target=cycle, name=f"cdc-serve-cycle-{name}", daemon=True)
        forward.thread = worker
        with self.server.track(cancelled):
            worker.start()
            try:
                while (line := lines.get()) is not None:
                    self._send_quietly(line)
                worker.join()
            finally:
                logging.getLogger().removeHandler(forward)
        self._send_quietly(outcome)

    def _send_quietly(self, message: dict[str, Any]) -> None:
        try:
            _send(self.wfile, message)
        except OSError:
            pass  # the client went away: its watcher ended the cycle

    def _watch_client(self, cancelled: threading.Event) -> None:
        """Takes the client's messages during its cycle (`linger_yields`, `stands`), and ends the cycle as a pause
        does once the client's end of the connection closes."""
        try:
            while line := self.rfile.readline(REQUEST_LIMIT_BYTES):
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if isinstance(message, dict) and "linger_yields" in message:
                    self.yields = bool(message["linger_yields"])
                if isinstance(message, dict) and "stands" in message:
                    self.stands = bool(message["stands"])
        except OSError:
            pass
        if not cancelled.is_set():
            log.warning("the client of %s went away: its cycle ends at the next cut between source transactions",
                        threading.current_thread().name.removeprefix("cdc-serve-watch-"))
        cancelled.set()


class PipelineServer(socketserver.ThreadingUnixStreamServer):
    """The server: one warm Spark session (its driver JVM), a thread per client's cycle."""

    daemon_threads = True

    def __init__(self, socket_path: Path, token: str) -> None:
        from cdc_pipeline.capture.spark import SparkStart

        self.socket_path = socket_path
        self.token = token
        self.config_path = served_config_path()
        config = load_config(self.config_path)
        self.spark = SparkStart(config.spark)
        self.active: set[threading.Event] = set()
        self.last_busy = time.monotonic()  # when a cycle last started or ended
        self._lock = threading.Lock()
        if socket_path.exists() or socket_path.is_symlink():
            _refuse_if_listening(socket_path)
            socket_path.unlink()
        socket_path.parent.mkdir(parents=True, exist_ok=True)
        umask = os.umask(0o177)  # the socket: its owner's alone
        try:
            super().__init__(str(socket_path), _CycleHandler)
        finally:
            os.umask(umask)

    def refusal(self, request: dict[str, Any]) -> str | None:
        """Why the request is not served (None: it is)."""
        if not hmac.compare_digest(str(request.get("token", "")).encode(), self.token.encode()):
            return f"the token is not the server's (set {TOKEN_ENV} as the server's environment does)"
        if request.get("version") != PROTOCOL_VERSION:
            return f"protocol version {request.get('version')!r}, the server speaks {PROTOCOL_VERSION}: upgrade both"
        if request.get("command") not in ("sync", "serves") or (request["command"] == "sync"
                                                                 and not request.get("connector")):
            return "the server runs `sync` of a named connector only"
        if request.get("config_path") != self.config_path:
            return (f"the server serves the connectors file {self.config_path}, this sync reads "
                    f"{request.get('config_path')}: point both at one file ({CONFIG_PATH_ENV})")
        return None

    def run(self, name: str, request: dict[str, Any], cancelled: threading.Event,
            linger_yields: Callable[[], bool], stands: Callable[[], bool] | None) -> dict[str, Any]:
        """Runs the cycle; its summary, with what it applied per source table (`table_changes`)."""
        from cdc_pipeline.ops.cli import run_sync
        from cdc_pipeline.ops.tables import TableChanges, count_applied

        started = time.monotonic()
        changes = TableChanges()
        summary = run_sync(name, start_offset=request.get("start_offset"), linger=bool(request.get("linger")),
                           spark=self.spark, cancelled=cancelled, linger_yields=linger_yields,
                           watch=lambda plans: count_applied(plans, changes), stands=stands)
        log.info("served a cycle of %s in %.1f s", name, time.monotonic() - started)
        return {**summary, "served_by": str(self.socket_path),
                "table_changes": {table: changes.counts(table) for table in changes.tables()}}

    def track(self, cancelled: threading.Event) -> Any:
        server = self

        class _Tracked:
            def __enter__(self) -> None:
                with server._lock:
                    server.active.add(cancelled)
                    server.last_busy = time.monotonic()

            def __exit__(self, *exc: Any) -> None:
                with server._lock:
                    server.active.discard(cancelled)
                    server.last_busy = time.monotonic()

        return _Tracked()

    def idle_seconds(self) -> float:
        """How long no cycle has run here (0 while one runs)."""
        with self._lock:
            return 0.0 if self.active else time.monotonic() - self.last_busy

    def stop(self) -> None:
        """Ends every cycle as a pause does, waits for them (STOP_WAIT_SECONDS at most), and stops Spark."""
        with self._lock:
            active = list(self.active)
        for cancelled in active:
            cancelled.set()
        deadline = time.monotonic() + STOP_WAIT_SECONDS
        while self.active and time.monotonic() < deadline:
            time.sleep(0.1)
        self.server_close()
        self.socket_path.unlink(missing_ok=True)
        try:
            self.spark.session().stop()
        except Exception as exc:  # noqa: BLE001 - the process ends anyway
            log.warning("stopping Spark: %s", exc)


def _refuse_if_listening(path: Path) -> None:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return  # a socket left by a server that died
    finally:
        probe.close()
    raise CdcError(f"a pipeline server already listens on {path}")


def serve(socket_path: Path, idle_exit_seconds: float | None = None) -> int:
    """Runs the server until SIGTERM or SIGINT, or until no cycle has run for `idle_exit_seconds` (when given);
    returns the exit code."""
    token = os.environ.get(TOKEN_ENV)
    if not token:
        raise CdcError(f"the pipeline server needs a token: set {TOKEN_ENV} (the clients set the same)")
    server = PipelineServer(socket_path, token)
    server.spark.session()  # warm before the first client
    stopping = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stopping.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if idle_exit_seconds:
        threading.Thread(target=_exit_when_idle, args=(server, idle_exit_seconds, stopping), daemon=True,
                         name="cdc-serve-idle").start()
    log.warning("pipeline server listening on %s (connectors file %s)", socket_path, server.config_path)
    print(f"listening on {socket_path}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.stop()
    return 0


def _exit_when_idle(server: PipelineServer, idle_exit_seconds: float, stopping: threading.Event) -> None:
    while not stopping.wait(1.0):
        if server.idle_seconds() >= idle_exit_seconds:
            log.warning("no cycle for %.0f s: the pipeline server at %s stops", idle_exit_seconds,
                        server.socket_path)
            stopping.set()
            server.shutdown()
            return


def _target(server: tuple[str, str] | None) -> tuple[str | None, str]:
    """The server's socket and token: those given, else CDC_PIPELINE_SERVER's and CDC_PIPELINE_SERVER_TOKEN's."""
    if server is not None:
        return server
    return os.environ.get(SERVER_ENV), os.environ.get(TOKEN_ENV, "")


def serves(timeout_seconds: float = SERVES_TIMEOUT_SECONDS, server: tuple[str, str] | None = None) -> bool:
    """Whether a sync of this process would run its cycle on the server named by CDC_PIPELINE_SERVER (or `server`:
    its socket and token): one listens there and takes this process's token, protocol and connectors file. False
    when none is configured, none answers within `timeout_seconds`, or it would refuse (a sync then says why)."""
    path, token = _target(server)
    if not path:
        return False
    request = {"version": PROTOCOL_VERSION, "command": "serves", "token": token, "config_path": served_config_path()}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(timeout_seconds)
            client.connect(path)
            with client.makefile("rwb") as stream:
                _send(stream, request)
                answer = next(_messages(stream), {})
    except OSError:
        return False
    return answer.get("serves") is True


def served_sync(name: str, start_offset: str | None, linger: bool, linger_yields: Callable[[], bool] | None = None,
                on_log: Callable[[int, str, str], None] | None = None,
                server: tuple[str, str] | None = None,
                stands: Callable[[], bool] | None = None) -> dict[str, Any] | None:
    """Asks the server named by CDC_PIPELINE_SERVER (or `server`: its socket and token) for the cycle and returns
    its summary; None when no server is configured or none listens there (the sync then runs cold). The cycle's log
    lines are logged here as they come (or given to `on_log(level, logger name, message)`); `linger_yields` and
    `stands` are asked every LINGER_YIELDS_SECONDS, and what they say passed on (a lingering cycle ends once caught up
    while the first says so; a cycle streams on between changes while the second does: a standing run's).
    Raises ServerRefused when the server refuses or fails the cycle, CdcError when it goes away during it."""
    path, token = _target(server)
    if not path:
        return None
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(path)
    except OSError as exc:
        client.close()
        log.warning("%s: no pipeline server at %s (%s): the run goes cold, in this process", name, path,
                    exc.strerror or exc)
        return None
    request = {"version": PROTOCOL_VERSION, "command": "sync", "connector": name, "token": token,
               "start_offset": start_offset, "linger": linger, "config_path": served_config_path(),
               "standing": stands is not None, "stands": bool(stands()) if stands is not None else False}
    done = threading.Event()
    with client, client.makefile("rwb") as stream:
        writing = threading.Lock()
        with writing:
            _send(stream, request)
        asked = {key: ask for key, ask in (("linger_yields", linger_yields), ("stands", stands)) if ask is not None}
        if asked:
            threading.Thread(target=_pass_on_yields,
                             args=(stream, writing, asked, {"linger_yields": False, "stands": request["stands"]},
                                   done), daemon=True, name=f"cdc-serve-yields-{name}").start()
        try:
            summary = _read_outcome(stream, name, path, on_log)
        finally:
            done.set()
            with writing:  # the yields thread does not write on a closed stream
                pass
    return summary


def _pass_on_yields(stream: Any, writing: threading.Lock, asked: dict[str, Callable[[], bool]],
                    said: dict[str, bool], done: threading.Event) -> None:
    """Every LINGER_YIELDS_SECONDS, each of `asked`'s answers that differs from what the server was last told
    (`said`) passed on, until `done`."""
    while not done.wait(LINGER_YIELDS_SECONDS):
        for key, ask in asked.items():
            now = bool(ask())
            if now == said.get(key):
                continue
            with writing:
                if done.is_set():
                    return
                try:
                    _send(stream, {key: now})
                except OSError:
                    return
            said[key] = now


def _read_outcome(stream: Any, name: str, path: str,
                  on_log: Callable[[int, str, str], None] | None) -> dict[str, Any]:
    """The server's messages until its outcome: log lines passed on, then the summary (or what it raises)."""
    for message in _messages(stream):
        if "log" in message:
            record = message["log"]
            level, logger = int(record.get("level", logging.INFO)), record.get("name") or __name__
            if on_log is not None:
                on_log(level, logger, str(record.get("message")))
            else:
                logging.getLogger(logger).log(level, "%s", record.get("message"))
        elif "refused" in message:
            raise ServerRefused(f"the pipeline server at {path} refused the sync: {message['refused']}",
                                connector=name)
        elif "result" in message:
            return _as_seen_here(message["result"])
        elif "error" in message:
            raise ServerRefused(message["error"], connector=None if message.get("cdc_error") else name)
    raise CdcError(f"the pipeline server at {path} went away during the cycle: what it committed stays, the next "
                   "run goes on from the applied position", connector=name)


def _as_seen_here(summary: dict[str, Any]) -> dict[str, Any]:
    """The server's summary of a cycle with its first row timed from this process's start (the server's own start
    is no user's wait)."""
    started = process_started_epoch()
    if summary.get("first_row_epoch") is not None and started is not None:
        summary["first_row_seconds"] = round(summary["first_row_epoch"] - started, 2)
    return summary


def _messages(stream: Any) -> Iterator[dict[str, Any]]:
    for line in stream:
        try:
            yield json.loads(line)
        except ValueError:
            continue
