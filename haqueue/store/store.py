"""Store: the durable store plug-in (design/store.md). It journals durable wiring and messages, holds
the completion of a durable publish until its record is on disk, recovers at start-up and compacts.

On the broker's thread it only encodes records and appends them to this pass's list; the writer
thread (writer.py) writes and syncs them.
"""
from __future__ import annotations

import atexit
import gc
import logging
import os
import time
from datetime import datetime, timezone
from typing import Any, Callable, Final, TYPE_CHECKING

from ..broker.completion import Completion
from ..broker.errors import RecoveryError
from ..broker.queue import Entry, Queue, seq_ranges
from ..config import StoreConfig
from . import records
from .pager import SHIFT, QueuePager, Reader
from .recovery import Image, journal_bytes, read_journal
from .records import Corrupt
from .wiring import WiringJournal
from .writer import Job, Writer

if TYPE_CHECKING:
    from ..broker.server import Broker

log = logging.getLogger("haqueue.store")

COMPACT_INTERVAL: Final = 1.0  # seconds between looks at the oldest segment
PAGE_INTERVAL: Final = 0.1  # seconds between looks at the memory held by durable bodies


def durable_queue(queue: Queue) -> bool:
    return not queue.temporary and queue.args.get("durable", True) is not False


class QueueJournal:
    """One durable queue's journal (the queue's `Journal`: it holds durable publishes until they are on disk
    and records what happens to them), and its pager. `where` maps each journalled entry in memory to its
    latest record's location (segment << 40 | offset: compaction and paging)."""

    def __init__(self, store: "Store", queue: Queue, qid: int) -> None:
        self.store = store
        self.queue = queue
        self.qid = qid
        self.where: dict[Entry, int] = {}
        self.memory_bytes = 0  # bodies of journalled entries held in memory
        self.pager = QueuePager(store, self)

    # -- the queue's journal: told of durable messages only (queue.journals) ----------------
    def hold(self, queue: Queue, entry: Entry, completion: Completion) -> None:
        completion.hold()
        self.store.waiting.append(completion)

    @property
    def refusal(self) -> str | None:
        failing = self.store.writer.failing if self.store.writer else None
        return f"durable messages are refused: the journal cannot write ({failing})" if failing else None

    def enqueued(self, queue: Queue, entry: Entry) -> None:
        """A new durable message: its record joins this pass's."""
        store = self.store
        data = entry.data
        size = len(data)
        store.live_bytes += size
        self.memory_bytes += size
        self.where[entry] = store.next_location()
        store.live[store.segment] += 1
        store.append_message(records.enqueue_head(self.qid, entry.seq, entry.expiry + store.clock if entry.expiry else 0.0,
                                                  data), data)

    def dequeued(self, queue: Queue, entry: Entry) -> None:
        location = self.where.pop(entry, None)
        if location is None:
            return
        store = self.store
        size = len(entry.data)
        store.live[location >> SHIFT] -= 1
        store.live_bytes -= size
        self.memory_bytes -= size
        if not queue.deleted:  # a deleted queue's record says it all
            store.dequeue(self.qid, entry.seq)

    def merged(self, queue: Queue, entries: list[Entry]) -> None:
        for entry in entries:
            self.store.write_enqueue(self, entry)

    def redelivered(self, queue: Queue, entry: Entry) -> None:
        if entry in self.where:  # its delivery-count changed: the newer record wins at recovery
            self.store.write_enqueue(self, entry)


class AtomicGroup:
    """A group's head is appended first with a count of 0 and rewritten at the end with the real one
    (the same size, so every location taken meanwhile stays true). A group never spans two writer jobs:
    it is made within one handler call, and jobs are made at the end of the pass."""

    def __init__(self, store: "Store") -> None:
        self.store = store
        self.pending = store.pending
        self.at = 0
        self.first = 0

    def __enter__(self) -> None:
        store = self.store
        store.write_dequeues()  # the pass's dequeues so far are not the group's
        self.at = len(store.pending)
        self.first = store.appended
        store.append(records.group(0))

    def __exit__(self, *exc: object) -> None:
        store = self.store
        store.write_dequeues()  # the group's own
        assert store.pending is self.pending, "a writer job was made inside an atomic group"
        self.pending[self.at] = records.group(store.appended - self.first - 1)


