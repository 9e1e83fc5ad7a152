"""What the forkserver of `resources.run_processes` imports once, before it forks each run's process: Dagster's run
entry and the project's definitions. Then it freezes those objects out of the garbage collector's reach, so that
the collections in a run's process do not write to (and so copy) the pages it shares with the forkserver.

An import that fails here must not stop the forkserver (a run's process then imports what it needs itself, as a
spawned one does), so any error is written to stderr and swallowed."""

import gc
import sys
import traceback

try:
    import dagster._grpc.impl  # noqa: F401  (start_run_in_subprocess and what it executes)

    import assets.definitions  # noqa: F401
except Exception:  # noqa: BLE001 - the forkserver must start whatever the project's code does
    print("cdc-pipeline: the run processes' preload failed; runs import their code themselves:", file=sys.stderr)
    traceback.print_exc()
gc.freeze()
