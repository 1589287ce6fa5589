"""The audit log: a broker plug-in that writes replication events as JSON lines (schema.py).

The hot path only appends a small tuple to a list (the message's bytes by reference, the time,
the seq). Every `flush_interval` the engine's timer takes the list and formats it into whole
lines, a slice of records per event-loop pass so a busy broker's IO keeps flowing, appending
each slice to the current file with one write. It runs on the engine's thread: a writer thread
would fight the event loop for the GIL (measured: it cost twice the CPU). A crash loses at most
the records not yet written; it cannot tear an earlier line, and a new process starts a new file,
so a torn last line is never followed by more data.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import re
import time
from json.encoder import encode_basestring  # the C encoder: a JSON string in a fraction of json.dumps' time
from typing import TYPE_CHECKING, Any

from ..broker.queue import Entry, Queue
from ..config import AuditConfig
from . import schema
from .message_id import message_id

if TYPE_CHECKING:
    from ..broker.server import Broker
    from ..ha import HaBroker

log = logging.getLogger("haqueue.audit")

# Kinds of buffered records; each has its own line template.
_ENQUEUE, _COMPLETE, _DEQUEUE, _LIVE, _CATCHUP, _BACKUP_DEQUEUE, _MARK = range(7)
_EVENT = {_ENQUEUE: schema.ENQUEUE, _COMPLETE: schema.COMPLETE, _DEQUEUE: schema.DEQUEUE,
          _LIVE: schema.REPLICATE, _CATCHUP: schema.REPLICATE, _BACKUP_DEQUEUE: schema.DEQUEUE}
_BACKUP_KINDS = (_LIVE, _CATCHUP, _BACKUP_DEQUEUE)
SLICE = 2000  # records formatted per event-loop pass (a few ms)
_now = time.time_ns
MARK_INTERVAL_NS = 1_000_000_000  # see schema.MARK

# A record: (kind, time.time_ns(), queue, seq, message bytes, epoch, extra). extra: the ready backups
# (complete), the primary's enqueue time in µs (live replicate) or the role (mark, which has no queue).
Record = tuple[int, int, Any, int, bytes, int, Any]


class AuditLog:
    """One per broker process, made by the plug-in that cli.py passes to `broker.server.run`."""

    def __init__(self, broker: "Broker", config: AuditConfig, ha: "HaBroker | None") -> None:
        self.ha = ha
        self.pending: list[Record] = []
        self._append = self.pending.append  # the list is emptied in place, never replaced
        self.backlog: list[Record] = []  # taken from pending, being written a slice per pass
        self.written = 0  # how much of the backlog is written
        self.watched: set[Queue] = set()
        self.engine = broker.engine
        self.writer = Writer(config.dir, broker.name, config.max_bytes, ha is not None)
        for queue in broker.registry.queues():
            self._watch(queue)
        broker.registry.queue_hooks.append(self._watch)
        broker.completion_hooks.append(self.completed)
        if ha is not None:
            ha.replication_hooks.append(self.replicated)
        self._mark()  # the run starts
        broker.engine.every(config.flush_interval, self.flush)
        atexit.register(self.close)
        log.info("audit events to %s", self.writer.directory)

    # -- which queues --------------------------------------------------------------------------
    def _watch(self, queue: Queue) -> None:
        """Queues whose messages are replicated (all but temporary ones on a broker without HA)."""
        replicated = self.ha.policy.replicates_messages(queue) if self.ha is not None else not queue.temporary
        if replicated:
            self.watched.add(queue)
            queue.observers.append(self)

    # -- the hot path: append and return -------------------------------------------------------
    # Each hook checks the role itself: a primary (or standalone) logs what clients do, a backup
    # only what replication does (its queue observers also see the replicated enqueues).
    def enqueued(self, queue: Queue, entry: Entry) -> None:
        ha = self.ha
        if ha is None:
            self._append((_ENQUEUE, _now(), queue, entry.seq, entry.data, 0, None))
        elif ha.primary is not None:
            self._append((_ENQUEUE, _now(), queue, entry.seq, entry.data, ha.epoch.epoch, None))

    def acquired(self, queue: Queue, entry: Entry) -> None:
        pass

    def dequeued(self, queue: Queue, entry: Entry) -> None:
        if queue.deleted:  # a deleted queue's purge is not a consume
            return
        ha = self.ha
        if ha is None:
            self._append((_DEQUEUE, _now(), queue, entry.seq, entry.data, 0, None))
        elif ha.primary is not None:
            self._append((_DEQUEUE, _now(), queue, entry.seq, entry.data, ha.epoch.epoch, None))

    def completed(self, queue: Queue, entry: Entry) -> None:
        if queue not in self.watched:
            return
        ha = self.ha
        if ha is None:
            self._append((_COMPLETE, _now(), queue, entry.seq, entry.data, 0, ()))
        elif ha.primary is not None:
            # The backups caught up with this queue now. A subscription leaves queue.observers
            # before it releases its holds, so a backup being dropped is not named.
            ready = tuple([o.backup.name for o in queue.observers if getattr(o, "caught_up", False)])
            self._append((_COMPLETE, _now(), queue, entry.seq, entry.data, ha.epoch.epoch, ready))

    def replicated(self, queue: Queue, kind: bytes, seq: int, enqueued_us: int, data: bytes) -> None:
        """The HA replication hook, on a backup."""
        assert self.ha is not None
        if kind == b"E":
            self._append((_LIVE, _now(), queue, seq, data, self.ha.epoch.epoch, enqueued_us))
        elif kind == b"C":
            self._append((_CATCHUP, _now(), queue, seq, data, self.ha.epoch.epoch, None))
        else:
            self._append((_BACKUP_DEQUEUE, _now(), queue, seq, data, self.ha.epoch.epoch, None))

    # -- off the hot path ----------------------------------------------------------------------
    def _mark(self) -> None:
        ha = self.ha
        role = schema.STANDALONE if ha is None else schema.PRIMARY if ha.primary is not None else schema.BACKUP
        now = _now()
        self._append((_MARK, now, None, 0, b"", ha.epoch.epoch if ha is not None else 0, role))
        self.last_mark = now

    def flush(self) -> None:
        """The engine's timer: start writing what was buffered."""
        if _now() - self.last_mark >= MARK_INTERVAL_NS:
            self._mark()
        if self.pending and not self.backlog:
            self.backlog = self.pending.copy()
            self.pending.clear()
            self._write_slice()
        self.watched = {q for q in self.watched if not q.deleted}

    def _write_slice(self) -> None:
        start = self.written
        self.writer.write(self.backlog[start:start + SLICE])
        self.written = start + SLICE
        if self.written < len(self.backlog):
            self.engine.call_later(0, self._write_slice)  # the rest after this pass's IO
        else:
            self.backlog, self.written = [], 0

    def close(self) -> None:
        """At exit: write everything left, and a mark (the log is complete up to now)."""
        self._mark()
        self.writer.write(self.backlog[self.written:] + self.pending)
        self.backlog, self.written = [], 0
        self.pending.clear()
        self.writer.close()


