"""The audit log: a broker plug-in that writes replication events as JSON lines (schema.py).

The hot path appends (time, seq, message bytes) to the queue's `_lines.Recorder`, in C, and
returns: on a primary (or standalone broker) the recorder is the queue's observer; completions and
a backup's replication reach it through the hooks below. Every `flush_interval` the engine's timer
takes the recorders' records (under the current context: role, epoch, the backups ready for the
queue), numbers their lines and hands them to the writer thread, which formats and writes them in
C with the GIL released (`_lines.write`), so the broker's thread goes on meanwhile. A change of
context (a promotion, a newer epoch, a backup becoming ready for a queue or dropped) takes the
records first, through HA's context hooks, so every line carries the context its event happened in.

A crash loses at most the records not yet written; it cannot tear an earlier line, and a new
process starts a new file, so a torn last line is never followed by more data.
"""
from __future__ import annotations

import atexit
import logging
import threading
import time
from queue import SimpleQueue
from typing import TYPE_CHECKING

from ..broker.queue import Entry, Queue
from ..config import AuditConfig
from . import _lines, schema
from ._lines import Recorder
from .lines import BACKUP_KINDS, PRIMARY_KINDS, Group, Kind, LineFormatter
from .writer import Writer

if TYPE_CHECKING:
    from ..broker.server import Broker
    from ..ha import HaBroker

log = logging.getLogger("haqueue.audit")

MARK_INTERVAL_NS = 1_000_000_000  # see schema.MARK
_now = time.time_ns
# A backup's replication hook: the kind of record for the primary's delivery tag (else a dequeue).
_REPLICATED = {b"E": _lines.LIVE, b"C": _lines.CATCHUP}


class AuditLog:
    """One per broker process, made by the plug-in that cli.py passes to `broker.server.run`."""

    def __init__(self, broker: "Broker", config: AuditConfig, ha: "HaBroker | None") -> None:
        self.ha = ha
        self.queues: dict[Queue, Recorder] = {}
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
            recorder = self.queues[queue] = Recorder()
            if self.primary_side:
                queue.observers.append(recorder)

    def promoted(self) -> None:
        """From now on this broker logs what clients do (what it logged as a backup is written)."""
        self.primary_side = True
        for queue, recorder in self.queues.items():
            queue.observers.append(recorder)

    # -- the hot path: append and return -------------------------------------------------------
    def completed(self, queue: Queue, entry: Entry) -> None:
        recorder = self.queues.get(queue)
        if recorder is not None:
            recorder.completed(entry)

    def replicated(self, queue: Queue, kind: bytes, seq: int, enqueued_us: int, data: bytes) -> None:
        """The HA replication hook, on a backup."""
        recorder = self.queues.get(queue)
        if recorder is not None:
            recorder.add(_REPLICATED.get(kind, _lines.MIRRORED), seq, data, enqueued_us)

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
        """Every recorder's records, numbered, under the current context."""
        ha = self.ha
        epoch = ha.epoch.epoch if ha is not None else 0
        role, lines = self.role, self.lines
        job: list[bytes | Group] = []
        for queue, recorder in self.queues.items():
            for kind in PRIMARY_KINDS if self.primary_side else BACKUP_KINDS:
                batch = recorder.take(kind.index)
                if batch is not None:
                    backups = ha.ready_backups(queue) if ha is not None and kind is Kind.COMPLETE else ()
                    job.append(lines.group(lines.parts(kind, role, epoch, queue.name, queue.uid, backups), batch))
        return job

    def _mark(self) -> bytes:
        """A mark: the log is complete up to now."""
        ha = self.ha
        self.last_mark = _now()
        return self.lines.mark(self.last_mark, self.role, ha.epoch.epoch if ha is not None else 0)

    def _run_writer(self) -> None:
        """The writer thread: formats and writes each job (in C, without the GIL)."""
        while (job := self.jobs.get()) is not None:
            try:
                self.writer.write(job)
            except Exception:  # noqa: BLE001 - the thread must go on; the gap shows in the audit
                log.exception("audit: writing %d groups failed", len(job))

    def close(self) -> None:
        """At exit: write everything left, and a mark."""
        self.jobs.put([*self.take(), self._mark()])
        self.jobs.put(None)
        self.thread.join(timeout=10)
        self.writer.close()
