"""Run processes forked from a warm process: the code server starts each run's process from Python's forkserver,
which has imported Dagster and the project's definitions once, instead of spawning a fresh Python that imports
them again (about 2 s of CPU per run on a 2-core machine, half of a short served run's).

Dagster's code server starts a run's process with `multiprocessing`'s spawn context (`DagsterApiServer._mp_ctx`,
set in its constructor, used by `StartRun` for the run's process, its event queue and its termination event).
`fork_runs_in_code_server` makes that attribute the forkserver context, with the module the code location names
(`assets.run_preload`) as the forkserver's preload. Everything else about the run is Dagster's own:
`start_run_in_subprocess` as the target, the code server's wait for the run's start, its termination event, its
health checks.

Set `CDC_PIPELINE_RUN_PROCESS=spawn` in the code server's environment for Dagster's own spawn (say, while editing
the project's code: the forkserver keeps the modules it imported until the code location is reloaded)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import sys
import threading

RUN_PROCESS_ENV = "CDC_PIPELINE_RUN_PROCESS"
FORKED, SPAWNED = "fork", "spawn"


def run_process_start() -> str:
    """How the code server starts a run's process: `fork` (the default) or `spawn` (Dagster's own)."""
    value = os.environ.get(RUN_PROCESS_ENV, FORKED).strip().lower() or FORKED
    if value not in (FORKED, SPAWNED):
        raise ValueError(f"{RUN_PROCESS_ENV} must be {FORKED!r} or {SPAWNED!r}, not {value!r}")
    return value


def fork_runs_in_code_server(preload: str) -> bool:
    """Make Dagster's code servers in this process start runs from the forkserver, which imports the module `preload`
    before it forks any; False, changing nothing, when `CDC_PIPELINE_RUN_PROCESS` is `spawn` or this Dagster has no
    such attribute to set."""
    if run_process_start() != FORKED:
        return False
    from dagster._grpc import server  # Dagster's own code server, which the code location runs in

    api_server = server.DagsterApiServer
    if "_mp_ctx" not in api_server.__init__.__code__.co_names:
        return False  # another Dagster: its runs start as it starts them
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([preload])
    # A data descriptor on the class wins over the attribute the constructor sets on the instance, also for a server
    # built before this module loaded (the code location's definitions load inside the server's constructor).
    api_server._mp_ctx = property(lambda _server: context, lambda _server, _value: None)
    if sys.argv[1:3] == ["api", "grpc"]:
        # In the code server itself (`dagster api grpc`): the forkserver imports while the server loads the rest, so
        # that the first runs do not wait for it.
        threading.Thread(target=multiprocessing.forkserver.ensure_running, name="cdc-run-forkserver",
                         daemon=True).start()
    return True
