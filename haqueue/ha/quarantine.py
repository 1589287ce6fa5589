"""Diverged messages: what a rejoining broker holds that its new primary never had (design/replication.md,
"Divergence"). A broker that was primary, cut off, and replaced may hold messages published to it after its
last backup was dropped; the new primary never received them. They are not deleted: the broker moves them to a
file under `data_dir/diverged/` (one per queue and rejoin), synced before the messages leave the queue, logged
and counted; `haqueue diverged list` shows them and `haqueue diverged republish` sends them to the primary.

File format: records of (seq: u64, size: u32, the message's AMQP bytes as the client sent them), big-endian.
A file is never rewritten: a republished one is renamed `*.republished`.
"""
from __future__ import annotations

import logging
import os
import struct
import time
import urllib.parse
from pathlib import Path
from typing import Final, Iterator

log = logging.getLogger("haqueue.ha.quarantine")

DIRECTORY: Final = "diverged"
SUFFIX: Final = ".diverged"
DONE_SUFFIX: Final = ".republished"
_RECORD: Final = struct.Struct(">QI")


def file_queue(path: Path) -> str:
    """The queue a diverged file's messages were on: its name follows the time and count in the file name."""
    return urllib.parse.unquote(path.name[:-len(SUFFIX)].split("-", 2)[2])


def read_messages(path: Path) -> Iterator[tuple[int, bytes]]:
    """A diverged file's (seq, message) records, in the order they were on the queue."""
    data = path.read_bytes()
    offset = 0
    while offset + _RECORD.size <= len(data):
        seq, size = _RECORD.unpack_from(data, offset)
        offset += _RECORD.size
        if offset + size > len(data):
            raise ValueError(f"{path}: truncated record at byte {offset - _RECORD.size}")
        yield seq, data[offset:offset + size]
        offset += size


def diverged_files(data_dir: str | os.PathLike[str], republished: bool = False) -> list[Path]:
    directory = Path(data_dir) / DIRECTORY
    suffix = DONE_SUFFIX if republished else SUFFIX
    return sorted(directory.glob(f"*{suffix}")) if directory.is_dir() else []


class Quarantine:
    """A backup's keeper of diverged messages; `kept` counts them since this process started (metrics)."""

    def __init__(self, data_dir: str) -> None:
        self.directory = Path(data_dir) / DIRECTORY
        self.kept = 0

    def keep(self, queue: str, messages: list[tuple[int, bytes]]) -> Path:
        """Write the messages to a new file and sync it (and its directory) before they leave the queue."""
        self.directory.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path = self.directory / f"{stamp}-{len(messages)}-{urllib.parse.quote(queue, safe='')}{SUFFIX}"
        n = 0
        while path.exists():  # two rejoins within a second
            n += 1
            path = path.with_name(f"{stamp}.{n}-{len(messages)}-{urllib.parse.quote(queue, safe='')}{SUFFIX}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"".join(_RECORD.pack(seq, len(data)) + data for seq, data in messages))
            os.fsync(fd)
        finally:
            os.close(fd)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self.kept += len(messages)
        log.warning("queue '%s': %d messages this broker holds were never on the new primary (published here "
                    "while it was cut off from the cluster): kept in %s, not deleted; `haqueue diverged list` shows "
                    "them, `haqueue diverged republish` sends them to the primary", queue, len(messages), path)
        return path

    def status(self) -> dict[str, int]:
        files = diverged_files(self.directory.parent)
        return {"kept_since_start": self.kept, "files": len(files),
                "messages": sum(int(f.name.split("-", 2)[1]) for f in files)}
