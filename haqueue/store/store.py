"""Store: the durable store plug-in (design/store.md). It journals durable wiring and messages, holds
the completion of a durable publish until its record is on disk, recovers at start-up and compacts.

On the broker's thread it only encodes records and appends them to this pass's list; the writer
thread (writer.py) writes and syncs them.
"""
from __future__ import annotations

import atexit
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable

from ..broker.completion import Completion
from ..broker.errors import RecoveryError
from ..broker.message import is_durable
from ..broker.queue import DEQUEUED, Entry, Queue
from ..config import StoreConfig
from . import records
from .recovery import Image, read_journal
from .records import Corrupt
from .wiring import WiringJournal
from .writer import Job, Writer

if TYPE_CHECKING:
    from ..broker.server import Broker

log = logging.getLogger("haqueue.store")

COMPACT_INTERVAL = 1.0  # seconds between looks at the oldest segment


def durable_queue(queue: Queue) -> bool:
    return not queue.temporary and queue.args.get("durable", True) is not False


class QueueJournal:
    """One durable queue's journal: its guard and observer. `where` maps each journalled live entry to
    the segment holding its latest record (what compaction needs)."""

    def __init__(self, store: "Store", qid: int) -> None:
        self.store = store
        self.qid = qid
        self.where: dict[Entry, int] = {}

    # -- guard: only asked for durable messages (queue.durable_guards) ------------------------
    def hold(self, queue: Queue, entry: Entry, completion: Completion) -> None:
        completion.hold()
        self.store.waiting.append(completion)

    @property
    def refusal(self) -> str | None:
        failing = self.store.writer.failing if self.store.writer else None
        return f"durable messages are refused: the journal cannot write ({failing})" if failing else None

    # -- observer ---------------------------------------------------------------------------
    def enqueued(self, queue: Queue, entry: Entry) -> None:
        if is_durable(entry.data):
            self.store.write_enqueue(self, entry)

    def acquired(self, queue: Queue, entry: Entry) -> None:
        pass

    def dequeued(self, queue: Queue, entry: Entry) -> None:
        segment = self.where.pop(entry, None)
        if segment is not None:
            self.store.write_dequeue(self, entry, segment, queue.deleted)

    def merged(self, queue: Queue, entries: list[Entry]) -> None:
        for entry in entries:
            if entry.state != DEQUEUED and is_durable(entry.data):
                self.store.write_enqueue(self, entry)

    def redelivered(self, queue: Queue, entry: Entry) -> None:
        if entry in self.where:  # its delivery-count changed: the newer record wins at recovery
            self.store.write_enqueue(self, entry)


