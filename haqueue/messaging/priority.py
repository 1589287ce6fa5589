"""Priority queues: `x-priorities: N` (1-10, as Qpid's qpid.priorities and RabbitMQ's x-max-priority). A consumer
gets the message of the highest priority level first, first in first out within a level; a released message
goes back to its place in its level. The header's priority (0-9, default 4) maps onto N levels as AMQP 0-10
says and Qpid does: with fewer than 10 levels, the lowest priorities share level 0 and the highest the top one.

Browsers see the queue in arrival order. A priority queue is held in memory (never paged).
"""
from __future__ import annotations

import heapq
import math
from typing import Any

from ..broker.message import priority
from ..broker.queue import Entry, Queue, Returned, Subscriber
from .heaps import Heaps

PRIORITIES = "x-priorities"


def level(value: int, levels: int) -> int:
    """The level (0: lowest) of a header priority among `levels` levels."""
    first = 5 - min(5, math.ceil(levels / 2))
    return 0 if value <= first else min(value - first, levels - 1)


def validate(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10:
        return f"argument '{PRIORITIES}' must be a whole number from 1 to 10, got {value!r}"
    return None


class Priorities:
    """A queue's arranger under x-priorities: a heap of available entries per level."""

    picks = True

    def __init__(self, queue: Queue, levels: int) -> None:
        self.queue = queue
        self.levels = levels
        self.level_of = [level(p, levels) for p in range(10)]  # header priority -> level
        self.heaps: list[list[Returned]] = [[] for _ in range(levels)]
        self.top = -1  # no heap above it holds anything: next() starts there
        self.kept = Heaps()

    def _push(self, entry: Entry) -> None:
        at = self.level_of[min(priority(entry.data), 9)]
        self.kept.push(self.heaps[at], entry)
        if at > self.top:
            self.top = at

    def entered(self, entries: list[Entry], published: bool) -> None:
        for entry in entries:
            self._push(entry)

    def left(self, entry: Entry) -> None:
        if self.kept.left():
            for heap in self.heaps:
                self.kept.pruned(heap)
            self.kept.recount(self.heaps)

    def returned(self, entry: Entry) -> None:
        self._push(entry)

    def next(self, consumer: Subscriber, now: float) -> Entry | None:
        first_available = self.queue.first_available
        heaps = self.heaps
        at = self.top
        while at >= 0:
            heap = heaps[at]
            entry = first_available(heap, now)
            if entry is not None:
                heapq.heappop(heap)
                self.kept.popped()
                self.top = at
                return entry
            at -= 1
        self.top = -1
        return None

    def rebuild(self, entries: list[Entry]) -> None:
        self.heaps = [[] for _ in range(self.levels)]
        self.top = -1
        self.kept = Heaps()
        self.entered(entries, False)
