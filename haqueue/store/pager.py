"""QueuePager: a durable queue's newest messages, out of memory (design/store.md, Paging).

Per paged message it keeps 28 bytes in flat arrays: its seq, where its journal record is
(segment << 40 | offset), the record's length and the expiry, not an Entry and its body. A
message that has no record (a transient message on a paging queue) stays in memory, in order.
Bodies are read back from the journal in batches when the queue runs short in memory.
"""
from __future__ import annotations

import bisect
import logging
import os
import time
from array import array
from typing import Final, Protocol

from ..broker.queue import Entry, Queue
from . import records
from .writer import segment_path

log = logging.getLogger("haqueue.store")

SHIFT: Final = 40  # a record's location: segment << SHIFT | offset in the segment
IN_MEMORY: Final = -1  # the location of a paged message that has no record
DROPPED: Final = -2  # the location of a paged message dequeued by seq (a replica's), skipped when read back


class PagingStore(Protocol):
    """What a pager reads and keeps up to date of its store (store.Store, which makes the pagers)."""

    directory: str  # where the journal's segments are
    page_above: int  # bytes of message data in memory above which queues page
    clock: float  # wall clock = monotonic + clock
    synced: int  # the location up to which the journal is on disk
    live: dict[int, int]  # live message records per segment
    live_bytes: int  # bodies of every live journalled message
    waiting_for_sync: set[Queue]  # queues to dispatch again after the next sync

    def dequeue(self, qid: int, seq: int) -> None: ...


class PagedJournal(Protocol):
    """What a pager needs of its queue's journal (store.QueueJournal)."""

    queue: Queue
    qid: int
    where: dict[Entry, int]  # each journalled entry in memory: where its record is
    memory_bytes: int  # bodies of journalled entries held in memory


