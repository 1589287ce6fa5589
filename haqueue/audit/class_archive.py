"""A class-data-sharing archive (HotSpot's AppCDS) of the classes the audit's driver JVM loads, kept between audits.

A fresh JVM loads, verifies and links some ten thousand classes of Spark's jars for an audit, however small; from an
archive it maps them ready-made. The first audit that finds no archive has its JVM write one as it exits
(-XX:ArchiveClassesAtExit, under a name of its own); a later audit adopts it and starts its JVM with it
(-XX:SharedArchiveFile). bench/RESULTS.md has what it saves. The archive's name holds a key of the Java and the Spark
jars it was made from, so a new pyspark or JDK makes a new one; HotSpot checks the same again and starts without
an archive that does not match them (its messages silenced: the JVM's stdout is the command's)."""
from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import time
from pathlib import Path

# A dynamic archive's first 4 bytes (HotSpot's CDS_DYNAMIC_ARCHIVE_MAGIC, little-endian). HotSpot writes the header
# last, after every region: a file that begins with it was written whole, one without is still being written or
# was cut short by a JVM killed meanwhile.
MAGIC = 0xF00BABA8.to_bytes(4, "little")
# A part that has not begun with MAGIC for this long was left by a killed JVM: removed, so that another is made.
STALE_S = 3600
QUIET = "-Xlog:cds*=off"  # an archive refused (another JVM's, a changed jar) is no error: the JVM starts without it


def java_options() -> str:
    """The driver JVM's options for the archive: use it when there is one; else, unless another JVM is writing
    one, write one as this JVM exits. "" when it cannot be kept (no Java or Spark found, no cache directory)."""
    key = _key()
    directory = _directory()
    if key is None or directory is None:
        return ""
    archive = directory / f"spark-{key}.jsa"
    parts = _adopt(directory, key, archive)
    if archive.exists():
        return f"-XX:SharedArchiveFile={archive} {QUIET}"
    if parts:  # another audit's JVM is writing it
        return ""
    return f"-XX:ArchiveClassesAtExit={directory / f'.spark-{key}-{secrets.token_hex(6)}.part'} {QUIET}"


def _adopt(directory: Path, key: str, archive: Path) -> int:
    """Move a part of `key` written whole to `archive` (atomic: a JVM starting meanwhile sees it whole or not at
    all) and remove stale ones; the parts still being written."""
    writing = 0
    for part in directory.glob(f".spark-{key}-*.part"):
        try:
            with open(part, "rb") as file:
                whole = file.read(len(MAGIC)) == MAGIC
            if whole and not archive.exists():
                os.replace(part, archive)
            elif whole or time.time() - part.stat().st_mtime > STALE_S:
                part.unlink()
            else:
                writing += 1
        except OSError:  # another audit adopted or removed it meanwhile
            continue
    return writing


def _directory() -> Path | None:
    """Where archives are kept: $XDG_CACHE_HOME/haqueue/audit (~/.cache/...), made if missing; None if it cannot."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = Path(base) / "haqueue" / "audit"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return directory if os.access(directory, os.W_OK) else None


def _key() -> str | None:
    """A digest of the Java that spark-submit starts (as spark-class finds it) and of Spark's jars (names, sizes,
    times): what the archive's classes come from."""
    from pyspark.find_spark_home import _find_spark_home

    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    jars = Path(_find_spark_home()) / "jars"
    if java is None or not jars.is_dir():
        return None
    digest = hashlib.sha256(os.path.realpath(java).encode())
    runtime = Path(os.path.realpath(java)).parent.parent / "lib"
    for file in sorted([*runtime.glob("server/libjvm.so"), runtime / "modules", *jars.iterdir()]):
        try:
            stat = file.stat()
        except OSError:
            continue
        digest.update(f"\0{file.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]
