"""The audit log: a broker plug-in that writes replication events as JSON lines (schema.py).

The hot path appends (time, seq, message bytes) to the queue's `QueueEvents` list for that kind of
event, and returns. Every `flush_interval` the engine's timer takes the lists (under the current
context: role, epoch, the backups ready for the queue), numbers their lines and hands them to the
writer thread, which formats and writes them in C with the GIL released (`_lines.write`), so the
broker's thread goes on meanwhile. A change of context (a promotion, a newer epoch, a backup
becoming ready for a queue or dropped) takes the lists first, through HA's context hooks, so every
line carries the context its event happened in.

A crash loses at most the records not yet written; it cannot tear an earlier line, and a new
process starts a new file, so a torn last line is never followed by more data.
"""
from __future__ import annotations

import atexit
import logging
import threading
import time
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING

from ..broker.queue import Entry, Queue
from ..config import AuditConfig
from . import schema
from .lines import BACKUP_KINDS, PRIMARY_KINDS, Group, Kind, LineFormatter, Records
from .writer import Writer

if TYPE_CHECKING:
    from ..broker.server import Broker
    from ..ha import HaBroker

log = logging.getLogger("haqueue.audit")

MARK_INTERVAL_NS = 1_000_000_000  # see schema.MARK
_now = time.time_ns


class QueueEvents:
    """One logged queue's records since the last flush, a flat list per kind (lines.Records). On a
    primary (or standalone broker) it is the queue's observer; on a backup AuditLog.replicated fills
    it. Each flush swaps its lists for emptied ones the writer thread gives back."""

    __slots__ = ("enqueues", "completes", "dequeues", "live", "catchup", "mirrored")

    def __init__(self) -> None:
        self.enqueues: Records = []
        self.completes: Records = []
        self.dequeues: Records = []
        self.live: Records = []
        self.catchup: Records = []
        self.mirrored: Records = []

    def enqueued(self, queue: Queue, entry: Entry) -> None:
        self.enqueues.extend((_now(), entry.seq, entry.data))

    def acquired(self, queue: Queue, entry: Entry) -> None:
        pass

    def dequeued(self, queue: Queue, entry: Entry) -> None:
        if not queue.deleted:  # a deleted queue's purge is not a consume
            self.dequeues.extend((_now(), entry.seq, entry.data))


class AuditLog:
    """One per broker process, made by the plug-in that cli.py passes to `broker.server.run`."""

    def __init__(self, broker: "Broker", config: AuditConfig, ha: "HaBroker | None") -> None:
        self.ha = ha
        self.queues: dict[Queue, QueueEvents] = {}
        self.lines = LineFormatter(broker.name)
        self.writer = Writer(config.dir, broker.name, config.max_bytes)
        self.primary_side = ha is None or ha.primary is not None  # what this broker logs: clients' doings
        for queue in broker.registry.queues():
            self._watch(queue)
        broker.registry.queue_hooks.append(self._watch)
        broker.completion_hooks.append(self.completed)
        if ha is not None:
            ha.replication_hooks.append(self.replicated)
            ha.context_hooks.append(self.context_changing)
            ha.promotion_hooks.append(self.promoted)
        self.jobs: SimpleQueue[list[bytes | Group] | None] = SimpleQueue()  # to the writer thread, in order
        self.spares: SimpleQueue[Records] = SimpleQueue()  # emptied lists, back from it
        self.thread = threading.Thread(target=self._run_writer, name="audit-writer", daemon=True)
        self.thread.start()
        self.jobs.put([self._mark()])  # the run starts
        broker.engine.every(config.flush_interval, self.flush)
        atexit.register(self.close)
        log.info("audit events to %s", self.writer.directory)

    @property
    def role(self) -> str:
        return schema.STANDALONE if self.ha is None else schema.PRIMARY if self.primary_side else schema.BACKUP

    # -- which queues --------------------------------------------------------------------------
    def _watch(self, queue: Queue) -> None:
        """Queues whose messages are replicated (all but temporary ones on a broker without HA)."""
        replicated = self.ha.policy.replicates_messages(queue) if self.ha is not None else not queue.temporary
        if replicated:
            events = self.queues[queue] = QueueEvents()
            if self.primary_side:
                queue.observers.append(events)

    def promoted(self) -> None:
        """From now on this broker logs what clients do (what it logged as a backup is written)."""
        self.primary_side = True
        for queue, events in self.queues.items():
            queue.observers.append(events)

    # -- the hot path: append and return -------------------------------------------------------
    def completed(self, queue: Queue, entry: Entry) -> None:
        events = self.queues.get(queue)
        if events is not None:
            events.completes.extend((_now(), entry.seq, entry.data))

    def replicated(self, queue: Queue, kind: bytes, seq: int, enqueued_us: int, data: bytes) -> None:
        """The HA replication hook, on a backup."""
        events = self.queues.get(queue)
        if events is None:
            return
        if kind == b"E":
            events.live.extend((_now(), seq, data, enqueued_us))
        elif kind == b"C":
            events.catchup.extend((_now(), seq, data))
        else:
            events.mirrored.extend((_now(), seq, data))

    # -- off the hot path ----------------------------------------------------------------------
    def flush(self) -> None:
        """The engine's timer: hand what was buffered to the writer thread."""
        job = self.take()
        if _now() - self.last_mark >= MARK_INTERVAL_NS:
            job.append(self._mark())
        if job:
            self.jobs.put(job)
        for queue in [q for q in self.queues if q.deleted]:  # its last records are taken
            del self.queues[queue]

    def context_changing(self) -> None:
        """HA's context hook: what was buffered goes out under the context it happened in."""
        job = self.take()
        if job:
            self.jobs.put(job)

    def take(self) -> list[bytes | Group]:
        """Every list's records, numbered, under the current context; each list is replaced by an
        emptied one the writer thread gives back (an old list: the garbage collector skips it)."""
        ha = self.ha
        epoch = ha.epoch.epoch if ha is not None else 0
        role, lines = self.role, self.lines
        job: list[bytes | Group] = []
        for queue, events in self.queues.items():
            for kind in PRIMARY_KINDS if self.primary_side else BACKUP_KINDS:
                records = getattr(events, kind.records)
                if records:
                    backups = ha.ready_backups(queue) if ha is not None and kind is Kind.COMPLETE else ()
                    parts = lines.parts(kind, role, epoch, queue.name, queue.uid, backups)
                    job.append(lines.group(kind, parts, records))
                    setattr(events, kind.records, self._spare())
        return job

    def _spare(self) -> Records:
        try:
            return self.spares.get_nowait()
        except Empty:
            return []

    def _mark(self) -> bytes:
        """A mark: the log is complete up to now."""
        ha = self.ha
        self.last_mark = _now()
        return self.lines.mark(self.last_mark, self.role, ha.epoch.epoch if ha is not None else 0)

    def _run_writer(self) -> None:
        """The writer thread: formats and writes each job (in C, without the GIL), then empties its lists."""
        while (job := self.jobs.get()) is not None:
            try:
                self.writer.write(job)
            except Exception:  # noqa: BLE001 - the thread must go on; the gap shows in the audit
                log.exception("audit: writing %d groups failed", len(job))
            for group in job:
                if type(group) is tuple:
                    group[1].clear()
                    self.spares.put(group[1])

    def close(self) -> None:
        """At exit: write everything left, and a mark."""
        self.jobs.put([*self.take(), self._mark()])
        self.jobs.put(None)
        self.thread.join(timeout=10)
        self.writer.close()