class QueuePager:
    def __init__(self, store: PagingStore, journal: PagedJournal) -> None:
        self.store = store
        self.journal = journal
        self.seqs = array("q")
        self.locations = array("q")
        self.lengths = array("l")
        self.expiries = array("d")  # wall clock, 0: never
        self.head = 0  # index of the oldest message still paged
        self.kept: dict[int, Entry] = {}  # index -> a paged message that has no record
        self.bytes = 0  # message data paged, kept ones included
        self.dropped = 0  # DROPPED ones still in the arrays
        self.count = 0  # paged messages: an attribute, not a property, as the queue reads it per enqueue
        # What a consumer's read-back brings into memory at most: a quarter of the store's page_above, so that
        # large messages are not read back a thousand at a time (a gigabyte of 1 MB ones).
        self.budget = max(1, store.page_above // 4)


    def can_page(self, entry: Entry) -> bool:
        return entry in self.journal.where

    def page(self, entries: list[Entry]) -> int:
        """Take these entries (the queue's newest, oldest first); the bytes that left memory."""
        where = self.journal.where
        store = self.store
        freed = 0
        for entry in entries:
            size = len(entry.data)
            self.bytes += size
            location = where.pop(entry, None)
            if location is None:
                self.kept[len(self.seqs)] = entry
                location = IN_MEMORY
            else:
                freed += size
            self.count += 1
            self.seqs.append(entry.seq)
            self.locations.append(location)
            self.lengths.append(records.enqueue_size(len(entry.data)))
            self.expiries.append(entry.expiry + store.clock if entry.expiry else 0.0)
        self.journal.memory_bytes -= freed
        return freed

    def load(self, seq: int, location: int, length: int, expiry: float) -> None:
        """A message recovery leaves on disk (past the memory budget), newest last."""
        self.count += 1
        self.seqs.append(seq)
        self.locations.append(location)
        self.lengths.append(length)
        self.expiries.append(expiry)
        self.bytes += length - records.ENQUEUE_OVERHEAD

    def take(self, n: int, max_bytes: int = 0) -> tuple[list[Entry], int]:
        """Up to n of the oldest paged messages as entries, stopping at one whose record is not yet synced, and
        with `max_bytes` once their data reaches it (one at least); and the bytes read back into memory."""
        taken: list[Entry] = []
        read = taken_bytes = 0
        synced = self.store.synced
        to_monotonic = time.monotonic() - time.time()
        where = self.journal.where
        with Reader(self.store.directory) as reader:
            while len(taken) < n and self.head < len(self.seqs) and not (max_bytes and taken_bytes >= max_bytes):
                i = self.head
                location, length = self.locations[i], self.lengths[i]
                if location == DROPPED:
                    self.dropped -= 1
                    self.head += 1
                    continue
                if location == IN_MEMORY:
                    entry = self.kept.pop(i)
                elif location + length > synced:
                    self.store.waiting_for_sync.add(self.journal.queue)  # dispatched again once synced
                    break
                else:
                    expiry = self.expiries[i]
                    entry = Entry(self.seqs[i], reader.body(location, length), expiry + to_monotonic if expiry else 0.0,
                                  True)
                    where[entry] = location
                    read += len(entry.data)
                taken.append(entry)
                taken_bytes += len(entry.data)
                self.bytes -= len(entry.data)
                self.count -= 1
                self.head += 1
        self.journal.memory_bytes += read
        self._shrink()
        return taken, read

    def peek(self) -> list[Entry]:
        to_monotonic = time.monotonic() - time.time()
        with Reader(self.store.directory) as reader:
            return [self.kept[i] if self.locations[i] == IN_MEMORY else
                    Entry(self.seqs[i], reader.body(self.locations[i], self.lengths[i]),
                          self.expiries[i] + to_monotonic if self.expiries[i] else 0.0, True)
                    for i in self._live()]

    def oldest(self) -> int:
        """The seq of the oldest paged message (count > 0; a cold path: dropped ones may lie at the head)."""
        i = self.head
        while self.locations[i] == DROPPED:
            i += 1
        return self.seqs[i]

    def paged_seqs(self) -> list[int]:
        return [self.seqs[i] for i in self._live()]

    def drop(self, first: int, last: int) -> list[tuple[int, int, int]]:
        """Dequeue the paged messages whose seq is in [first, last] (a replica applying its primary's
        dequeues): journalled like any dequeue; (seq, size, size that was in memory) of each."""
        store, journal = self.store, self.journal
        dropped = []
        i = bisect.bisect_left(self.seqs, first, lo=self.head)
        while i < len(self.seqs) and self.seqs[i] <= last:
            location = self.locations[i]
            if location == IN_MEMORY:
                size = len(self.kept.pop(i).data)
                dropped.append((self.seqs[i], size, size))
            elif location != DROPPED:
                size = self.lengths[i] - records.ENQUEUE_OVERHEAD
                store.live[location >> SHIFT] -= 1
                store.live_bytes -= size
                store.dequeue(journal.qid, self.seqs[i])
                dropped.append((self.seqs[i], size, 0))
            if location != DROPPED:
                self.locations[i] = DROPPED
                self.dropped += 1
                self.count -= 1
                self.bytes -= size
            i += 1
        while self.head < len(self.seqs) and self.locations[self.head] == DROPPED:  # a dropped front goes
            self.head += 1
            self.dropped -= 1
        self._shrink()
        return dropped

    def _live(self) -> list[int]:
        return [i for i in range(self.head, len(self.seqs)) if self.locations[i] != DROPPED]

    def located_in(self, segments: set[int]) -> list[int]:
        """Indexes of paged messages whose records are in these segments (compaction)."""
        return [i for i in self._live() if self.locations[i] != IN_MEMORY and self.locations[i] >> SHIFT in segments]

    def clear(self) -> int:
        """Forget every paged message (the queue is deleted); the bytes of those that were in memory."""
        live = self.store.live
        for i in self._live():
            if self.locations[i] != IN_MEMORY:
                live[self.locations[i] >> SHIFT] -= 1
                self.store.live_bytes -= self.lengths[i] - records.ENQUEUE_OVERHEAD
        in_memory = sum(len(e.data) for e in self.kept.values())
        self.seqs, self.locations, self.lengths, self.expiries = array("q"), array("q"), array("l"), array("d")
        self.head = 0
        self.kept.clear()
        self.bytes = self.dropped = self.count = 0
        return in_memory

    def _shrink(self) -> None:
        """Drop the taken front once it is half the arrays (amortised O(1) per message)."""
        head = self.head
        if head and head * 2 >= len(self.seqs):
            for a in (self.seqs, self.locations, self.lengths, self.expiries):
                del a[:head]
            self.kept = {i - head: e for i, e in self.kept.items()}
            self.head = 0


class Reader:
    """Reads message bodies back from journal segments, one open file per segment."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.files: dict[int, int] = {}

    def body(self, location: int, length: int) -> bytes:
        segment, offset = location >> SHIFT, location & ((1 << SHIFT) - 1)
        fd = self.files.get(segment)
        if fd is None:
            fd = self.files[segment] = os.open(segment_path(self.directory, segment), os.O_RDONLY)
        data = os.pread(fd, length, offset)
        record = records.message_at(data)
        if record is None:
            raise OSError(f"{segment_path(self.directory, segment)}: the record at offset {offset} does not read "
                          f"back (checksum or length)")
        return record

    def close(self) -> None:
        for fd in self.files.values():
            os.close(fd)
        self.files.clear()

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
