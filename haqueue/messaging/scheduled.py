"""Scheduled delivery: a message annotated `x-opt-delivery-time` (ms since the epoch) or `x-opt-delivery-delay`
(ms from its arrival), as Artemis and Azure Service Bus read them, is held back (Queue.defer) until then.

A publisher's delay is made a time on arrival, in the message's own annotations, before the store or a backup
sees it: a backup, a restarted broker and a promoted one all read the same due time from the bytes. Deferred
messages wait in one heap per broker, woken by one engine timer at the earliest due time: no timer per message.
A malformed value (not a whole number) leaves the message undeferred, as Artemis does.
"""
from __future__ import annotations

import heapq
import itertools
import math
import time

from ..broker.message import message_annotations
from ..broker.queue import Entry, Queue
from ..broker.server import Broker
from .annotations import with_annotations

DELIVERY_TIME = "x-opt-delivery-time"
DELIVERY_DELAY = "x-opt-delivery-delay"


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Scheduler:
    """Every queue's annotated_hook: defers what is due later, and makes it available when due."""

    def __init__(self, broker: Broker) -> None:
        self.engine = broker.engine
        self.heap: list[tuple[float, int, Queue, Entry]] = []  # (monotonic due time, push, queue, entry)
        self.pushes = itertools.count()
        self.armed = math.inf  # when the timer that wakes next fires
        self.generation = 0  # the timer armed last: only it arms the next

    def __call__(self, queue: Queue, entry: Entry, published: bool) -> None:
        annotations = message_annotations(entry.data)
        when = _whole(annotations.get(DELIVERY_TIME))
        delay = _whole(annotations.get(DELIVERY_DELAY))
        if when is None and delay is not None and delay > 0 and published:
            when = int(time.time() * 1000) + delay
            entry.data = with_annotations(entry.data, {DELIVERY_TIME: when})
        if when is None:
            return
        wait = when / 1000.0 - time.time()
        if wait <= 0:
            return
        queue.defer(entry)
        due = time.monotonic() + wait
        heapq.heappush(self.heap, (due, next(self.pushes), queue, entry))
        if due < self.armed:
            self._arm(due)

    def _arm(self, due: float) -> None:
        self.armed = due
        self.generation += 1
        generation = self.generation
        self.engine.call_later(max(due - time.monotonic(), 0.0), lambda: self._wake(generation))

    def _wake(self, generation: int) -> None:
        heap = self.heap
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            _, _, queue, entry = heapq.heappop(heap)
            if not queue.deleted:
                queue.undefer(entry)
        if generation == self.generation:
            self.armed = math.inf
            if heap:
                self._arm(heap[0][0])


def install(broker: Broker) -> None:
    scheduler = Scheduler(broker)

    def attach(queue: Queue) -> None:
        queue.annotated_hook = scheduler
    broker.registry.queue_hooks.append(attach)
