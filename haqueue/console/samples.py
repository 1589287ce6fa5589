"""What the console's tables and charts show of the queues: a copy of every queue's figures, taken on the
broker's loop at most once a second and only while a page asks, and the message rates worked out from two
copies.

Nothing is counted per message for the console: a rate is the change of the queues' own `enqueued` and
`dequeued` totals (design/metrics.md) between two copies, over the time between them. The broker's rates in
and out are kept in a small ring buffer, a point per copy; while no page is open nothing is copied, and the
first point after a gap is the mean rate over the gap. A queue's own rates are kept the same way while its page
is open.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any, NamedTuple

from ..loop_calls import on_loop
from ..shard.forwarding_queues import FORWARD

if TYPE_CHECKING:
    from ..broker.server import Broker

SAMPLE_EVERY = 1.0  # seconds: copies are at least this far apart, however many pages ask
POINTS = 600  # rate points kept (10 minutes at one a second)
WATCHED = 20  # queues whose rates are kept for their page at once (the least recently asked for goes)
TIMEOUT = 5.0


class QueueRow(NamedTuple):
    name: str
    depth: int
    bytes: int
    consumers: int
    enqueued: int
    dequeued: int
    args: dict[str, Any]  # the queue's, not a copy: arguments are set at declare and never change


class Copy(NamedTuple):
    taken: float  # time.time()
    # temporary queues left out, and a shard's forwarding queues: another shard's queues' messages in transit
    rows: dict[str, QueueRow]
    connections: int
    left_out: dict[str, int]  # how many of each: {"temporary": N, "forwarding": N}


class Rate(NamedTuple):
    at: float
    rate_in: float
    rate_out: float


def _copy(broker: "Broker") -> Copy:
    """On the loop: every queue's figures (0.3 µs a queue, as the metrics' copy), and how many were left out (the
    broker's own count of queues, `READ broker`, has them)."""
    rows: dict[str, QueueRow] = {}
    left_out = {"temporary": 0, "forwarding": 0}
    for q in broker.registry.queues():
        if q.temporary:
            left_out["temporary"] += 1
        elif FORWARD in q.args:
            left_out["forwarding"] += 1
        else:
            rows[q.name] = QueueRow(q.name, q.depth, q.bytes, len(q.consumers) + len(q.browsers), q.enqueued,
                                    q.dequeued, q.args)
    return Copy(time.time(), rows, len(broker.connections), left_out)


def _rate(before: tuple[int, int], after: tuple[int, int], seconds: float) -> Rate | None:
    """Rates in and out between two (enqueued, dequeued) totals; None if one went back (a queue deleted)."""
    if seconds <= 0 or after[0] < before[0] or after[1] < before[1]:
        return None
    return Rate(0.0, (after[0] - before[0]) / seconds, (after[1] - before[1]) / seconds)


def _totals(rows: dict[str, QueueRow]) -> tuple[int, int]:
    return sum(r.enqueued for r in rows.values()), sum(r.dequeued for r in rows.values())


class Samples:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        self._lock = threading.Lock()
        self.latest: Copy | None = None
        self.previous: Copy | None = None
        self.broker_rates: deque[Rate] = deque(maxlen=POINTS)
        self.queue_rates: OrderedDict[str, deque[Rate]] = OrderedDict()

    def current(self) -> tuple[Copy, Copy | None]:
        """The latest copy (a new one if it is older than SAMPLE_EVERY) and the one before it."""
        with self._lock:
            if self.latest is None or time.time() - self.latest.taken >= SAMPLE_EVERY:
                copy = on_loop(self.broker.engine.call_soon_threadsafe, lambda: _copy(self.broker), TIMEOUT)
                self.previous, self.latest = self.latest, copy
                self._record()
            assert self.latest is not None
            return self.latest, self.previous

    def watch(self, queue: str) -> list[Rate]:
        """The rates of a queue whose page is open (kept from now on, for the WATCHED most recent)."""
        self.current()
        with self._lock:
            points = self.queue_rates.setdefault(queue, deque(maxlen=POINTS))
            self.queue_rates.move_to_end(queue)
            while len(self.queue_rates) > WATCHED:
                self.queue_rates.popitem(last=False)
            return list(points)

    def queue_rate(self, name: str) -> Rate | None:
        """A queue's rates between the last two copies."""
        latest, previous = self.latest, self.previous
        if latest is None or previous is None or name not in latest.rows or name not in previous.rows:
            return None
        now, before = latest.rows[name], previous.rows[name]
        return _rate((before.enqueued, before.dequeued), (now.enqueued, now.dequeued), latest.taken - previous.taken)

    def _record(self) -> None:
        latest, previous = self.latest, self.previous
        if latest is None or previous is None:
            return
        seconds = latest.taken - previous.taken
        common = latest.rows.keys() & previous.rows.keys()  # a queue declared or deleted meanwhile moves no rate
        rate = _rate(_totals({n: previous.rows[n] for n in common}), _totals({n: latest.rows[n] for n in common}),
                     seconds)
        if rate is not None:
            self.broker_rates.append(rate._replace(at=latest.taken))
        for name, points in self.queue_rates.items():
            queue_rate = self.queue_rate(name)
            if queue_rate is not None:
                points.append(queue_rate._replace(at=latest.taken))
