"""Turns buffered audit records into JSON lines (schema.py), one queue and kind at a time.

A queue's records of one kind, written under one context (role, epoch, the backups ready for the
queue), share their lines' text but for the time, line number, seq and message id (and, for a live
replica, the primary's enqueue time). `_lines` (C) reads the ids of messages of the usual layout
and writes the lines; Python reads any other id. In CPython alone a line cost about 0.6 µs and an
id 0.45 µs, at three lines per message a quarter of the broker's own work (bench/RESULTS.md).
"""
from __future__ import annotations

import json
import time
from enum import Enum
from itertools import repeat
from json.encoder import encode_basestring  # the C encoder: a JSON string in a fraction of json.dumps' time
from typing import Any

from . import _lines, schema
from .message_id import message_id

ID_CACHE = 65536  # message ids a queue keeps between its first and last event, at most


class Kind(Enum):
    """What a record is: (the QueueEvents list it waits in, its items, its event, whether it is the
    message's first or last event on this broker: its id is read from its bytes on the first and
    forgotten after the last)."""

    ENQUEUE = ("enqueues", 3, schema.ENQUEUE, True, False)
    COMPLETE = ("completes", 3, schema.COMPLETE, False, False)
    DEQUEUE = ("dequeues", 3, schema.DEQUEUE, False, True)
    LIVE = ("live", 4, schema.REPLICATE, True, False)  # records carry the primary's enqueue time
    CATCHUP = ("catchup", 3, schema.REPLICATE, True, False)
    MIRRORED = ("mirrored", 3, schema.DEQUEUE, False, True)  # a backup applied the primary's dequeue

    def __init__(self, records: str, stride: int, event: str, first: bool, last: bool) -> None:
        self.records, self.stride, self.event, self.first, self.last = records, stride, event, first, last


PRIMARY_KINDS = (Kind.ENQUEUE, Kind.COMPLETE, Kind.DEQUEUE)  # in the order their lines are written
BACKUP_KINDS = (Kind.LIVE, Kind.CATCHUP, Kind.MIRRORED)

# Records wait in flat lists, `kind.stride` items each: time.time_ns(), seq, the message's bytes, and
# for Kind.LIVE the primary's enqueue time in µs. Flat lists of ints and bytes give the garbage
# collector nothing to track: a list of tuples made it walk every buffered record, again and again.
Records = list[Any]


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

    def format(self, kind: Kind, parts: tuple[bytes, ...], records: Records, ids: dict[int, bytes]) -> bytes:
        """The lines of `records` (flat, kind.stride items each); `ids` is their queue's seq -> id cache."""
        stride = kind.stride
        seqs = records[1::stride]
        if kind.first:
            texts = message_ids(records, stride)
            if len(ids) > ID_CACHE:
                ids.clear()
            ids.update(zip(seqs, texts))
        else:  # read on the message's first event, unless that was long ago (or on another broker)
            texts = list(map(ids.pop if kind.last else ids.get, seqs, repeat(None)))
            if None in texts:
                missed = [i for i, text in enumerate(texts) if text is None]
                found = message_ids([item for i in missed for item in records[i * stride:(i + 1) * stride]], stride)
                for i, text in zip(missed, found):
                    texts[i] = text
        n = self.n
        self.n = n + len(seqs)
        return _lines.format(parts, records, texts, n)


def message_ids(records: Records, stride: int) -> list[bytes]:
    """Each record's message-id as JSON text (schema.py): the usual layout read in C, any other here."""
    texts = _lines.message_ids(records, stride)
    if None in texts:
        datas = records[2::stride]
        texts = [text or json_id(message_id(data)).encode() for text, data in zip(texts, datas)]
    return texts


def json_id(value: Any) -> str:
    """A message id as a JSON string: text as is, numbers in decimal, UUIDs in their usual form, binary in hex."""
    if value is None:
        return "null"
    if isinstance(value, (bytes, bytearray)):
        value = value.hex()
    return encode_basestring(value if isinstance(value, str) else str(value))
