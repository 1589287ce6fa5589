"""The journal's writer thread: group commit.

The broker's thread hands over one `Job` per loop pass (its records, in order). The writer takes
every job waiting, appends them with `os.writev` and makes them durable with one `os.fdatasync`
(both release the GIL), then reports the jobs synced. While one sync runs the next passes queue
up, so one sync covers every publish that arrived meanwhile. Jobs nobody waits for (dequeues) are
written at once but synced with the next job that has waiters, or within LAZY_SYNC.
"""
from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from .sync_latency import SyncLatency

log = logging.getLogger("haqueue.store")

_IOV_MAX = 1024
RETRY_INTERVAL = 0.5  # seconds between attempts while the disk refuses writes
# Seconds records nobody waits for may stay unsynced, to ride with the next sync: a dequeue lost to a
# machine crash is a redelivery, and at a low rate it would otherwise cost a sync of its own.
LAZY_SYNC = 0.05


def segment_path(directory: str, number: int) -> str:
    return os.path.join(directory, f"{number:08d}.seg")


def fsync_directory(directory: str) -> None:
    """A created or removed file survives a machine crash only once its directory is synced."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(slots=True)
class Job:
    records: list[bytes]  # in order; a record may come in pieces (an E record: its head, then the message)
    size: int
    roll: int = 0  # start segment `roll` before writing the records
    done: list[Any] = field(default_factory=list)  # given back once synced (completions)
    unlink: list[int] = field(default_factory=list)  # segments to delete once the records are synced
    end: int = 0  # the journal's location after this job (segment << 40 | size), set when submitted


class Writer:
    def __init__(self, directory: str, synced: Callable[[list[Job]], None]) -> None:
        self.directory = directory
        self._synced = synced  # called on the writer thread with the jobs just made durable
        self._jobs: deque[Job] = deque()
        self._deletions: list[int] = []
        self._cond = threading.Condition()
        self._closing = False
        self._fd = -1
        self._segment = 0
        self._size = 0  # bytes written into the current segment (on disk once synced)
        self._written = 0  # jobs of the batch being written that are written whole
        self.failing: str | None = None  # why the disk refuses writes, while it does
        self.last_sync_seconds = 0.0
        self.syncs = 0
        self.latency = SyncLatency()  # of every sync that made jobs durable (metrics read it)
        self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._cond:
            self._jobs.append(job)
            self._cond.notify()

    def delete(self, numbers: list[int]) -> None:
        """Delete segments with nothing live in them as soon as possible, ahead of waiting writes: that
        is what frees a full disk."""
        with self._cond:
            self._deletions.extend(numbers)
            self._cond.notify()

    def close(self) -> None:
        """Write what was handed over, then stop."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- the writer thread ------------------------------------------------------------------
    def _run(self) -> None:
        unsynced: list[Job] = []  # written, not yet synced: nobody waits for them (dequeues, a backup's copies)
        while True:
            with self._cond:
                if not self._jobs and not self._deletions and not self._closing:
                    self._cond.wait(LAZY_SYNC if unsynced else None)
                if not self._jobs and not self._deletions and self._closing and not unsynced:
                    return
                batch = list(self._jobs)
                self._jobs.clear()
            self._delete_requested()
            # Sync now if someone waits (a publish, a roll, a deletion), or when the lazy ones have waited enough.
            sync = self._closing or not batch or any(job.done or job.roll or job.unlink for job in batch)
            pending = batch
            while True:
                try:
                    self._write(pending, sync)
                    break
                except OSError as e:
                    pending = pending[self._written:]
                    self._refused(e)
                    if self._closing:
                        return
                    time.sleep(RETRY_INTERVAL)  # the disk is full or failing: try again, keep the order
                    self._delete_requested()
            if self.failing is not None:
                log.warning("journal writes succeed again")
                self.failing = None
            unsynced += batch
            if sync and unsynced:
                self._synced(unsynced)
                unsynced = []

    def _delete_requested(self) -> None:
        with self._cond:
            numbers, self._deletions = self._deletions, []
        for number in numbers:
            os.unlink(segment_path(self.directory, number))
        if numbers:
            fsync_directory(self.directory)

    def _refused(self, e: OSError) -> None:
        reason = "the disk is full" if e.errno == errno.ENOSPC else f"write failed: {e.strerror}"
        if self.failing != reason:
            log.error("journal: %s (%s); nothing is confirmed until it succeeds, retrying", reason, self.directory)
        self.failing = reason
        if self._fd >= 0:  # no half-written record stays behind
            os.ftruncate(self._fd, self._size)
            os.lseek(self._fd, self._size, os.SEEK_SET)

    def _write(self, batch: list[Job], sync: bool) -> None:
        self._written = 0
        for i, job in enumerate(batch):
            if job.roll and job.roll != self._segment:
                self._close_segment()
                self._open(job.roll)
            self._write_all(job.records)
            self._size += job.size
            self._written = i + 1
        if not sync:
            return
        started = time.monotonic()
        os.fdatasync(self._fd)
        self.last_sync_seconds = time.monotonic() - started
        self.latency.observe(self.last_sync_seconds)
        self.syncs += 1
        removed = [n for job in batch for n in job.unlink]
        for number in removed:
            os.unlink(segment_path(self.directory, number))
        if removed:
            fsync_directory(self.directory)

    def _close_segment(self) -> None:
        if self._fd >= 0:
            os.fdatasync(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _open(self, number: int) -> None:
        self._fd = os.open(segment_path(self.directory, number), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._segment = number
        self._size = 0
        fsync_directory(self.directory)

    def _write_all(self, records: list[bytes]) -> None:
        for i in range(0, len(records), _IOV_MAX):
            chunk = records[i:i + _IOV_MAX]
            total = sum(len(r) for r in chunk)
            written = os.writev(self._fd, chunk)
            if written < total:  # a short write: the rest, in one piece
                rest = memoryview(b"".join(chunk))[written:]
                while rest:
                    rest = rest[os.write(self._fd, rest):]
