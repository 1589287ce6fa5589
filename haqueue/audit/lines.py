"""Turns buffered audit records into JSON lines (schema.py), one queue and kind at a time.

A queue's records of one kind, written under one context (role, epoch, the backups ready for the
queue), share their lines' text but for the time, line number, seq and message id (and, for a live
replica, the primary's enqueue time). `_lines` (C) writes the lines, reading each message's id
from its bytes when it has the usual encoding; `read_id` reads any other. In CPython alone a line
cost about 0.6 µs and an id 0.45 µs, at three lines per message a quarter of the broker's own work
(bench/RESULTS.md); `_lines` does it on the writer thread with the GIL released.
"""
from __future__ import annotations

import json
import time
from enum import Enum
from json.encoder import encode_basestring  # the C encoder: a JSON string in a fraction of json.dumps' time
from typing import Any

from . import schema
from .message_id import message_id


class Kind(Enum):
    """What a record is: (the QueueEvents list it waits in, its items, its event)."""

    ENQUEUE = ("enqueues", 3, schema.ENQUEUE)
    COMPLETE = ("completes", 3, schema.COMPLETE)
    DEQUEUE = ("dequeues", 3, schema.DEQUEUE)
    LIVE = ("live", 4, schema.REPLICATE)  # records carry the primary's enqueue time
    CATCHUP = ("catchup", 3, schema.REPLICATE)
    MIRRORED = ("mirrored", 3, schema.DEQUEUE)  # a backup applied the primary's dequeue

    def __init__(self, records: str, stride: int, event: str) -> None:
        self.records, self.stride, self.event = records, stride, event


PRIMARY_KINDS = (Kind.ENQUEUE, Kind.COMPLETE, Kind.DEQUEUE)  # in the order their lines are written
BACKUP_KINDS = (Kind.LIVE, Kind.CATCHUP, Kind.MIRRORED)

# Records wait in flat lists, `kind.stride` items each: time.time_ns(), seq, the message's bytes, and
# for Kind.LIVE the primary's enqueue time in µs. Flat lists of ints and bytes give the garbage
# collector nothing to track: a list of tuples made it walk every buffered record, again and again.
Records = list[Any]
# What `_lines.write` writes: lines already formatted, or (parts, records, number of the line before).
Group = tuple[tuple[bytes, ...], Records, int]


class LineFormatter:
    """The lines of one broker process (a run): numbers them and keeps the text their batches share."""

    def __init__(self, broker: str) -> None:
        self.broker_json = json.dumps(broker)
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
                    Kind.LIVE: (',"mode":"live","enqueued":', "}\n"),
                    Kind.CATCHUP: (',"mode":"catchup","enqueued":0}\n',)}.get(kind, ("}\n",))
            head = ('{"t":', f',"event":"{kind.event}","broker":{self.broker_json},"role":"{role}","epoch":{epoch},'
                    f'"run":{self.run},"n":', f',"queue":{json.dumps(name)},"uid":{json.dumps(uid)},"seq":',
                    ',"message_id":')
            parts = self._parts[key] = tuple(part.encode() for part in head + tail)
        return parts

    def mark(self, t: int, role: str, epoch: int) -> bytes:
        """A mark line at time.time_ns() t."""
        self.n += 1
        return (f'{{"t":{t // 1000},"event":"mark","broker":{self.broker_json},'
                f'"role":"{role}","epoch":{epoch},"run":{self.run},"n":{self.n}}}\n').encode()

    def group(self, kind: Kind, parts: tuple[bytes, ...], records: Records) -> Group:
        """`records` (flat, kind.stride items each) numbered as the next lines, for `_lines.write`."""
        n = self.n
        self.n = n + len(records) // kind.stride
        return parts, records, n


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
