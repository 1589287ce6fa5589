"""A broker's event files, `<broker>~f<format>-<part>.jsonl` (writer.py), and whether a writer still has one open.

The name says the format of its lines (schema.py), at no cost per event. 0.1.0 wrote `<broker>-<part>.jsonl`,
format 1; a broker's name never holds a `~` (writer.py replaces it), so the two never mix up. Readers take both
and refuse a file of a newer format (`check_format`, design/data-formats.md). 0.1.0's readers take this build's
files for those of a broker named `<broker>~f1`, and their lines, of the same format, as their own.

The writer takes an exclusive `flock` on a file it opens before writing a byte to it and holds it until it
closes the file (rotation, exit); the kernel releases it when the process dies, even by kill -9. No writer
ever opens a closed file again (a new file, a new process: the next part). So a file whose lock can be
taken and that holds a byte is closed for good: `audit ship` copies it. Standard library only.
"""
from __future__ import annotations

import fcntl
import os
import re
import urllib.parse

from haqueue import formats

SUFFIX = ".jsonl"
PARQUET = ".parquet"  # NAME.jsonl converted (columnar.py, `audit ship --parquet`)
FORMAT = 1
PART = re.compile(r"(?P<broker>[^~]+)(?:~f\d+)?-(?P<part>\d+)\.jsonl$")
_FORMAT = re.compile(r"~f(\d+)-\d+\.(?:jsonl|parquet)$")  # in a part's name, converted to Parquet or not


def name(prefix: str, part: int) -> str:
    return f"{prefix}~f{FORMAT}-{part:06d}{SUFFIX}"


def check_format(path: str) -> None:
    """NewerFormat if the event file at `path` (a path or URI, JSON lines or Parquet) is of a format this build
    does not read, as its name says; one whose name says none is format 1 (0.1.0's, or not a broker's)."""
    found = _FORMAT.search(urllib.parse.unquote(path))
    formats.check(path, int(found[1]) if found else 1, FORMAT)


def hold(fd: int) -> None:
    """The writer's lock on the file it opened: no one else writes to it, and it is not closed. Never waits:
    BlockingIOError if `closed` is testing the file at that instant."""
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def closed(path: str) -> bool:
    """Whether the event file at `path` is closed for good: no writer holds its lock, and it has a byte
    (an empty one may be a file just made, not locked yet). FileNotFoundError if it is gone. The test takes
    a shared lock, which a read-only descriptor may take on NFS too, and which the writer's excludes."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return os.fstat(fd).st_size > 0
    finally:
        os.close(fd)  # and with it the lock
