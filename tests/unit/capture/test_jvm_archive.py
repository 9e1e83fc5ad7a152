"""The driver JVM's class archive: keyed by the Java binary and the classpath, used only when built whole."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cdc_pipeline.capture import jvm_archive


def _jar(tmp_path: Path, name: str = "a.jar") -> Path:
    jar = tmp_path / name
    jar.write_bytes(b"PK")
    return jar


def test_the_archive_key_follows_the_classpath(tmp_path, monkeypatch):
    monkeypatch.setenv(jvm_archive.ARCHIVE_DIR_ENV, str(tmp_path / "cache"))
    jar = _jar(tmp_path)
    first = jvm_archive.archive_path([jar])

    assert first == jvm_archive.archive_path([jar]) and first.parent == tmp_path / "cache"
    later = time.time() + 10
    os.utime(jar, (later, later))
    assert jvm_archive.archive_path([jar]) != first, "a rebuilt jar makes an archive of the old one useless"
    assert jvm_archive.archive_path([jar, _jar(tmp_path, "b.jar")]) != jvm_archive.archive_path([jar])


def test_runs_map_the_archive_only_when_it_is_there_and_not_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv(jvm_archive.ARCHIVE_DIR_ENV, str(tmp_path))
    jar = _jar(tmp_path)
    assert jvm_archive.java_options([jar]) == ""
    archive = jvm_archive.archive_path([jar])
    # A partial archive (its build's temporary name) is never mapped: a JVM does not start from a truncated one.
    archive.with_name(archive.name + ".123.partial").write_bytes(b"x")
    assert jvm_archive.java_options([jar]) == ""

    archive.write_bytes(b"x")

    assert f"-XX:SharedArchiveFile={archive}" in jvm_archive.java_options([jar])
    monkeypatch.setenv(jvm_archive.ARCHIVE_ENV, "off")
    assert jvm_archive.java_options([jar]) == ""


def test_building_keeps_the_newest_archives_only(tmp_path):
    for age in range(5):
        archive = tmp_path / f"driver-{age}.jsa"
        archive.write_bytes(b"x")
        os.utime(archive, (time.time() - age * 60, time.time() - age * 60))
    (tmp_path / "other.txt").write_text("kept")

    jvm_archive._prune(tmp_path)

    assert sorted(path.name for path in tmp_path.iterdir()) == ["driver-0.jsa", "driver-1.jsa", "driver-2.jsa",
                                                                "other.txt"]
