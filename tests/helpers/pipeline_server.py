"""A `cdc-pipeline serve` for a test: started on the pipeline's environment with a fresh token, stopped (SIGTERM,
then SIGKILL) at the end."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

from cdc_pipeline.ops.pipeline_server import SERVER_ENV, TOKEN_ENV
from cdc_pipeline.testing.servers import end_process_group
from tests.helpers import PROJECT_ROOT
from tests.helpers.runs import log_tail

SERVER_START_SECONDS = 180


@contextmanager
def running_server(pipeline_env: dict[str, str], work: Path) -> Iterator[SimpleNamespace]:
    """The server's socket, process and log, and `env`: the pipeline's environment with the server's two variables
    (what a client sets)."""
    socket_path = work / "server.sock"
    token = secrets.token_hex(16)
    log = work / "server.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "cdc_pipeline.ops.cli", "serve", "--socket", str(socket_path)], cwd=PROJECT_ROOT,
            env={**os.environ, **pipeline_env, TOKEN_ENV: token}, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_START_SECONDS
        while "listening on" not in log.read_text():
            assert process.poll() is None, f"the server ended: {log_tail(log)}"
            assert time.monotonic() < deadline, f"the server did not listen within {SERVER_START_SECONDS} s"
            time.sleep(0.1)
        yield SimpleNamespace(socket=socket_path, process=process, log=log,
                              env={**pipeline_env, SERVER_ENV: str(socket_path), TOKEN_ENV: token})
    finally:
        end_process_group(process, wait_seconds=60)
