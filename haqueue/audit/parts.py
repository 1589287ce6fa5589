"""A broker's event files, `<broker>-<part>.jsonl` (writer.py), and whether a writer still has one open.

The writer takes an exclusive `flock` on a file it opens before writing a byte to it and holds it until it
closes the file (rotation, exit); the kernel releases it when the process dies, even by kill -9. No writer
ever opens a closed file again (a new file, a new process: the next part). So a file whose lock can be
taken and that holds a byte is closed for good: `audit ship` copies it. Standard library only.
"""
from __future__ import annotations

import fcntl
import os
import re

SUFFIX = ".jsonl"
PARQUET = ".parquet"  # NAME.jsonl converted (columnar.py, `audit ship --parquet`)
PART = re.compile(r"(?P<broker>.+)-(?P<part>\d+)\.jsonl$")


def name(prefix: str, part: int) -> str:
    return f"{prefix}-{part:06d}{SUFFIX}"


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
