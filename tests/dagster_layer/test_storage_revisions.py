"""Dagster's migration scripts are read once per process (`resources.storage_revisions`): every instance a sensor
opens finds the same script directory for Dagster's own location, and a location outside Dagster is read as Alembic
reads it. Run in a fresh Python, whose Alembic class is its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dagsters_script_directory_is_read_once_and_others_as_alembic_reads_them(tmp_path):
    other = tmp_path / "migrations"
    (other / "versions").mkdir(parents=True)
    (other / "script.py.mako").write_text("")
    code = textwrap.dedent(f"""
        from alembic.config import Config
        from alembic.script import ScriptDirectory
        from dagster import DagsterInstance, instance_for_test
        from dagster._core.storage.sql import get_alembic_config
        import dagster._core.storage.runs.sqlite.sqlite_run_storage as runs

        import assets.definitions  # what the code server loads

        first = ScriptDirectory.from_config(get_alembic_config(runs.__file__))
        again = ScriptDirectory.from_config(get_alembic_config(runs.__file__))
        assert first is again, "Dagster's scripts read again"
        assert first.as_revision_number("head")
        config = Config()
        config.set_main_option("script_location", {str(other)!r})
        assert ScriptDirectory.from_config(config) is not ScriptDirectory.from_config(config)
        with instance_for_test() as instance:  # opening an instance's SQLite storage still checks its revision
            assert instance.get_runs() == []
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180)

    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr
