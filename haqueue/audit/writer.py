"""Appends whole JSON lines to size-rotated files.

Files are `<dir>/<broker>-<part>.jsonl`; each process starts a new part, so a file never holds two
runs and a line torn by a crash is always the last of its file.
"""
from __future__ import annotations

import logging
import os
import re
from typing import BinaryIO

log = logging.getLogger("haqueue.audit")


class Writer:
    def __init__(self, directory: str, broker: str, max_bytes: int) -> None:
        self.directory = os.path.abspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", broker)  # a file name, whatever the broker's name
        self.max_bytes = max_bytes
        self.part = self._last_part()
        self.file: BinaryIO | None = None
        self.size = 0

    def _last_part(self) -> int:
        pattern = re.compile(re.escape(self.prefix) + r"-(\d+)\.jsonl$")
        parts = [int(m.group(1)) for m in map(pattern.match, os.listdir(self.directory)) if m]
        return max(parts, default=0)

    def write(self, chunks: list[bytes]) -> None:
        """Append chunks of whole lines, one write each (no copy into one big buffer: on this VM fresh
        megabytes cost page faults worth 2 µs a line); past max_bytes the next write opens the next file."""
        try:
            for chunk in chunks:
                if self.file is None:
                    self.part += 1
                    path = os.path.join(self.directory, f"{self.prefix}-{self.part:06d}.jsonl")
                    self.file = open(path, "ab", buffering=0)
                    self.size = 0
                written = 0
                while written < len(chunk):  # an unbuffered write may be short
                    written += self.file.write(memoryview(chunk)[written:]) or 0
                self.size += written
                if self.size >= self.max_bytes:
                    self.close()
        except OSError as e:  # a full disk must not stop the broker; the gap shows in the audit
            lines = sum(chunk.count(b"\n") for chunk in chunks)
            log.error("audit: cannot write %d lines to %s: %s", lines, self.directory, e)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