class Store:
    """Made by the plug-in function before the broker starts; recovers when the broker starts."""

    def __init__(self, broker: "Broker", config: StoreConfig) -> None:
        self.broker = broker
        self.config = config
        self.directory = os.path.join(broker.config.data_dir, "journal")
        self.journals: dict[Queue, QueueJournal] = {}
        self.wiring = WiringJournal(self.append, self.journals, lambda queue: self.journals.pop(queue, None),
                                    broker.registry)
        self.next_qid = 1
        # This pass's records and the completions they will release, handed to the writer at its end.
        self.pending: list[bytes] = []  # an E record as two pieces: its head, then the message
        self.pending_size = 0
        self.appended = 0  # records appended, ever
        self.dequeues: dict[int, list[int]] = {}  # qid -> this pass's dequeues, one record each at its end
        self.waiting: list[Completion] = []
        self.scheduled = False
        self.deleted = False  # Dispatchable: the broker skips deleted items
        self.segment = 0  # the segment being written
        self.snapshot_on_disk = 0  # the newest segment whose header and wiring snapshot are synced
        self.sizes: dict[int, int] = {}  # bytes per segment, as handed to the writer
        self.created: dict[int, float] = {}  # when each segment was started (wall clock)
        self.live: dict[int, int] = {}  # live message records per segment
        self.live_bytes = 0  # bodies of every live journalled message, in memory or paged
        self.synced = 0  # the location up to which the journal is on disk
        self.waiting_for_sync: set[Queue] = set()  # paging queues to dispatch again after the next sync
        # Durable bodies in memory above which the biggest queues page (default: an eighth of the RAM).
        self.page_above = config.page_above or os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 8
        self.clock = time.time() - time.monotonic()  # wall clock = monotonic + clock (expiry is monotonic)
        self.writer: Writer | None = None
        broker.durability = self
        broker.status_hooks.append(self._broker_status)
        broker.management.register("store", "READ", lambda name, body: (200, self.status()))

    # -- recovery -------------------------------------------------------------------------------
    def recover(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        started = time.monotonic()
        # A million entries made at once would set off the cyclic collector over and over (half the
        # time of a recovery); they make no cycles, so it waits, and they are frozen out of its sight.
        gc.disable()
        try:
            self._recover(started)
        finally:
            gc.freeze()
            gc.enable()

    def _recover(self, started: float) -> None:
        try:
            # A journal larger than the memory for durable bodies is located, not read into memory.
            image = read_journal(self.directory, repair=True, bodies=journal_bytes(self.directory) <= self.page_above)
        except Corrupt as e:
            raise RecoveryError(f"{e}. The journal cannot be trusted past this point: restore {self.directory} "
                                f"from a backup, or move the segment aside (the broker then starts from what is "
                                f"left, and a backup broker resyncs from its primary)") from None
        except OSError as e:
            raise RecoveryError(f"cannot read the journal in {self.directory}: {e}") from None
        self._load(image)
        registry = self.broker.registry
        for queue in registry.queues():  # what the journal had (the config's own queues come later)
            self._watch(queue)
        registry.queue_hooks.append(self._watch)
        registry.observers.append(self.wiring)
        self.sizes = dict(image.segments)
        self.created = dict(image.created)
        if image.segments:  # what was recovered is on disk: paged messages may be read back at once
            last = max(image.segments)
            self.synced = last << SHIFT | image.segments[last]
        self.writer = Writer(self.directory, self._synced)
        self._roll(max(image.segments, default=0) + 1)
        self.broker.engine.every(COMPACT_INTERVAL, self.compact)
        self.broker.engine.every(PAGE_INTERVAL, self.page)
        atexit.register(self.close)
        log.info("store %s: recovered %d queues, %d exchanges, %d bindings, %d messages from %d records in "
                 "%d segments in %.2f s", self.directory, len(image.queues), len(image.exchanges),
                 len(image.bindings), image.messages, image.records, len(image.segments),
                 time.monotonic() - started)

    def _load(self, image: Image) -> None:
        """Declare what the journal holds, each queue under the qid its records use."""
        registry = self.broker.registry
        self.next_qid = image.max_qid + 1
        for x in image.exchanges.values():
            registry.declare_exchange(x["name"], x["type"], dict(x["args"]), uid=x["uid"])
        now = time.time()
        to_monotonic = time.monotonic() - now
        budget = self.page_above * 3 // 4  # what stays in memory; the rest is paged from the start
        with Reader(self.directory) as reader:
            for q in image.queues.values():
                queue, _ = registry.declare_queue(q.name, dict(q.args), uid=q.uid)
                journal = self.journals[queue] = QueueJournal(self, queue, q.qid)
                queue.pager = journal.pager
                entries: list[Entry] = []
                where, live, pager = journal.where, self.live, journal.pager
                for seq in sorted(q.messages):
                    data, expiry, segment, offset, length = q.messages[seq]
                    if expiry and expiry <= now:
                        continue  # its ttl ran out while the broker was down
                    location = segment << SHIFT | offset
                    live[segment] = live.get(segment, 0) + 1
                    self.live_bytes += length - records.ENQUEUE_OVERHEAD
                    if budget <= 0 or pager.count:  # once a queue pages, the rest of it pages: the order holds
                        pager.load(seq, location, length, expiry)
                        continue
                    entry = Entry(seq, data or reader.body(location, length), expiry + to_monotonic if expiry else 0.0,
                                  True)
                    entries.append(entry)
                    where[entry] = location
                    journal.memory_bytes += len(entry.data)
                    budget -= len(entry.data)
                queue.merge(entries)
                queue.count_paged()
                queue.next_seq = max(queue.next_seq, q.max_seq + 1)
        for (exchange, queue_name, key), b in image.bindings.items():
            if exchange in registry.nodes and queue_name in registry.nodes:
                registry.bind(exchange, queue_name, key, dict(b["args"]), uid=b["uid"])

    def _watch(self, queue: Queue) -> None:
        if not durable_queue(queue):
            return
        journal = self.journals.get(queue)
        if journal is None:
            journal = self.journals[queue] = QueueJournal(self, queue, self.next_qid)
            self.next_qid += 1
        queue.journals.append(journal)
        queue.pager = journal.pager

    # -- messages (the hot path: encode, append, return) ------------------------------------------
    def write_enqueue(self, journal: QueueJournal, entry: Entry) -> None:
        """An entry's record again (redelivery, compaction, a merge): the newer one wins at recovery."""
        previous = journal.where.get(entry)
        if previous is not None:  # it is counted again as it is written
            self.live[previous >> SHIFT] -= 1
            self.live_bytes -= len(entry.data)
            journal.memory_bytes -= len(entry.data)
        journal.enqueued(journal.queue, entry)

    def next_location(self) -> int:
        """Where the next record appended goes."""
        return self.segment << SHIFT | (self.sizes[self.segment] + self.pending_size)

    def append(self, record: bytes) -> None:
        self.pending.append(record)
        self.pending_size += len(record)
        self.appended += 1
        self._flush_at_end_of_pass()

    def append_message(self, head: bytes, data: bytes) -> None:
        """An E record, head and message as they are (writev writes them one after the other)."""
        pending = self.pending
        pending.append(head)
        pending.append(data)
        self.pending_size += len(head) + len(data)
        self.appended += 1
        self._flush_at_end_of_pass()

    def dequeue(self, qid: int, seq: int) -> None:
        seqs = self.dequeues.get(qid)
        if seqs is None:
            seqs = self.dequeues[qid] = []
            self._flush_at_end_of_pass()
        seqs.append(seq)

    def write_dequeues(self) -> None:
        """The dequeues so far, a record per queue: at the end of the pass, and around an atomic group."""
        if self.dequeues:
            dequeues, self.dequeues = self.dequeues, {}
            for qid, seqs in dequeues.items():
                self.append(records.dequeues(qid, seq_ranges(seqs)))

    def atomically(self) -> "AtomicGroup":
        """Records appended within form one group that recovery keeps whole or not at all."""
        return AtomicGroup(self)

    def after_sync(self, callback: Callable[[], None]) -> None:
        """`callback` once this pass's records, and all before them, are on disk (a sync of its own if
        there are none)."""
        self.waiting.append(Completion(callback))
        self._flush_at_end_of_pass()

    def _flush_at_end_of_pass(self) -> None:
        if not self.scheduled:
            self.scheduled = True
            self.broker.schedule(self)

    def dispatch(self) -> None:
        """The end of a loop pass: hand this pass's records to the writer as one job."""
        self.scheduled = False
        if self.pending or self.waiting or self.dequeues:
            self._flush()

    def _flush(self, unlink: list[int] | None = None) -> None:
        self.write_dequeues()
        job = Job(self.pending, self.pending_size, done=self.waiting, unlink=unlink or [])
        self.pending, self.pending_size, self.waiting = [], 0, []
        self._submit(job)
        if self.sizes[self.segment] >= self.config.segment_bytes:
            self._roll(self.segment + 1)

    def _submit(self, job: Job) -> None:
        self.sizes[self.segment] += job.size
        job.end = self.segment << SHIFT | self.sizes[self.segment]
        assert self.writer is not None
        self.writer.submit(job)

    def _roll(self, number: int) -> None:
        """Start segment `number`: its header, then the wiring as it is now."""
        self.segment = number
        self.sizes[number] = 0
        self.live[number] = 0
        self.created[number] = time.time()
        snapshot = [records.segment_header(number, self.created[number]), *self.wiring.snapshot()]
        self._submit(Job(snapshot, sum(map(len, snapshot)), roll=number))

    def _synced(self, jobs: list[Job]) -> None:
        """On the writer thread: these jobs are on disk; settle their publishes on the broker's thread."""
        done = [c for job in jobs for c in job.done]
        rolled = max((job.roll for job in jobs), default=0)
        end = max(job.end for job in jobs)
        self.broker.engine.call_soon_threadsafe(lambda: self._release(done, rolled, end))

    def _release(self, done: list[Completion], rolled: int, end: int) -> None:
        self.snapshot_on_disk = max(self.snapshot_on_disk, rolled)
        self.synced = max(self.synced, end)
        for completion in done:
            completion.release()
        waiting, self.waiting_for_sync = self.waiting_for_sync, set()
        for queue in waiting:  # queues that stopped reading back at a record not yet on disk
            self.broker.schedule(queue)

    # -- compaction -----------------------------------------------------------------------------
    def compact(self) -> None:
        """Delete the oldest segments once nothing live is left in them; when the journal is larger than
        compact_ratio times the live data, write their live messages forward first (design/store.md).
        Only from the oldest on: a dequeue record may refer to an enqueue in any older segment."""
        # A segment may go once a newer one's wiring snapshot is on disk: it holds all that it declared.
        old = sorted(n for n in self.sizes if n < self.snapshot_on_disk)
        total = sum(self.sizes.values())
        limit = self.config.compact_ratio * self.live_bytes + self.config.segment_bytes
        dead: list[int] = []
        rewrite: list[int] = []
        for number in old:
            if self.live.get(number, 0) == 0 and not rewrite:
                dead.append(number)
            elif total > limit:
                rewrite.append(number)
            else:
                break
            total -= self.sizes[number]
        if dead:
            self._drop(dead)
            assert self.writer is not None
            self.writer.delete(dead)
        if rewrite:
            forward = self._live_in(set(rewrite))
            for journal, entry in forward:
                self.write_enqueue(journal, entry)
            paged = self._rewrite_paged(set(rewrite))
            self._drop(rewrite)
            self._flush(unlink=rewrite)
            log.debug("compacted segments %s (%d messages written forward, %d of them paged)", rewrite,
                      len(forward) + paged, paged)

    def _drop(self, numbers: list[int]) -> None:
        for number in numbers:
            del self.sizes[number]
            self.live.pop(number, None)
            self.created.pop(number, None)

    def _live_in(self, segments: set[int]) -> list[tuple[QueueJournal, Entry]]:
        return [(journal, entry) for journal in self.journals.values()
                for entry, location in journal.where.items() if location >> SHIFT in segments]

    def _rewrite_paged(self, segments: set[int]) -> int:
        """Paged messages whose records are in these segments: read back, written forward, re-pointed."""
        count = 0
        with Reader(self.directory) as reader:
            for journal in self.journals.values():
                pager = journal.pager
                for i in pager.located_in(segments):
                    data = reader.body(pager.locations[i], pager.lengths[i])
                    self.live[pager.locations[i] >> SHIFT] -= 1
                    self.live[self.segment] += 1
                    pager.locations[i] = self.next_location()
                    expiry = pager.expiries[i]
                    self.append_message(records.enqueue_head(journal.qid, pager.seqs[i], expiry, data), data)
                    count += 1
        return count

    # -- paging ---------------------------------------------------------------------------------
    def page(self) -> None:
        """While durable bodies in memory exceed page_above, the queues holding the most page their
        newest messages out (design/store.md, Paging)."""
        held = sum(j.memory_bytes for j in self.journals.values())
        if held <= self.page_above:
            return
        for journal in sorted(self.journals.values(), key=lambda j: j.memory_bytes, reverse=True):
            before = journal.memory_bytes
            if journal.queue.page_out(journal.queue.depth):
                held -= before - journal.memory_bytes
                log.info("queue %s pages: %d messages out of memory (durable bodies in memory were above "
                         "%d bytes)", journal.queue.name, journal.pager.count, self.page_above)
            if held <= self.page_above * 3 // 4:
                break

    # -- status and shutdown ------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        writer = self.writer
        oldest = min(self.sizes, default=self.segment)
        started = self.created.get(oldest)
        return {"directory": self.directory, "segments": len(self.sizes), "bytes": sum(self.sizes.values()),
                "live_messages": sum(self.live.values()), "live_bytes": self.live_bytes,
                "memory_bytes": sum(j.memory_bytes for j in self.journals.values()), "page_above": self.page_above,
                "paged_messages": sum(j.pager.count for j in self.journals.values()),
                "oldest_segment": oldest,
                "oldest_record": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds")
                if started else None, "position": [self.segment, self.sizes.get(self.segment, 0)],
                "syncs": writer.syncs if writer else 0,
                "last_sync_ms": round(writer.last_sync_seconds * 1000, 3) if writer else None,
                "failing": writer.failing if writer else None}

    def held(self) -> dict[str, int]:
        segment, offset = self.synced >> SHIFT, self.synced & ((1 << SHIFT) - 1)
        written = sum(size for n, size in self.sizes.items() if n >= segment) + self.pending_size
        return {"messages": sum(self.live.values()), "bytes": sum(self.sizes.values()) + self.pending_size,
                "unsynced_bytes": max(written - (offset if segment in self.sizes else 0), 0)}

    def _broker_status(self, status: dict[str, Any]) -> None:
        status["store"] = {"segments": len(self.sizes), "bytes": sum(self.sizes.values())}

    def close(self) -> None:
        """At exit: write what this pass left, then stop the writer."""
        if self.writer is not None:
            if self.pending:
                self._flush()
            self.writer.close()
            self.writer = None
