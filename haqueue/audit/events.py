"""The audit log: a broker plug-in that writes replication events as JSON lines (schema.py).

The hot path appends (time, seq, message bytes) to the queue's `_lines.Recorder`, in C, and
returns: on a primary (or standalone broker) the recorder is the queue's observer (queue_observer.py); completions and
a backup's replication reach it through the hooks below. At the end of every loop pass, before the
engine writes the pass's output to the sockets (`broker.flush_hooks`), the recorders that recorded
something are taken (under the current context: role, epoch, the backups ready for the queue),
numbered, formatted and written with one `write` (`_lines.write`, in C, the GIL released). So an
event is in its file before the confirmation or settlement it records leaves the broker: a kill -9
loses none; only a machine crash can lose what the page cache held. A change of context (a
promotion, a newer epoch, a backup becoming ready for a queue or dropped) writes the records first,
through HA's context hooks, so every line carries the context its event happened in.

A crash cannot tear an earlier line, and a new process starts a new file, so a torn last line is
never followed by more data.
"""
from __future__ import annotations

import atexit
import logging
import time
from typing import TYPE_CHECKING

from ..broker.queue import Entry, Queue
from ..config import AuditConfig
from . import _lines, schema
from ._lines import Recorder
from .lines import BACKUP_KINDS, PRIMARY_KINDS, Group, Kind, LineFormatter
from .queue_observer import RecorderObserver
from .writer import Writer

if TYPE_CHECKING:
    from ..broker.server import Broker
    from ..ha import HaBroker

log = logging.getLogger("haqueue.audit")

MARK_INTERVAL = 1.0  # seconds between marks (schema.MARK)
_now = time.time_ns
# A backup's replication hook: the kind of record for the transfer kind it passes (haqueue.ha.protocol's ENQUEUE,
# CATCHUP, DIVERGED: kept aside at a rejoin, not dequeued), else a dequeue it mirrored (DEQUEUE).
_REPLICATED = {b"E": _lines.LIVE, b"C": _lines.CATCHUP, b"V": _lines.DIVERGED}


class AuditLog:
    """One per broker process, made by the plug-in that cli.py passes to `broker.server.run`."""

    def __init__(self, broker: "Broker", config: AuditConfig, ha: "HaBroker | None", shard: int | None = None) -> None:
        """`shard`: this process's shard in a sharded cluster (every line says it)."""
        self.ha = ha
        self.queues: dict[Queue, Recorder] = {}
        self.owners: dict[Recorder, Queue] = {}
        self.pending: list[Recorder] = []  # recorders with records, listed by their first (in C)
        self.mark_due = True  # the next write ends with a mark (the run starts)
        self.lines = LineFormatter(broker.name, shard, len(ha.config.brokers) if ha is not None else 1)
        self.writer = Writer(config.dir, broker.name, config.max_bytes)
        self.rotate_seconds = config.rotate_seconds
        self.primary_side = ha is None or ha.primary is not None  # what this broker logs: clients' doings
        for queue in broker.registry.queues():
            self._watch(queue)
        broker.registry.queue_hooks.append(self._watch)
        broker.completion_hooks.append(self.completed)
        if ha is not None:
            ha.replication_hooks.append(self.replicated)
            ha.context_hooks.append(self.context_changing)
            ha.promotion_hooks.append(self.promoted)
        broker.flush_hooks.append(self.write)
        broker.engine.every(MARK_INTERVAL, self.tick)
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
            recorder = self.queues[queue] = Recorder(self.pending)
            self.owners[recorder] = queue
            if self.primary_side:
                queue.observers.append(RecorderObserver(recorder))

    def promoted(self) -> None:
        """From now on this broker logs what clients do (what it logged as a backup is written)."""
        self.primary_side = True
        for queue, recorder in self.queues.items():
            queue.observers.append(RecorderObserver(recorder))

    # -- the hot path: append and return -------------------------------------------------------
    def completed(self, queue: Queue, entry: Entry) -> None:
        recorder = self.queues.get(queue)
        if recorder is not None:
            if entry.local:  # kept off the backups: confirmed with no copy anywhere else, as it asked
                recorder.add(_lines.KEPT_LOCAL, entry.seq, entry.data)
            else:
                recorder.completed(entry)

    def replicated(self, queue: Queue, kind: bytes, seq: int, enqueued_us: int, data: bytes) -> None:
        """The HA replication hook, on a backup."""
        recorder = self.queues.get(queue)
        if recorder is not None:
            recorder.add(_REPLICATED.get(kind, _lines.MIRRORED), seq, data, enqueued_us)

    # -- off the hot path ----------------------------------------------------------------------
    def write(self) -> None:
        """The broker's flush hook (the end of a pass) and HA's context hook: what was recorded goes
        into the file, with one write, under the context it happened in."""
        if self.pending or self.mark_due:
            job = self.take()
            self.writer.write(job)

    context_changing = write

    def tick(self) -> None:
        """The engine's timer: a mark (the log is complete up to now), the file closed if it is old enough
        to go to `audit ship`, and deleted queues forgotten."""
        self.mark_due = True
        self.write()
        self.writer.expire(self.rotate_seconds)
        for queue in [q for q in self.queues if q.deleted]:  # their last records are written
            del self.owners[self.queues.pop(queue)]

    def take(self) -> list[bytes | Group]:
        """The records of every recorder listed as pending, numbered, under the current context; then
        a mark if one is due."""
        ha = self.ha
        epoch = ha.epoch.epoch if ha is not None else 0
        role, lines = self.role, self.lines
        job: list[bytes | Group] = []
        for recorder in self.pending:
            queue = self.owners[recorder]
            recorder.unlist()
            for kind in PRIMARY_KINDS if self.primary_side else BACKUP_KINDS:
                batch = recorder.take(kind.index)
                if batch is not None:
                    backups = ha.ready_backups(queue) if ha is not None and kind is Kind.COMPLETE else ()
                    job.append(lines.group(lines.parts(kind, role, epoch, queue.name, queue.uid, backups), batch))
        self.pending.clear()
        if self.mark_due:
            job.append(self._mark())
            self.mark_due = False
        return job

    def _mark(self) -> bytes:
        """A mark: the log is complete up to now."""
        ha = self.ha
        return self.lines.mark(_now(), self.role, ha.epoch.epoch if ha is not None else 0)

    def close(self) -> None:
        """At exit: write everything left, and a mark."""
        self.mark_due = True
        self.write()
        self.writer.close()
