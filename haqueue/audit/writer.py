"""Appends whole JSON lines to size-rotated files, one write per call (os.write, no fsync: a killed
process loses nothing written; a machine crash may lose what the page cache held).

Files are `<dir>/<broker>~f<format>-<part>.jsonl` (the lines' format in the name: parts.py); each process
starts a new part, after any of the broker's (0.1.0's `<broker>-<part>.jsonl` too), so a file never holds two
runs and a line torn by a crash is always the last of its file. A file is closed once it reaches
`max_bytes`, or has been open `rotate_seconds` (AuditLog's timer calls `expire`), and the next write
opens the next part. The writer holds a lock on its open file (parts.py), which `audit ship` reads to
copy only closed ones: one call per file.

What is written is not read again by the broker, so it is dropped from the page cache every
DROP_EVERY bytes (the window before last: written back by then). Left there, it filled the cache,
and from then on every write paid for reclaiming old pages: on this machine 2 s of CPU per GB
written instead of 0.5, over 1 µs per message at three lines each (bench/RESULTS.md).
"""
from __future__ import annotations

import logging
import os
import re
import time
from typing import BinaryIO

from . import _lines, parts
from .lines import Group, read_id

log = logging.getLogger("haqueue.audit")

DROP_EVERY = 8 << 20


class Writer:
    def __init__(self, directory: str, broker: str, max_bytes: int) -> None:
        self.directory = os.path.abspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", broker)  # a file name, whatever the broker's name
        self.max_bytes = max_bytes
        self.part = self._last_part()
        self.file: BinaryIO | None = None
        self.size = 0
        self.dropped = 0  # the file's bytes before this offset are out of the page cache
        self.window = 0  # start of the window written since the last drop
        self.opened = 0.0  # time.monotonic() when the file was opened

    def _last_part(self) -> int:
        found = [m for m in map(parts.PART.match, os.listdir(self.directory)) if m and m["broker"] == self.prefix]
        return max((int(m["part"]) for m in found), default=0)

    def write(self, groups: list[bytes | Group]) -> None:
        """Append the groups' lines with one write; past max_bytes the next write opens the next file."""
        try:
            if self.file is None:
                self.file = self._open_next()
                self.size = self.dropped = self.window = 0
                self.opened = time.monotonic()
            self.size += _lines.write(self.file.fileno(), groups, read_id)
            if self.size - self.window >= DROP_EVERY:
                os.posix_fadvise(self.file.fileno(), self.dropped, self.size - self.dropped, os.POSIX_FADV_DONTNEED)
                self.dropped, self.window = self.window, self.size
            if self.size >= self.max_bytes:
                self.close()
        except OSError as e:  # a full disk must not stop the broker; the gap shows in the audit
            log.error("audit: cannot write to %s: %s", self.directory, e)
            self.close()  # what follows goes to a new file: a line cut here stays the last of its file

    def _open_next(self) -> BinaryIO:
        """The next part, locked (parts.py). Should `audit ship` be testing the new file's lock at that very
        instant, the file is left empty (ship never ships an empty file) and the part after it taken: the
        broker never waits for ship."""
        while True:
            self.part += 1
            file = open(os.path.join(self.directory, parts.name(self.prefix, self.part)), "ab", buffering=0)
            try:
                parts.hold(file.fileno())
            except BlockingIOError:
                file.close()
                continue
            except OSError as e:  # a file system without locks (an NFS mount without lockd): write all the same
                log.warning("audit: cannot lock %s (%s): `audit ship` cannot tell it is still open", file.name, e)
            return file

    def expire(self, seconds: float) -> None:
        """Close the file if it has been open `seconds`: its events reach `audit ship` within a bounded
        time even when they are few."""
        if self.file is not None and time.monotonic() - self.opened >= seconds:
            self.close()

    def close(self) -> None:
        if self.file is not None:
            os.posix_fadvise(self.file.fileno(), self.dropped, 0, os.POSIX_FADV_DONTNEED)  # 0: to the end
            self.file.close()
            self.file = None
