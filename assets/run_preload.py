"""What the forkserver of `resources.run_processes` imports once, before it forks each run's process: Dagster's run
entry, the modules a run's process imports next (its instance's storage, SQLAlchemy and Alembic, the executor, the
daemon's modules that the run queue's checks use), the classes the instance's dagster.yaml names, and the project's
definitions. Then it freezes those objects out of the garbage collector's reach, so that the collections in a run's
process do not write to (and so copy) the pages it shares with the forkserver.

Only modules are imported here: no instance, connection or thread is made, since a forked process must not share
them. A module that fails to import must not stop the forkserver (a run's process then imports what it needs itself,
as a spawned one does), so any error is written to stderr and passed over."""

import gc
import importlib
import os
import sys
import traceback

# Found by listing the modules a forked run's process had imported 25 s into a served sync run, beyond the ones above.
RUN_MODULES = (
    "dagster._grpc.impl",
    "dagster._core.instance.factory",
    "dagster._core.storage.root",
    "dagster._core.storage.sqlite_storage",
    "dagster._core.storage.runs.sqlite.sqlite_run_storage",
    "dagster._core.storage.event_log.sqlite.sqlite_event_log",
    "dagster._core.storage.event_log.sqlite.consolidated_sqlite_event_log",
    "dagster._core.storage.schedules.sqlite.sqlite_schedule_storage",
    "dagster._core.storage.local_compute_log_manager",
    "dagster._core.secrets.env_file",
    "dagster._core.executor.in_process",
    "dagster._core.execution.stats",
    "dagster._core.execution.submit_asset_runs",
    "dagster._core.workspace.context",
    "dagster._daemon.controller",
    "dagster._scheduler.scheduler",
    "dagster._core.definitions.repository_definition.repository_data_builder",
    "dagster._core.execution.plan.active",
    "dagster._core.storage.migration.utils",
    "dagster._core.system_config.composite_descent",
    "dagster._core.utility_ops",
    "dagster._utils.temp_file",
    "dagster._utils.test.definitions",
    "upath",
    "fsspec.implementations.local",
    "multiprocessing.queues",
    "multiprocessing.synchronize",
    "assets.definitions",
)


def _instance_modules() -> list[str]:
    """The modules of the classes the instance's dagster.yaml names (its storage, launcher, coordinator...)."""
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        return []
    from dagster._core.instance.ref import InstanceRef

    ref = InstanceRef.from_dir(home)
    return [value.module_name for value in ref._asdict().values() if hasattr(value, "module_name")]


def preload() -> list[str]:
    """Import the run's modules; the names of those that failed."""
    failed = []
    for name in (*RUN_MODULES, *_instance_modules()):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the forkserver must start whatever the project's code does
            failed.append(name)
            print(f"cdc-pipeline: the run processes' preload could not import {name}; runs import it themselves:",
                  file=sys.stderr)
            traceback.print_exc()
    return failed


try:
    preload()
except Exception:  # noqa: BLE001 - as above: a broken dagster.yaml fails the runs, not their forkserver
    print("cdc-pipeline: the run processes' preload failed; runs import their code themselves:", file=sys.stderr)
    traceback.print_exc()
gc.freeze()
