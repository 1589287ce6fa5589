"""The audit's driver JVM keeps an archive of the classes it loads between audits (haqueue/audit/class_archive.py):
the first JVM writes it as it exits, the next maps it; a part still being written is neither used nor written twice.
Real JVMs (`java -version`: the mechanism is the same for Spark's classes), a cache directory of the test's own."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from haqueue.audit import class_archive


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "haqueue" / "audit"


def java(options: str, *more: str) -> subprocess.CompletedProcess:
    java_home = os.environ.get("JAVA_HOME")
    command = os.path.join(java_home, "bin", "java") if java_home else "java"
    return subprocess.run([command, *more, *options.split(), "-version"], capture_output=True, text=True, timeout=120)


def test_the_first_jvm_writes_the_archive_and_the_next_starts_with_it(cache: Path) -> None:
    first = class_archive.java_options()
    assert first.startswith("-XX:ArchiveClassesAtExit="), first
    assert java(first).returncode == 0
    second = class_archive.java_options()
    assert second.startswith("-XX:SharedArchiveFile="), second
    assert [p.name for p in cache.iterdir()] == [Path(second.split()[0].split("=", 1)[1]).name]  # the part adopted
    mapped = java(second, "-Xshare:on")  # fails unless the archive is mapped
    assert mapped.returncode == 0 and "warning" not in mapped.stdout + mapped.stderr, mapped


def test_a_part_being_written_is_left_to_its_writer_and_one_left_by_a_killed_jvm_is_made_again(cache: Path) -> None:
    part = Path(class_archive.java_options().split()[0].split("=", 1)[1])
    part.write_bytes(bytes(4096))  # its JVM has begun writing: the header, written last, is still zeros
    assert class_archive.java_options() == ""  # no archive to use, and no second writer
    stale = part.stat().st_mtime - class_archive.STALE_S - 1
    os.utime(part, (stale, stale))  # its JVM was killed writing it
    again = class_archive.java_options()
    assert again.startswith("-XX:ArchiveClassesAtExit=") and not part.exists(), again
