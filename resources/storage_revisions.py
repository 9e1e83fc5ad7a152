"""Dagster's migration scripts read once per process, not at every instance a sensor opens.

Dagster's code server gives each sensor evaluation a new `DagsterInstance` (from the instance's ref). Opening its
SQLite storage checks each database's schema revision against the head of Dagster's migration scripts
(`dagster._core.storage.sql.check_alembic_revision`), and Alembic's `ScriptDirectory.from_config` reads and executes
every script file again to find that head: measured with py-spy under 24 connectors' change sensors, 38% of the code
server's CPU. The scripts are files of the installed Dagster, which do not change while a process runs, so
`cache_dagster_script_directories` keeps one `ScriptDirectory` per script location inside the Dagster package; any
other location (a user's own Alembic use in the same process) is read as Alembic reads it."""

from __future__ import annotations

import os
import threading
from typing import Any

_lock = threading.Lock()
_cached: dict[tuple[Any, ...], Any] = {}


def cache_dagster_script_directories() -> bool:
    """Make `ScriptDirectory.from_config` return one directory per Dagster script location in this process; False,
    changing nothing, when it was done already or Alembic has no such method."""
    import dagster
    from dagster._core.storage import sql  # Dagster's revision check, and the Alembic class it reads scripts with

    ScriptDirectory = sql.ScriptDirectory  # noqa: N806 - the class itself, as Dagster names it

    original = ScriptDirectory.__dict__.get("from_config")
    if not isinstance(original, classmethod) or getattr(original.__func__, "_cdc_cached", False):
        return False
    read = original.__func__
    package = os.path.dirname(os.path.abspath(dagster.__file__)) + os.sep

    def from_config(cls: type, config: Any) -> Any:
        location = config.get_alembic_option("script_location")
        if not _in_dagster(location, package):
            return read(cls, config)
        key = (cls, location, config.get_alembic_option("file_template"),
               config.get_alembic_option("truncate_slug_length"), config.get_alembic_option("version_locations"))
        with _lock:
            found = _cached.get(key)
            if found is None:
                found = _cached[key] = read(cls, config)
        return found

    from_config._cdc_cached = True  # type: ignore[attr-defined]
    ScriptDirectory.from_config = classmethod(from_config)  # type: ignore[method-assign]
    return True


def _in_dagster(location: Any, package: str) -> bool:
    """Whether an Alembic script location is Dagster's own: `dagster:<path>` (a package resource, as Dagster names
    it) or a path inside the installed package."""
    if not isinstance(location, str):
        return False
    return location.startswith("dagster:") or os.path.abspath(location).startswith(package)
