"""Diverged messages: what a rejoining broker holds that its new primary never had (design/replication.md,
"Divergence"). A broker that was primary, cut off, and replaced may hold messages published to it after its
last backup was dropped; the new primary never received them. They are not deleted: the broker moves them to a
file under `data_dir/diverged/` (one per queue and rejoin), synced before the messages leave the queue, logged
and counted; `haqueue diverged list` shows them and `haqueue diverged republish` sends them to the primary.

File format 1: records of (seq: u64, size: u32, the message's AMQP bytes as the client sent them), big-endian,
as 0.1.0 wrote them. Format 2, once the cluster enabled the feature HEADER_FEATURE (design/upgrades.md): a header
(MAGIC, the format u32), then the same records; a broker that starts with it enabled gives its format 1 files
their header (`upgrade`). Every reader here reads both (design/data-formats.md). A file is otherwise never
rewritten: a republished one is renamed `*.republished`.
"""
from __future__ import annotations

import logging
import os
import struct
import time
import urllib.parse
from pathlib import Path
from typing import Final, Iterator

from .. import formats
from .features import DIVERGED_FILE_HEADER, FeatureFlags

log = logging.getLogger("haqueue.ha.quarantine")

DIRECTORY: Final = "diverged"
SUFFIX: Final = ".diverged"
DONE_SUFFIX: Final = ".republished"
_RECORD: Final = struct.Struct(">QI")
FORMAT: Final = 2
HEADER_FEATURE: Final = DIVERGED_FILE_HEADER  # format 2 is written once the cluster enables it
# 0.1.0 reads bytes 8-11 of MAGIC as its first record's size, 4 GiB - 1, past the end of any diverged file: it
# stops with "truncated record at byte 0" rather than misread a file of this format.
MAGIC: Final = b"haqueue\x00\xff\xff\xff\xffdvgd"
_HEADER: Final = struct.Struct(">16sI")  # MAGIC, format
HEADER: Final = _HEADER.pack(MAGIC, FORMAT)
_CONVERTING: Final = ".converting"  # a format 1 file being given its header, beside it


def file_queue(path: Path) -> str:
    """The queue a diverged file's messages were on: its name follows the time and count in the file name."""
    return urllib.parse.unquote(path.name[:-len(SUFFIX)].split("-", 2)[2])


def _records_at(path: Path, head: bytes) -> int:
    """Where the records of the file starting with `head` start: after its header, or at 0 in a format 1 file
    (none). NewerFormat for a format this build does not read."""
    if len(head) < _HEADER.size or not head.startswith(MAGIC):
        return 0
    formats.check(str(path), _HEADER.unpack_from(head)[1], FORMAT)
    return _HEADER.size


def file_format(path: Path) -> int:
    """The format of a diverged file; NewerFormat for one this build does not read."""
    with open(path, "rb") as f:
        return FORMAT if _records_at(path, f.read(_HEADER.size)) else 1


def read_messages(path: Path) -> Iterator[tuple[int, bytes]]:
    """A diverged file's (seq, message) records, in the order they were on the queue."""
    data = path.read_bytes()
    offset = _records_at(path, data)
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


def upgrade(directory: Path) -> int:
    """Give each format 1 diverged file in `directory` its header, the number converted: written whole under
    another name, synced, renamed over the old file, the directory synced. A crash leaves each file old or new,
    never half, and the next start converts the rest. NewerFormat for a file this build does not read."""
    for cut_short in directory.glob(f"*{SUFFIX}{_CONVERTING}"):  # its old file is still there: converted again
        cut_short.unlink()
    converted = 0
    for path in diverged_files(directory.parent):
        if file_format(path) == FORMAT:
            continue
        converting = path.with_name(path.name + _CONVERTING)
        _write_synced(converting, HEADER + path.read_bytes())
        os.replace(converting, path)
        _sync_directory(directory)
        converted += 1
    return converted


def _write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:  # a write may take less than all of it (2 GiB at most on Linux)
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Quarantine:
    """A backup's keeper of diverged messages; `kept` counts them since this process started (metrics)."""

    def __init__(self, data_dir: str) -> None:
        """Refuses to start on a file of a newer format (NewerFormat); converts the format 1 ones once the cluster
        has enabled format 2."""
        self.directory = Path(data_dir) / DIRECTORY
        self.kept = 0
        files = diverged_files(data_dir)
        for path in files:
            file_format(path)
        if files and self.headers():
            converted = upgrade(self.directory)
            if converted:
                log.info("%s: %d diverged files of format 1 given the header of format %d (design/data-formats.md)",
                         self.directory, converted, FORMAT)

    def headers(self) -> bool:
        """Whether files are written in format 2: the cluster has enabled HEADER_FEATURE, as this broker last knew
        (features.py keeps it in the data dir). Until then format 1, which 0.1.0 reads: it may still come back."""
        return FeatureFlags(str(self.directory.parent)).on(HEADER_FEATURE)

    def keep(self, queue: str, messages: list[tuple[int, bytes]]) -> Path:
        """Write the messages to a new file and sync it (and its directory) before they leave the queue."""
        self.directory.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path = self.directory / f"{stamp}-{len(messages)}-{urllib.parse.quote(queue, safe='')}{SUFFIX}"
        n = 0
        while path.exists():  # two rejoins within a second
            n += 1
            path = path.with_name(f"{stamp}.{n}-{len(messages)}-{urllib.parse.quote(queue, safe='')}{SUFFIX}")
        header = HEADER if self.headers() else b""
        _write_synced(path, header + b"".join(_RECORD.pack(seq, len(data)) + data for seq, data in messages))
        _sync_directory(self.directory)
        self.kept += len(messages)
        log.warning("queue '%s': %d messages this broker holds were never on the new primary (published here "
                    "while it was cut off from the cluster): kept in %s, not deleted; `haqueue diverged list` shows "
                    "them, `haqueue diverged republish` sends them to the primary", queue, len(messages), path)
        return path

    def status(self) -> dict[str, int]:
        files = diverged_files(self.directory.parent)
        return {"kept_since_start": self.kept, "files": len(files),
                "messages": sum(int(f.name.split("-", 2)[1]) for f in files)}
