"""Turns buffered audit records into JSON lines (schema.py), one queue and kind at a time.

A queue's records of one kind, written under one context (role, epoch, the backups ready for the
queue), share their lines' text but for the time, line number, seq and message id (and, for a live
replica, the primary's enqueue time). `_lines.write` (C) writes the lines at the end of a loop pass
with the GIL released, reading each message's id from its bytes when it has the usual encoding;
`read_id` reads any other.
"""
from __future__ import annotations

import json
import time
from enum import Enum
from json.encoder import encode_basestring  # the C encoder: a JSON string in a fraction of json.dumps' time
from typing import Any

from . import _lines, schema
from ._lines import Batch
from .message_id import message_id


class Kind(Enum):
    """What a record is: (its number in `_lines.Recorder`, its event)."""

    ENQUEUE = (_lines.ENQUEUE, schema.ENQUEUE)
    COMPLETE = (_lines.COMPLETE, schema.COMPLETE)
    DEQUEUE = (_lines.DEQUEUE, schema.DEQUEUE)
    LIVE = (_lines.LIVE, schema.REPLICATE)  # records carry the primary's enqueue time
    CATCHUP = (_lines.CATCHUP, schema.REPLICATE)
    MIRRORED = (_lines.MIRRORED, schema.DEQUEUE)  # a backup applied the primary's dequeue
    DIVERGED = (_lines.DIVERGED, schema.DIVERGED)  # a backup kept aside what the new primary never had
    KEPT_LOCAL = (_lines.KEPT_LOCAL, schema.COMPLETE)  # a confirmation of a message kept off the backups

    def __init__(self, index: int, event: str) -> None:
        self.index, self.event = index, event


PRIMARY_KINDS = (Kind.ENQUEUE, Kind.COMPLETE, Kind.KEPT_LOCAL, Kind.DEQUEUE)  # in the order their lines are written
BACKUP_KINDS = (Kind.LIVE, Kind.CATCHUP, Kind.MIRRORED, Kind.DIVERGED)

# What `_lines.write` writes: lines already formatted, or (parts, a batch of records, the number of
# the line before).
Group = tuple[tuple[bytes, ...], Batch, int]


class LineFormatter:
    """The lines of one broker process (a run): numbers them and keeps the text their batches share."""

    def __init__(self, broker: str, shard: int | None = None, cluster_size: int = 1) -> None:
        """`shard`: the process's shard in a sharded cluster, written in every line (none: no field);
        `cluster_size`: the brokers of its HA cluster, written in every mark (not per message: it never changes)."""
        self.broker_json = json.dumps(broker)
        self.shard_json = "" if shard is None else f',"shard":{shard}'
        self.cluster_size = cluster_size
        self.run = int(time.time() * 1e6)
        self.n = 0  # the last line's number
        self._parts: dict[tuple[Any, ...], tuple[bytes, ...]] = {}

    def parts(self, kind: Kind, role: str, epoch: int, name: str, uid: str,
              backups: tuple[str, ...] = ()) -> tuple[bytes, ...]:
        key = (kind, role, epoch, name, uid, backups)
        parts = self._parts.get(key)
        if parts is None:
            if len(self._parts) > 10_000:  # queues come and go: forget old ones now and then
                self._parts.clear()
            tail = {Kind.COMPLETE: (f',"backups":{json.dumps(backups)}}}\n',),
                    Kind.KEPT_LOCAL: (',"backups":[],"replicated":false}\n',),
                    Kind.LIVE: (',"mode":"live","enqueued":', "}\n"),
                    Kind.CATCHUP: (',"mode":"catchup","enqueued":0}\n',)}.get(kind, ("}\n",))
            head = ('{"t":', f',"event":"{kind.event}","broker":{self.broker_json},"role":"{role}","epoch":{epoch}'
                    f'{self.shard_json},"run":{self.run},"n":',
                    f',"queue":{json.dumps(name)},"uid":{json.dumps(uid)},"seq":', ',"message_id":')
            parts = self._parts[key] = tuple(part.encode() for part in head + tail)
        return parts

    def mark(self, t: int, role: str, epoch: int) -> bytes:
        """A mark line at time.time_ns() t."""
        self.n += 1
        return (f'{{"t":{t // 1000},"event":"mark","broker":{self.broker_json},'
                f'"role":"{role}","epoch":{epoch}{self.shard_json},"run":{self.run},"n":{self.n},'
                f'"cluster_size":{self.cluster_size}}}\n').encode()

    def group(self, parts: tuple[bytes, ...], batch: Batch) -> Group:
        """`batch` numbered as the next lines, for `_lines.write`."""
        n = self.n
        self.n = n + len(batch)
        return parts, batch, n


def read_id(data: bytes) -> bytes:
    """A message-id as JSON text, for the messages `_lines` leaves to Python (ids of other types,
    encodings it does not read): text as is, numbers in decimal, UUIDs in their usual form, binary
    in hex; null when there is none or the bytes cannot be read."""
    value = message_id(data)
    if value is None:
        return b"null"
    if isinstance(value, (bytes, bytearray)):
        value = value.hex()
    return encode_basestring(value if isinstance(value, str) else str(value)).encode()
