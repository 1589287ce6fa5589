"""QueueMirror: one source queue's mirror, on the source's primary (design/mirroring.md).

It reads what the queue publishes and nothing else: it is a browser of the queue (it sees every message in seq
order, acquiring none, so consumers here are untouched) and an observer (told of each enqueue and dequeue). A
publisher's confirmation never waits for it. Its link to the standby carries, in the queue's order, each message
(`E`, with the source seq in the tag and in a message annotation) and the seqs dequeued here (`D`, batched once a
pass). The standby settles each `E` once its own guards have it: that is the message mirrored.

On each attach the standby says which seqs it holds (the connection's `$mirror.state`). The mirror then sends `D`
for those no longer here, and browses the queue from its start, sending only what the standby lacks: nothing is
skipped, whichever primary of the source cluster does it. A message goes twice only when the standby applied it
after saying what it held (a link attached again on the same connection): the standby settles that copy without
applying it again.
"""
from __future__ import annotations

import bisect
import logging
import time
from collections import OrderedDict, deque
from typing import Any, Protocol

from ..broker.connection import Connection
from ..broker.flow import LOW_WATER
from ..broker.proton_adapter import ACCEPTED, Link, LinkHandler
from ..broker.queue import DEFERRED, DEQUEUED, Entry, Queue, Returned, seq_ranges
from ..broker.selector import Selector
from ..ha.protocol import encode_ranges, message_tag
from . import protocol
from .annotation import with_seq
from .standby_link import StandbyLink, runs

log = logging.getLogger("haqueue.mirror")

CONNECTING, MIRRORING, REFUSED = "connecting", "mirroring", "refused"


class MirrorHost(Protocol):
    """What a QueueMirror needs of the source (source.py)."""

    standby: StandbyLink
    max_backlog_bytes: int

    def schedule(self, item: Any) -> None: ...  # the broker's: dispatch at the end of the pass
    def stopped(self, mirror: "QueueMirror") -> None: ...


class Holdings:
    """The seqs the standby holds of a queue, as sorted runs."""

    def __init__(self, runs: list[tuple[int, int]]) -> None:
        self.runs = sorted(runs)
        self.firsts = [first for first, _ in self.runs]

    def __contains__(self, seq: int) -> bool:
        i = bisect.bisect_right(self.firsts, seq) - 1
        return i >= 0 and seq <= self.runs[i][1]

    def seqs(self) -> list[int]:
        return [seq for first, last in self.runs for seq in range(first, last + 1)]


