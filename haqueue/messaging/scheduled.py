"""Scheduled delivery: a message annotated `x-opt-delivery-time` (ms since the epoch) or `x-opt-delivery-delay`
(ms from its arrival), as Artemis and Azure Service Bus read them, is held back (Queue.defer) until then.

A publisher's delay is made a time on arrival, in the message's own annotations, before the store or a backup
sees it: a backup, a restarted broker and a promoted one all read the same due time from the bytes. Deferred
messages wait in one heap of due times per broker (the messages due at one time in a list behind it), woken by
one engine timer at the earliest: no timer per message; many due at once are released a batch a pass.
A malformed value (not a whole number) leaves the message undeferred, as Artemis does.
"""
from __future__ import annotations

import heapq
import math
import time
from collections import deque

from ..broker.message import message_annotations
from ..broker.queue import Entry, Queue
from ..broker.server import Broker
from .annotations import with_annotations

DELIVERY_TIME = "x-opt-delivery-time"
DELIVERY_DELAY = "x-opt-delivery-delay"
RELEASE_BATCH = 2000  # due messages made available in one pass: the loop dispatches between batches


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Scheduler:
    """Every queue's annotated_hook: defers what is due later, and makes it available when due."""

    def __init__(self, broker: Broker) -> None:
        self.engine = broker.engine
        self.times: list[int] = []  # a heap of the due times (ms since the epoch) that messages wait for
        self.waiting: dict[int, deque[tuple[Queue, Entry]]] = {}  # due time -> its messages, in arrival order
        self.armed = math.inf  # the due time the timer that wakes next was armed for
        self.generation = 0  # the timer armed last: only it arms the next

    def __call__(self, queue: Queue, entry: Entry, published: bool) -> None:
        annotations = message_annotations(entry.data)
        when = _whole(annotations.get(DELIVERY_TIME))
        delay = _whole(annotations.get(DELIVERY_DELAY))
        if when is None and delay is not None and delay > 0 and published:
            when = int(time.time() * 1000) + delay
            entry.data = with_annotations(entry.data, {DELIVERY_TIME: when})
        if when is None or when <= time.time() * 1000:
            return
        queue.defer(entry)
        waiting = self.waiting.get(when)
        if waiting is None:
            waiting = self.waiting[when] = deque()
            heapq.heappush(self.times, when)
        waiting.append((queue, entry))
        if when < self.armed:
            self._arm(when)

    def _arm(self, when: float) -> None:
        self.armed = when
        self.generation += 1
        generation = self.generation
        self.engine.call_later(max(when / 1000.0 - time.time(), 0.0), lambda: self._wake(generation))

    def _wake(self, generation: int) -> None:
        """Make up to RELEASE_BATCH due messages available; the timer armed last arms the next (at once, if
        more are due)."""
        times, now = self.times, time.time() * 1000
        budget = RELEASE_BATCH
        while times and times[0] <= now and budget:
            waiting = self.waiting[times[0]]
            while waiting and budget:
                queue, entry = waiting.popleft()
                budget -= 1
                if not queue.deleted:
                    queue.undefer(entry)
            if not waiting:
                del self.waiting[heapq.heappop(times)]
        if generation == self.generation:
            self.armed = math.inf
            if times:
                self._arm(times[0])


def install(broker: Broker) -> None:
    scheduler = Scheduler(broker)

    def attach(queue: Queue) -> None:
        queue.annotated_hook = scheduler
    broker.registry.queue_hooks.append(attach)