class Store:
    """Made by the plug-in function before the broker starts; recovers when the broker starts."""

    def __init__(self, broker: "Broker", config: StoreConfig) -> None:
        self.broker = broker
        self.config = config
        self.directory = os.path.join(broker.config.data_dir, "journal")
        self.journals: dict[Queue, QueueJournal] = {}
        self.wiring = WiringJournal(self)
        self.next_qid = 1
        # This pass's records and the completions they will release, handed to the writer at its end.
        self.pending: list[bytes] = []
        self.pending_size = 0
        self.waiting: list[Completion] = []
        self.scheduled = False
        self.deleted = False  # Dispatchable: the broker skips deleted items
        self.segment = 0  # the segment being written
        self.snapshot_on_disk = 0  # the newest segment whose header and wiring snapshot are synced
        self.sizes: dict[int, int] = {}  # bytes per segment, as handed to the writer
        self.live: dict[int, int] = {}  # live message records per segment
        self.live_bytes = 0
        self.started = time.time()
        self.clock = time.time() - time.monotonic()  # wall clock = monotonic + clock (expiry is monotonic)
        self.writer: Writer | None = None
        broker.durability = self
        broker.status_hooks.append(self._broker_status)
        broker.management.register("store", "READ", lambda name, body: (200, self.status()))

    # -- recovery -------------------------------------------------------------------------------
    def recover(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        started = time.monotonic()
        try:
            image = read_journal(self.directory, repair=True)
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
        self.writer = Writer(self.directory, self._synced)
        self._roll(max(image.segments, default=0) + 1)
        self.broker.engine.every(COMPACT_INTERVAL, self.compact)
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
        for q in image.queues.values():
            queue, _ = registry.declare_queue(q.name, dict(q.args), uid=q.uid)
            journal = self.journals[queue] = QueueJournal(self, q.qid)
            entries: list[Entry] = []
            for seq in sorted(q.messages):
                record, segment = q.messages[seq]
                if record.expiry and record.expiry <= now:
                    continue  # its ttl ran out while the broker was down
                entry = Entry(seq, record.data, record.expiry + to_monotonic if record.expiry else 0.0)
                entries.append(entry)
                journal.where[entry] = segment
                self.live[segment] = self.live.get(segment, 0) + 1
                self.live_bytes += len(record.data)
            queue.merge(entries)
            queue.next_seq = max(queue.next_seq, q.max_seq + 1)
        for (exchange, queue_name, key), b in image.bindings.items():
            if exchange in registry.nodes and queue_name in registry.nodes:
                registry.bind(exchange, queue_name, key, dict(b["args"]), uid=b["uid"])

    def _watch(self, queue: Queue) -> None:
        if not durable_queue(queue):
            return
        journal = self.journals.get(queue)
        if journal is None:
            journal = self.journals[queue] = QueueJournal(self, self.next_qid)
            self.next_qid += 1
        queue.durable_guards.append(journal)
        queue.observers.append(journal)

    # -- messages (the hot path: encode, append, return) ------------------------------------------
    def write_enqueue(self, journal: QueueJournal, entry: Entry) -> None:
        segment = self.segment
        previous = journal.where.get(entry)
        if previous is None:
            self.live_bytes += len(entry.data)
        else:
            self.live[previous] -= 1
        journal.where[entry] = segment
        self.live[segment] += 1
        self.append(records.enqueue(journal.qid, entry.seq, entry.expiry + self.clock if entry.expiry else 0.0,
                                     entry.data))

    def write_dequeue(self, journal: QueueJournal, entry: Entry, segment: int, queue_deleted: bool) -> None:
        self.live[segment] -= 1
        self.live_bytes -= len(entry.data)
        if not queue_deleted:  # a deleted queue's record says it all
            self.append(records.dequeue(journal.qid, entry.seq))

    def append(self, record: bytes) -> None:
        self.pending.append(record)
        self.pending_size += len(record)
        if not self.scheduled:
            self.scheduled = True
            self.broker.schedule(self)

    def after_sync(self, callback: Callable[[], None]) -> None:
        """`callback` once this pass's records, and all before them, are on disk (a sync of its own if
        there are none)."""
        self.waiting.append(Completion(callback))
        if not self.scheduled:
            self.scheduled = True
            self.broker.schedule(self)

    def dispatch(self) -> None:
        """The end of a loop pass: hand this pass's records to the writer as one job."""
        self.scheduled = False
        if self.pending or self.waiting:
            self._flush()

    def _flush(self, unlink: list[int] | None = None) -> None:
        job = Job(self.pending, self.pending_size, done=self.waiting, unlink=unlink or [])
        self.pending, self.pending_size, self.waiting = [], 0, []
        self._submit(job)
        if self.sizes[self.segment] >= self.config.segment_bytes:
            self._roll(self.segment + 1)

    def _submit(self, job: Job) -> None:
        self.sizes[self.segment] += job.size
        assert self.writer is not None
        self.writer.submit(job)

    def _roll(self, number: int) -> None:
        """Start segment `number`: its header, then the wiring as it is now."""
        self.segment = number
        self.sizes[number] = 0
        self.live[number] = 0
        snapshot = [records.segment_header(number), *self.wiring.snapshot()]
        self._submit(Job(snapshot, sum(map(len, snapshot)), roll=number))

    def _synced(self, jobs: list[Job]) -> None:
        """On the writer thread: these jobs are on disk; settle their publishes on the broker's thread."""
        done = [c for job in jobs for c in job.done]
        rolled = max((job.roll for job in jobs), default=0)
        if done or rolled:
            self.broker.engine.call_soon_threadsafe(lambda: self._release(done, rolled))

    def _release(self, done: list[Completion], rolled: int) -> None:
        self.snapshot_on_disk = max(self.snapshot_on_disk, rolled)
        for completion in done:
            completion.release()

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
            self._drop(rewrite)
            self._flush(unlink=rewrite)
            log.debug("compacted segments %s (%d messages written forward)", rewrite, len(forward))

    def _drop(self, numbers: list[int]) -> None:
        for number in numbers:
            del self.sizes[number]
            self.live.pop(number, None)

    def _live_in(self, segments: set[int]) -> list[tuple[QueueJournal, Entry]]:
        return [(journal, entry) for journal in self.journals.values()
                for entry, segment in journal.where.items() if segment in segments]

    # -- status and shutdown ------------------------------------------------------------------
    def position(self) -> tuple[int, int]:
        return self.segment, self.sizes.get(self.segment, 0)

    def status(self) -> dict[str, Any]:
        writer = self.writer
        oldest = min(self.sizes, default=self.segment)
        return {"directory": self.directory, "segments": len(self.sizes), "bytes": sum(self.sizes.values()),
                "live_messages": sum(self.live.values()), "live_bytes": self.live_bytes,
                "oldest_segment": oldest, "position": list(self.position()),
                "syncs": writer.syncs if writer else 0,
                "last_sync_ms": round(writer.last_sync_seconds * 1000, 3) if writer else None,
                "failing": writer.failing if writer else None}

    def _broker_status(self, status: dict[str, Any]) -> None:
        status["store"] = {"segments": len(self.sizes), "bytes": sum(self.sizes.values())}

    def close(self) -> None:
        """At exit: write what this pass left, then stop the writer."""
        if self.writer is not None:
            if self.pending:
                self._flush()
            self.writer.close()
            self.writer = None