class Writer:
    """Formats records into JSON lines and appends them to size-rotated files.

    Files are `<dir>/<broker>-<part>.jsonl`; each process starts a new part, so a file never holds two runs.
    """

    def __init__(self, directory: str, broker: str, max_bytes: int, ha: bool) -> None:
        self.directory = os.path.abspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.broker_json = json.dumps(broker)
        self.prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", broker)  # a file name, whatever the broker's name
        self.max_bytes = max_bytes
        self.ha = ha
        self.run = int(time.time() * 1e6)
        self.n = 0
        self.part = self._last_part()
        self.file: Any = None
        self.size = 0
        self._templates: dict[tuple[int, Queue, int], str] = {}
        self._backups: dict[tuple[str, ...], str] = {}  # a complete's ready backups -> the end of its line
        # message bytes -> id as JSON, for this slice and the one before: a message's events are
        # usually close together, so its id is read once, not once per event
        self._ids: dict[bytes, str] = {}

    def _last_part(self) -> int:
        pattern = re.compile(re.escape(self.prefix) + r"-(\d+)\.jsonl$")
        parts = [int(m.group(1)) for m in map(pattern.match, os.listdir(self.directory)) if m]
        return max(parts, default=0)

    def write(self, records: list[Record]) -> None:
        if not records:
            return
        try:
            if self.file is None:
                self.part += 1
                self.file = open(os.path.join(self.directory, f"{self.prefix}-{self.part:06d}.jsonl"), "ab")
                self.size = 0
            data = self.format(records)
            self.file.write(data)  # whole lines only
            self.file.flush()
            self.size += len(data)
            if self.size >= self.max_bytes:
                self.close()
        except OSError as e:  # a full disk must not stop the broker; the gap shows in the audit
            log.error("audit: cannot write %d events to %s: %s", len(records), self.directory, e)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def format(self, records: list[Record]) -> bytes:
        lines: list[str] = []
        append = lines.append
        previous, ids = self._ids, {}
        templates, backups = self._templates, self._backups
        mark, complete, live = _MARK, _COMPLETE, _LIVE
        n = self.n
        for kind, t, queue, seq, data, epoch, extra in records:
            n += 1
            if kind == mark:
                append(f'{{"t":{t // 1000},"event":"mark","broker":{self.broker_json},"role":"{extra}",'
                       f'"epoch":{epoch},"run":{self.run},"n":{n}}}\n')
                continue
            mid = ids.get(data)
            if mid is None:
                mid = ids[data] = previous.get(data) or _json_id(message_id(data))
            line = (templates.get((kind, queue, epoch)) or self._template(kind, queue, epoch)) % (t // 1000, n, seq, mid)
            if kind == complete:
                line += backups.get(extra) or self._backups_tail(extra)
            elif kind == live:
                line += f',"mode":"live","enqueued":{extra}}}\n'
            append(line)
        self.n = n
        self._ids = ids
        return "".join(lines).encode()

    def _backups_tail(self, backups: tuple[str, ...]) -> str:
        tail = self._backups[backups] = f',"backups":{json.dumps(backups)}}}\n'
        return tail

    def _template(self, kind: int, queue: Queue, epoch: int) -> str:
        role = schema.STANDALONE if not self.ha else schema.BACKUP if kind in _BACKUP_KINDS else schema.PRIMARY
        head = (f'{{"t":%d,"event":"{_EVENT[kind]}","broker":{_escape(self.broker_json)},"role":"{role}",'
                f'"epoch":{epoch},"run":{self.run},"n":%d,"queue":{_json(queue.name)},"uid":{_json(queue.uid)},'
                f'"seq":%d,"message_id":%s')
        tail = {_COMPLETE: "", _LIVE: "", _CATCHUP: ',"mode":"catchup","enqueued":0}\n'}.get(kind, "}\n")
        template = head + tail
        self._templates[(kind, queue, epoch)] = template
        return template


def _escape(text: str) -> str:
    return text.replace("%", "%%")  # it goes into a %-template


def _json(text: str) -> str:
    return _escape(json.dumps(text))


def _json_id(value: Any) -> str:
    """A message id as a JSON string: text as is, numbers in decimal, UUIDs in their usual form, binary in hex."""
    if value is None:
        return "null"
    if isinstance(value, (bytes, bytearray)):
        value = value.hex()
    return encode_basestring(value if isinstance(value, str) else str(value))