class QueueMirror(LinkHandler):
    browse = True  # a Subscriber that reads without acquiring
    selector: Selector | None = None

    def __init__(self, host: MirrorHost, queue: Queue) -> None:
        self.host = host
        self.queue = queue
        self.name = queue.name
        self.cursor = 0
        self.returned: list[Returned] = []
        self.link: Link | None = None
        self.state = CONNECTING
        self.refusal: str | None = None
        self.held = Holdings([])  # what the standby held when this link attached
        self.sent_through = 0  # the newest seq sent on this link
        self.passed = 0  # the newest seq the browser has handed over on this link, sent or held already
        self.to_pass = 0  # messages here the standby holds that the browser has not handed over yet
        self.last_mirrored = 0  # the newest seq the standby confirmed
        self.in_flight: dict[int, int] = {}  # delivery -> seq
        # Messages here the standby has not confirmed: seq -> (enqueue time, bytes), oldest first.
        self.waiting: OrderedDict[int, tuple[float, int]] = OrderedDict()
        self.held_back = 0  # their bytes
        self.over_limit = False
        self.dequeues: list[int] = []  # seqs dequeued here, for the next D
        # Scheduled messages, deferred until due: a browser passes them by, so each is sent in its place in the
        # queue's order by the mirror itself, before the next message the browser hands over.
        self.deferred: deque[Entry] = deque()
        self.deleted = False  # Dispatchable: stopped
        now = time.time()
        for entry in queue.entries():
            self._wait(entry.seq, now, len(entry.data))
            if entry.state == DEFERRED:
                self.deferred.append(entry)
        queue.observers.append(self)
        host.standby.add(self)

    # -- the connection (StandbyLink) ---------------------------------------------------------------
    def attach(self, conn: Connection, held: dict[str, Any] | None) -> None:
        if held is not None and held.get("uid") != self.queue.uid:
            held = None  # the standby's copy is of an earlier queue of this name: it starts over
        self.held = Holdings(runs(held))
        self.link = conn.open_link(True, f"{protocol.QUEUE}/{self.name}", f"{protocol.QUEUE}/{self.name}", self,
                                   properties={**self.host.standby.link_properties(), protocol.UID: self.queue.uid,
                                               protocol.ARGS: dict(self.queue.args)})
        self.state, self.refusal, self.sent_through, self.passed = MIRRORING, None, 0, 0
        self.deferred = deque(e for e in self.queue.entries() if e.state == DEFERRED)
        live = set(self.queue.live_seqs())
        gone = [seq for seq in self.held.seqs() if seq not in live]
        self.to_pass = sum(1 for seq in live if seq in self.held)
        if gone:  # consumed here while the standby was away (or before this primary was promoted)
            self._send_dequeues(gone)
        for seq in [seq for seq in self.waiting if seq in self.held]:
            self._mirrored(seq)
        self.queue.subscribe(self)  # from the start: deliver() passes what the standby holds

    def lost(self) -> None:
        self.link = None
        self.in_flight.clear()
        self.dequeues.clear()
        self.queue.unsubscribe(self)
        if self.state != REFUSED:
            self.state = CONNECTING

    # -- the queue's browser ------------------------------------------------------------------------
    def credit(self) -> int:
        """The link's credit, and the messages the standby holds already: passing those takes none."""
        link = self.link
        credit = link.credit() if link is not None and not link.output_full() else 0
        return credit + self.to_pass if credit > 0 else 0

    def deliver(self, entry: Entry) -> None:
        seq = entry.seq
        if self.deferred and self.deferred[0].seq < seq:
            self._send_deferred(seq)
        self.passed = seq
        if seq in self.held:
            self.to_pass -= 1
        elif self.link is not None:
            self._send(entry)

    def after_dispatch(self) -> None:
        if self.deferred:
            self._send_deferred(None)

    def _send_deferred(self, before: int | None) -> None:
        """The scheduled messages older than `before` (None: all), those the browser did not hand over itself."""
        while self.deferred and (before is None or self.deferred[0].seq < before):
            entry = self.deferred.popleft()
            if entry.state != DEQUEUED and entry.seq > self.sent_through and entry.seq not in self.held \
                    and self.link is not None:
                self._send(entry)

    def _send(self, entry: Entry) -> None:
        assert self.link is not None
        seq = entry.seq
        waited = self.waiting.get(seq)
        enqueued_us = int((waited[0] if waited else time.time()) * 1e6)
        delivery = self.link.send(with_seq(entry.data, seq), tag=message_tag(protocol.ENQUEUE, seq, enqueued_us))
        if delivery is not None:
            self.in_flight[delivery] = seq
        self.sent_through = seq

    def queue_deleted(self) -> None:
        self.stop()

    # -- the queue's observer -----------------------------------------------------------------------
    def enqueued(self, queue: Queue, entry: Entry) -> None:
        self._wait(entry.seq, time.time(), len(entry.data))
        if entry.state == DEFERRED:  # scheduled: its hook deferred it before the observers heard of it
            self.deferred.append(entry)

    def acquired(self, queue: Queue, entry: Entry) -> None:
        pass

    def dequeued(self, queue: Queue, entry: Entry) -> None:
        seq = entry.seq
        self._mirrored(seq)  # nothing of it left to mirror but, if the standby has it, its dequeue
        if seq > self.passed and seq in self.held:
            self.to_pass -= 1  # the browser will not see it
        if self.link is not None and (seq <= self.sent_through or seq in self.held):
            if not self.dequeues:
                self.host.schedule(self)
            self.dequeues.append(seq)

    def dispatch(self) -> None:
        """The dequeues of this pass, as one D."""
        if self.dequeues and self.link is not None:
            self._send_dequeues(self.dequeues)
        self.dequeues = []

    def _send_dequeues(self, seqs: list[int]) -> None:
        assert self.link is not None
        self.link.send(encode_ranges(seq_ranges(seqs)), settled=True, tag=message_tag(protocol.DEQUEUE, max(seqs), 0))

    # -- the standby's answers ------------------------------------------------------------------------
    def on_credit(self) -> None:
        self.host.schedule(self.queue)

    def on_outcome(self, delivery: Any, outcome: int, failed: bool, undeliverable: bool) -> None:
        seq = self.in_flight.pop(delivery, None)
        if seq is None:
            return
        if outcome == ACCEPTED:
            self.last_mirrored = max(self.last_mirrored, seq)
            self._mirrored(seq)
        elif self.link is not None:  # the standby could not apply it: start again from what it holds
            error = Link.outcome_error(delivery)
            log.warning("mirror of queue %s: the standby did not take seq %d (%s); attaching again", self.name, seq,
                        f"{error[0]}: {error[1]}" if error else "released")
            self.link.close()

    def on_detach(self) -> None:
        link, self.link = self.link, None
        if link is None or self.deleted or link.conn.closed:
            return  # closed here, or with its connection (lost() follows)
        reason = link.remote_error()
        self.lost()
        if reason is not None:  # refused: said once, tried again with the next connection
            if reason != self.refusal:
                log.warning("mirror of queue %s: the standby refuses it: %s", self.name, reason)
            self.state, self.refusal = REFUSED, reason
        else:  # closed after a message it did not take
            held = self.host.standby.held
            conn = self.host.standby.conn
            if conn is not None and held is not None:
                self.attach(conn, held.get(self.name))

    def stop(self) -> None:
        self.deleted = True
        self.queue.unsubscribe(self)
        if self in self.queue.observers:
            self.queue.observers.remove(self)
        self.host.standby.remove(self)
        link, self.link = self.link, None
        if link is not None:
            link.close()
        self.host.stopped(self)

    # -- lag ------------------------------------------------------------------------------------------
    def _wait(self, seq: int, when: float, size: int) -> None:
        self.waiting[seq] = (when, size)
        self.held_back += size
        limit = self.host.max_backlog_bytes
        if limit and not self.over_limit and self.held_back > limit:
            self.over_limit = True
            log.warning("mirror of queue %s: %d bytes not yet on the standby, over mirror.max_backlog_bytes (%d)",
                        self.name, self.held_back, limit)

    def _mirrored(self, seq: int) -> None:
        """Nothing more of seq to wait for: on the standby, or gone from here before it was sent."""
        waited = self.waiting.pop(seq, None)
        if waited is not None:
            self.held_back -= waited[1]
            if self.over_limit and self.held_back < self.host.max_backlog_bytes * LOW_WATER:  # no flapping at the edge
                self.over_limit = False
                log.info("mirror of queue %s: %d bytes not yet on the standby, back under mirror.max_backlog_bytes",
                         self.name, self.held_back)

    def status(self, now: float) -> dict[str, Any]:
        oldest = next(iter(self.waiting.values()), None)
        return {"queue": self.name, "state": self.state, "lag_messages": len(self.waiting),
                "lag_seconds": round(max(0.0, now - oldest[0]), 3) if oldest else 0.0,
                "last_mirrored_seq": self.last_mirrored, "bytes_held_back": self.held_back,
                "backlog_limit_reached": self.over_limit, "refused": self.refusal}
