"""The audit log: a broker plug-in that writes replication events as JSON lines (schema.py).

The hot path only appends a small tuple to a list (the message's bytes by reference, the time,
the seq). Every `flush_interval` the engine's timer hands the list to a writer thread, which reads
message ids, formats whole lines and appends them to the current file with one write. A crash
loses at most the batches not yet written; it cannot tear an earlier line, and a new process
starts a new file, so a torn last line is never followed by more data.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import queue as queues
import re
import threading
import time
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
_STOP = None  # tells the writer thread to finish
MARK_INTERVAL = 1.0  # seconds; see schema.MARK

# A record: (kind, time.time(), queue, seq, message bytes, epoch, extra). extra: the ready backups
# (complete), the primary's enqueue time in µs (live replicate) or the role (mark, which has no queue).
Record = tuple[int, float, Any, int, bytes, int, Any]


class AuditLog:
    """One per broker process, made by the plug-in that cli.py passes to `broker.server.run`."""

    def __init__(self, broker: "Broker", config: AuditConfig, ha: "HaBroker | None") -> None:
        self.ha = ha
        self.pending: list[Record] = []
        self._append = self.pending.append  # the list is emptied in place, never replaced
        self.watched: set[Queue] = set()
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
    def _primary_epoch(self) -> int | None:
        """The epoch while this broker serves clients (standalone: 0); None on a backup."""
        ha = self.ha
        if ha is None:
            return 0
        return ha.epoch.epoch if ha.primary is not None else None

    def enqueued(self, queue: Queue, entry: Entry) -> None:
        epoch = self._primary_epoch()
        if epoch is not None:
            self._append((_ENQUEUE, time.time(), queue, entry.seq, entry.data, epoch, None))

    def acquired(self, queue: Queue, entry: Entry) -> None:
        pass

    def dequeued(self, queue: Queue, entry: Entry) -> None:
        epoch = self._primary_epoch()
        if epoch is not None and not queue.deleted:  # a deleted queue's purge is not a consume
            self._append((_DEQUEUE, time.time(), queue, entry.seq, entry.data, epoch, None))

    def completed(self, queue: Queue, entry: Entry) -> None:
        if queue in self.watched:
            epoch = self._primary_epoch()
            if epoch is not None:
                self._append((_COMPLETE, time.time(), queue, entry.seq, entry.data, epoch, self._ready(queue)))

    @staticmethod
    def _ready(queue: Queue) -> tuple[str, ...]:
        """The backups whose replication of this queue is caught up right now. A subscription
        leaves queue.observers before it releases its holds, so a dropped backup is not named."""
        return tuple([o.backup.name for o in queue.observers if getattr(o, "caught_up", False)])

    def replicated(self, queue: Queue, kind: bytes, seq: int, enqueued_us: int, data: bytes) -> None:
        """The HA replication hook, on a backup."""
        assert self.ha is not None
        if kind == b"E":
            self._append((_LIVE, time.time(), queue, seq, data, self.ha.epoch.epoch, enqueued_us))
        elif kind == b"C":
            self._append((_CATCHUP, time.time(), queue, seq, data, self.ha.epoch.epoch, None))
        else:
            self._append((_BACKUP_DEQUEUE, time.time(), queue, seq, data, self.ha.epoch.epoch, None))

    # -- off the hot path ----------------------------------------------------------------------
    def _mark(self) -> None:
        ha = self.ha
        role = schema.STANDALONE if ha is None else schema.PRIMARY if ha.primary is not None else schema.BACKUP
        now = time.time()
        self._append((_MARK, now, None, 0, b"", ha.epoch.epoch if ha is not None else 0, role))
        self.last_mark = now

    def flush(self) -> None:
        """The engine's timer: hand what was buffered to the writer thread."""
        if time.time() - self.last_mark >= MARK_INTERVAL:
            self._mark()
        if self.pending:
            self.writer.put(self.pending.copy())
            self.pending.clear()
        self.watched = {q for q in self.watched if not q.deleted}

    def close(self) -> None:
        """At exit: write what is left, and a mark (the log is complete up to now), and wait for the writer."""
        self._mark()
        self.flush()
        self.writer.close()


class Writer:
    """Formats batches of records into JSON lines and appends them to size-rotated files, in its own thread.

    Files are `<dir>/<broker>-<part>.jsonl`; each process starts a new part, so one file holds one run.
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
        self._queue: queues.SimpleQueue[list[Record] | None] = queues.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="audit-writer", daemon=True)
        self._thread.start()

    def put(self, batch: list[Record]) -> None:
        self._queue.put(batch)

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout=30)

    def _last_part(self) -> int:
        pattern = re.compile(re.escape(self.prefix) + r"-(\d+)\.jsonl$")
        parts = [int(m.group(1)) for m in map(pattern.match, os.listdir(self.directory)) if m]
        return max(parts, default=0)

    def _loop(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is _STOP:
                break
            try:
                self._write(self.format(batch))
            except OSError as e:  # a full disk must not stop the broker; the gap shows in the audit
                log.error("audit: cannot write %d events to %s: %s", len(batch), self.directory, e)
        if self.file is not None:
            self.file.close()

    def _write(self, data: bytes) -> None:
        if self.file is None:
            self.part += 1
            self.file = open(os.path.join(self.directory, f"{self.prefix}-{self.part:06d}.jsonl"), "ab")
            self.size = 0
        self.file.write(data)  # whole lines only
        self.file.flush()
        self.size += len(data)
        if self.size >= self.max_bytes:
            self.file.close()
            self.file = None

    def format(self, batch: list[Record]) -> bytes:
        lines = []
        ids: dict[tuple[str, int], str] = {}  # (uid, seq) -> message id JSON: one parse per message per batch
        n = self.n
        for kind, t, queue, seq, data, epoch, extra in batch:
            n += 1
            if kind == _MARK:
                lines.append(f'{{"t":{int(t * 1e6)},"event":"mark","broker":{self.broker_json},"role":"{extra}",'
                             f'"epoch":{epoch},"run":{self.run},"n":{n}}}\n')
                continue
            key = (queue.uid, seq)
            mid = ids.get(key)
            if mid is None:
                mid = ids[key] = _json_id(message_id(data))
            template = self._templates.get((kind, queue, epoch)) or self._template(kind, queue, epoch)
            line = template % (t * 1e6, n, seq, mid)
            if kind == _COMPLETE:
                line += f',"backups":{json.dumps(extra)}}}\n'
            elif kind == _LIVE:
                line += f',"mode":"live","enqueued":{extra}}}\n'
            lines.append(line)
        self.n = n
        return "".join(lines).encode()

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
    return json.dumps(value if isinstance(value, str) else str(value))
