"""The bench's pgloader and pgcopydb peers without servers: the command lines, the install decision, the indexes as
reported, and the per-run and median figures."""

import os
import stat
from pathlib import Path

import pytest

from cdc_pipeline.testing import peer_loaders


def test_the_commands_are_the_loaders_defaults():
    url = peer_loaders.mysql_url("127.0.0.1", 3307, "bench", "p@ss:w/rd", "bench_load")
    assert url == "mysql://bench:p%40ss%3Aw%2Frd@127.0.0.1:3307/bench_load"
    assert peer_loaders.pgloader_command("/usr/bin/pgloader", url, "postgresql://postgres@127.0.0.1:5433/t") == [
        "/usr/bin/pgloader", url, "postgresql://postgres@127.0.0.1:5433/t"]
    assert peer_loaders.pgcopydb_command("/usr/bin/pgcopydb", "postgresql://s", "postgresql://t", Path("/w/1")) == [
        "/usr/bin/pgcopydb", "clone", "--source", "postgresql://s", "--target", "postgresql://t", "--dir", "/w/1",
        "--no-owner", "--no-acl"]
    assert peer_loaders.LOADER_BY_SOURCE == {"mariadb": "pgloader", "postgres": "pgcopydb"}


def test_a_loader_is_installed_only_when_its_executable_is_missing_from_the_path(tmp_path, monkeypatch):
    installed = []
    monkeypatch.setattr(peer_loaders, "_apt_install", installed.append)

    assert peer_loaders.missing_packages(["pgloader", "pgcopydb"], path=str(tmp_path)) == ["pgloader", "pgcopydb"]
    with pytest.raises(RuntimeError, match="pgcopydb is still missing"):
        peer_loaders.ensure_loader("pgcopydb", path=str(tmp_path))
    assert installed == [["pgcopydb"]]

    executable = tmp_path / "pgloader"
    executable.write_text("#!/bin/sh\n")
    executable.chmod(executable.stat().st_mode | stat.S_IXUSR)
    assert peer_loaders.missing_packages(["pgloader", "pgcopydb"], path=str(tmp_path)) == ["pgcopydb"]
    assert peer_loaders.ensure_loader("pgloader", path=f"{tmp_path}{os.pathsep}/nonexistent") == str(executable)
    assert installed == [["pgcopydb"]]


def test_indexes_are_reported_by_kind_and_columns():
    summaries = [peer_loaders.index_summary(True, True, "CREATE UNIQUE INDEX items_pkey ON public.items USING btree "
                                                        "(id)"),
                 peer_loaders.index_summary(False, False, "CREATE INDEX idx_16390_items_created ON bench_load.items "
                                                          "USING btree (created)")]
    assert summaries == ["PRIMARY KEY (id)", "INDEX (created)"]
    assert peer_loaders.has_secondary_index(summaries) and not peer_loaders.has_secondary_index(summaries[:1])


def _side(seconds, exact=True, index=True):
    return {"seconds": seconds, "exact": exact, "syncs": 1, "cycle_seconds": {"load_seconds": 1.5},
            "indexes": ["PRIMARY KEY (id)", *(["INDEX (created)"] if index else [])], "secondary_index": index,
            "seconds_with_index": seconds if index else None, "index_sync_seconds": None}


def test_each_run_gives_the_ratio_peer_over_ours_and_the_medians_of_the_runs():
    runs = [peer_loaders.run_figures(1, ("cdc-pipeline", "pgloader"), 100_000, 0.25, _side(10.0), _side(8.0)),
            peer_loaders.run_figures(2, ("pgloader", "cdc-pipeline"), 100_000, 0.2, _side(5.0), _side(10.0)),
            peer_loaders.run_figures(3, ("cdc-pipeline", "pgloader"), 100_000, 0.4, _side(8.0),
                                     _side(12.0, exact=False, index=False))]

    assert [run["ratio"] for run in runs] == [0.8, 2.0, 1.5]
    assert [run["ceiling_rows_per_second"] for run in runs] == [400_000, 500_000, 250_000]
    assert runs[1]["first"] == "pgloader"
    assert peer_loaders.median_figures(runs) == {"ours_seconds": 8.0, "peer_seconds": 10.0, "ratio": 1.5,
                                                 "ceiling_rows_per_second": 400_000, "exact": False}
    assert peer_loaders.median_figures(runs[:2])["exact"]

    text = peer_loaders.describe({"source": "mariadb", "rows": 100_000, "runs": 3, "peer": "pgloader",
                                  "peer_version": "3.6.9-1", "median": peer_loaders.median_figures(runs),
                                  "measured": runs})
    assert "pgloader 3.6.9-1" in text and "NOT all" in text and text.count("yes/NO") == 2
    assert "run 3 indexes: cdc-pipeline PRIMARY KEY (id), INDEX (created); pgloader PRIMARY KEY (id)" in text
