"""Last-value queues: `x-last-value-key: PROP` (Qpid's qpid.last_value_queue_key, Artemis's last-value key).
A message published with application property PROP replaces the queued message with the same value of PROP:
the older one is dequeued as the newer is enqueued, so a consumer or a browser sees only the latest value of
each key. A message a consumer has acquired is not replaced (it may still be settled or released: both stay).
Messages without PROP are queued as on any queue.

Only the broker a message is published to replaces: a backup applies its primary's dequeues, so the two never
disagree about what was replaced, and a promoted backup goes on from the same latest values (its index is
kept from every message it holds, replicated or recovered).
"""
from __future__ import annotations

from typing import Any

from ..broker.message import application_property
from ..broker.queue import ACQUIRED, DEQUEUED, Entry, Queue, Subscriber

LAST_VALUE_KEY = "x-last-value-key"


def validate(value: Any) -> str | None:
    if isinstance(value, str) and value:
        return None
    return f"argument '{LAST_VALUE_KEY}' must be the name of an application property, got {value!r}"


class LastValue:
    """A queue's arranger under x-last-value-key: the latest entry of each value of the key."""

    picks = False

    def __init__(self, queue: Queue, key: str) -> None:
        self.queue = queue
        self.key = key
        self.latest: dict[Any, Entry] = {}
        self.value_of: dict[int, Any] = {}  # seq -> its value, for each entry in latest

    def entered(self, entries: list[Entry], published: bool) -> None:
        for entry in entries:
            value = application_property(entry.data, self.key)
            if value is None or isinstance(value, (dict, list)):
                continue
            older = self.latest.get(value)
            self.latest[value] = entry
            self.value_of[entry.seq] = value
            if older is not None:
                del self.value_of[older.seq]
                if published and older.state not in (ACQUIRED, DEQUEUED):
                    self.queue.dequeue(older)

    def left(self, entry: Entry) -> None:
        value = self.value_of.pop(entry.seq, None)
        if value is not None:
            del self.latest[value]

    def returned(self, entry: Entry) -> None:
        pass  # the queue's own order stands (picks is False)

    def next(self, consumer: Subscriber, now: float) -> Entry | None:
        return None  # never asked (picks is False)

    def rebuild(self, entries: list[Entry]) -> None:
        self.latest = {}
        self.value_of = {}
        self.entered(entries, False)
