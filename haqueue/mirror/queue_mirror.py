"""QueueMirror: one source queue's mirror, on the source's primary (design/mirroring.md).

It reads what the queue holds and nothing else, at its own pace: an observer (told of each enqueue and dequeue, not of
acquires) and a reader by seq (Queue.read_after: the live messages after the newest it sent, none acquired), never a
subscriber, so the queue's dispatch never hands it anything and consumers here are untouched. A publisher's
confirmation never waits for it. Every mirror reads at the same ticks, GATHER apart (one pass for all of its
queues, at no wake-up of its own while clients keep the broker busy: a lazy timer), and sends, in the queue's order,
what the standby lacks (protocol 2: up to BATCH_MESSAGES messages as one `B` transfer, untouched; protocol 1: each as
an `E`, with the source seq in a message annotation), then the seqs
dequeued here since the last tick (`D`); once the queue is deleted here, `X`. A message consumed before the tick is
never read nor sent. When the link's credit runs out (a catch-up), the reading goes on as the standby grants more.
The standby settles each transfer once its own guards have it: that is its messages mirrored.

The lag book is kept per transfer, not per message: counts (messages and bytes not yet on the standby), the batches
in flight (their first and last seqs, counts and bytes), and time marks (seq, enqueue time) from which the age of
the oldest message waiting, and each confirmed transfer's lag, are read: one for the first message enqueued after
each read (the first of the next transfer), or every MARK_INTERVAL_DOWN while the link is down or held up; the marks
before the oldest message waiting are dropped as the reads and confirmations go. So a message costs the source two
additions as it is enqueued (a clock reading for one in a tick's), a subtraction as it is dequeued unsent, and a
place in a transfer as it is read (at the tick, for those still here).

On each attach the standby says which seqs it holds (the connection's `$mirror.state`). The mirror then sends `D`
for those no longer here, and reads the queue from its start, sending only what the standby lacks: nothing is
skipped, whichever primary of the source cluster does it. A message goes twice only when the standby applied it
after saying what it held (a link attached again on the same connection): the standby settles that copy without
applying it again.
"""
from __future__ import annotations

import bisect
import logging
import time
from collections import deque
from typing import Any, Final, Protocol

from ..broker.connection import Connection
from ..broker.flow import LOW_WATER
from ..broker.loop import Loop
from ..broker.proton_adapter import ACCEPTED, Link, LinkHandler
from ..broker.queue import ACQUIRED, Entry, Queue, QueueObserver, seq_ranges
from ..ha.protocol import batch_index, encode_ranges, message_tag
from . import protocol
from .annotation import with_seq
from .standby_link import Deletion, StandbyLink, runs

log = logging.getLogger("haqueue.mirror")

CONNECTING, MIRRORING, REFUSED = "connecting", "mirroring", "refused"

BATCH_BYTES: Final = 32 * 1024  # message bytes per transfer at most (as HA's); a larger message goes alone
BATCH_MESSAGES: Final = 512  # messages per transfer at most
PER_PASS: Final = 2000  # messages one read looks at, at most: a catch-up leaves the loop to the clients
# Seconds between the reads of every mirror: at 1,000 msg/s a transfer, a settlement and a D a message would each cost
# a wake-up on both sides, so what comes in GATHER is read and sent together (one wake-up for the mirrors of all the
# queues, one write, one settlement back); a message waits GATHER at most (+ broker.loop.LAZY_SLACK when idle).
# 20 ms, not 5: at 1,000 msg/s the source paid 1.2x its CPU a message for 200 wake-ups a second and as many
# settlements, and the lag budget is the sites' round trip + 50 ms (bench/mirror.py).
GATHER: Final = 0.020
# Seconds between the lag book's time marks while the link is down or held up (an hour's partition: 3,600 marks); up,
# one a read.
MARK_INTERVAL_DOWN: Final = 1.0
LAG_SAMPLES: Final = 10_000  # the latest transfers whose lag status shows (mirrored_lag_ms)


class MirrorHost(Protocol):
    """What a QueueMirror needs of the source (source.py)."""

    standby: StandbyLink
    max_backlog_bytes: int  # read once, as the mirror starts (the config's)

    ticks: "Ticks"

    def schedule(self, item: Any) -> None: ...  # the broker's: item.dispatch() at the end of the pass
    def stopped(self, mirror: "QueueMirror") -> None: ...


class Ticks:
    """The mirrors' one timer: those with something to read or send at the next tick, GATHER apart, run together.
    A mirror joining costs an append, not a timer of its own (nor a clock reading): the first to join sets the
    tick's timer, a lazy one, so that a busy broker (passing every few ms) is not woken for it at all."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop  # the engine's, called directly (compiled)
        self.due: list[QueueMirror] = []
        self.tick = self._tick  # one bound method for every tick's timer

    def join(self, mirror: "QueueMirror") -> None:
        if not self.due:
            now = time.monotonic()
            self.loop.call_at(now - now % GATHER + GATHER, self.tick, True)
        self.due.append(mirror)

    def _tick(self) -> None:
        due, self.due = self.due, []
        for mirror in due:
            mirror.gathered()


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


class Batch:
    """One transfer's messages, in flight: its seqs span [first, last] in order, and every live message of the queue
    in that span not held by the standby is in it."""

    __slots__ = ("first", "last", "count", "size", "done")

    def __init__(self, first: int, last: int, count: int, size: int) -> None:
        self.first, self.last, self.count, self.size = first, last, count, size  # count, size: still waiting
        self.done = False  # the standby confirmed it (before one sent earlier)


class QueueMirror(LinkHandler, QueueObserver):
    def __init__(self, host: MirrorHost, queue: Queue) -> None:
        self.host = host
        self.queue = queue
        self.name = queue.name
        self.link: Link | None = None
        self.state = CONNECTING
        self.refusal: str | None = None
        self.per_transfer = 1  # messages a transfer may carry: BATCH_MESSAGES with mirror protocol 2
        self.held = Holdings([])  # what the standby held when this link attached
        self.held_last = 0  # its newest seq: every message after it is not held (asked first, on the hot path)
        self.sent_through = 0  # the newest seq read on this link: sent, or held by the standby already
        self.blocked = False  # the last read stopped for want of credit (or of room in the output): on_credit goes on
        # The newest seq here as the last tick came: a message after it that a consumer holds is likely gone by the
        # next tick, so a read stops there (sending it would cost a transfer, its settlement and a D, at 1,000 msg/s
        # at every tick, for nothing): what follows waits one tick more, at most.
        self.fence = 0
        self.last_mirrored = 0  # the newest seq the standby confirmed
        self.confirmed_through = 0  # every live message up to this seq the standby holds or confirmed
        # The lag book: messages here the standby has not confirmed (counts), the transfers in flight, oldest first
        # (by delivery too), and the time marks: (seq, enqueue time).
        self.waiting = 0
        self.held_back = 0  # their bytes
        self.flying = 0  # ... of them in flight: the others are still to read (waiting - flying)
        self.flight: deque[Batch] = deque()
        self.in_flight: dict[int, Batch] = {}  # delivery -> batch
        self.limit = host.max_backlog_bytes
        self.marks: deque[tuple[int, float]] = deque()
        self.mark_due = True  # the next message enqueued is marked: the first since the last read (or, down or held
        # up, a second after the last mark: next_mark)
        # Per confirmed transfer, seconds from its oldest message's enqueue (its mark's) to the standby's
        # confirmation: the lag of what was mirrored, as the source saw it.
        self.lags: deque[float] = deque(maxlen=LAG_SAMPLES)
        self.next_mark = 0.0
        self.over_limit = False
        self.dequeues: list[int] = []  # seqs dequeued here, for the next D
        self.gathering = False  # joined the next tick (Ticks)
        self.deleted = False  # stopped: its queue deleted, or this cluster a standby now
        self.deletion: Deletion | None = None  # the queue was deleted: the standby is told on its link
        self.ticks = host.ticks
        for entry in queue.entries():
            self.enqueued(queue, entry)
        queue.observers.append(self)
        host.standby.add(self)

    # -- the connection (StandbyLink) ---------------------------------------------------------------
    def attach(self, conn: Connection, held: dict[str, Any] | None) -> None:
        if held is not None and held.get("uid") != self.queue.uid:
            held = None  # the standby's copy is of an earlier queue of this name: it starts over
        self.held = Holdings(runs(held))
        self.held_last = self.held.runs[-1][1] if self.held.runs else 0
        standby = self.host.standby
        self.per_transfer = BATCH_MESSAGES if standby.protocol >= protocol.BATCH_PROTOCOL else 1
        self.link = conn.open_link(True, f"{protocol.QUEUE}/{self.name}", f"{protocol.QUEUE}/{self.name}", self,
                                   properties={**standby.link_properties(self.name), protocol.UID: self.queue.uid,
                                               protocol.ARGS: dict(self.queue.args)})
        self.state, self.refusal = MIRRORING, None
        self.sent_through = self.confirmed_through = 0
        self.blocked = False
        self.flight.clear()
        self.in_flight.clear()
        self.flying = 0
        entries = self.queue.entries()
        live = {e.seq for e in entries}
        gone = [seq for seq in self.held.seqs() if seq not in live]
        if gone:  # consumed here while the standby was away (or before this primary was promoted)
            self._send_dequeues(gone)
        # the book counted again: what the standby holds is no longer waiting
        self.waiting = self.held_back = 0
        for entry in entries:
            if entry.seq not in self.held:
                self.waiting += 1
                self.held_back += len(entry.data)
        self._limit()
        self._read()  # from the start: what the standby holds is passed by

    def lost(self) -> None:
        self.link = None
        self.flight.clear()  # their messages wait on (counted still)
        self.in_flight.clear()
        self.flying = 0
        self.dequeues.clear()
        self.blocked = False
        self.mark_due = True  # down: a mark a second
        if self.state != REFUSED:
            self.state = CONNECTING

    # -- reading the queue ------------------------------------------------------------------------------
    def _read(self) -> None:
        """Read the queue on from sent_through and send what the standby lacks, in transfers of BATCH_MESSAGES and
        BATCH_BYTES at most, as far as the link's credit goes; PER_PASS messages at most, the next pass going on."""
        link = self.link
        if link is None:
            return
        credit = link.credit()
        if credit <= 0 or link.output_full():
            self.blocked = self.mark_due = True
            return
        self.blocked = False
        per_transfer = self.per_transfer
        wanted = min(credit * per_transfer, PER_PASS)
        entries = self.queue.read_after(self.sent_through, wanted)
        self._marked_to(self.flight[0].first if self.flight else entries[0].seq if entries else 0)
        held, held_last, fence = self.held, self.held_last, self.fence
        batch: list[Entry] = []
        size = 0
        fenced = False
        for entry in entries:
            seq = entry.seq
            if seq <= held_last and seq in held:
                if not batch:
                    self.sent_through = seq  # the standby has it: passed by
                continue
            if seq > fence and entry.state == ACQUIRED:  # it and what follows: at the next tick
                fenced = True
                break
            length = len(entry.data)
            if batch and (len(batch) >= per_transfer or size + length > BATCH_BYTES):
                self._send(link, batch, size)
                credit -= 1
                batch, size = [], 0
                if not credit:  # this one and the rest wait for more
                    self.blocked = True
                    return
            batch.append(entry)
            size += length
        if batch:
            self._send(link, batch, size)
            credit -= 1
        # More may be there: the read was full, or some waiting were not read (paged, one batch read back a call)
        if fenced or (entries == [] and self.waiting > self.flying):  # at the next tick (paged ones not read back
            if not self.gathering:  # yet: not on disk yet)
                self._gather()
        elif len(entries) == wanted or self.waiting > self.flying:
            if credit:
                self.host.schedule(self)
            else:
                self.blocked = True

    def dispatch(self) -> None:
        """The next pass of a read PER_PASS held back (host.schedule)."""
        self._read()

    def _send(self, link: Link, batch: list[Entry], size: int) -> None:
        """One transfer: protocol 2's `B` of the batch, or protocol 1's `E` of its one message."""
        first = batch[0]
        stamp = int(time.time() * 1e6)
        if self.per_transfer > 1:
            pieces = [e.data for e in batch]
            pieces.append(batch_index([e.seq for e in batch], [len(e.data) for e in batch]))
            delivery = link.send(pieces, tag=message_tag(protocol.BATCH, first.seq, stamp))
        else:
            delivery = link.send(with_seq(first.data, first.seq), tag=message_tag(protocol.ENQUEUE, first.seq, stamp))
        sent = Batch(first.seq, batch[-1].seq, len(batch), size)
        self.flying += sent.count
        self.flight.append(sent)
        if delivery is not None:
            self.in_flight[delivery] = sent
        self.sent_through = sent.last

    # -- the queue's observer -----------------------------------------------------------------------
    def enqueued(self, queue: Queue, entry: Entry) -> None:
        """A message here the standby has not confirmed: counted, its time marked if one is due, read at the tick."""
        self.waiting += 1
        self.held_back += len(entry.data)
        if self.mark_due and not self.over_limit:  # past the limit the book keeps counts only
            self._mark(entry.seq)
        if not self.over_limit and self.held_back > self.limit > 0:
            self._limit()
        if not self.gathering and self.link is not None:
            self._gather()

    def _mark(self, seq: int) -> None:
        now = time.time()
        if self.link is not None and not self.blocked:  # the first since the last read: the next read marks again
            self.mark_due = False
        elif now < self.next_mark:  # down, or held up (no credit, the output full): one a MARK_INTERVAL_DOWN
            return
        self.marks.append((seq, now))
        self.next_mark = now + MARK_INTERVAL_DOWN

    def _marked_to(self, oldest: int) -> None:
        """A read: the next message enqueued is marked, and the marks before the one of `oldest`, the oldest message
        waiting (0: unknown, left for on_outcome), are dropped; none are kept once none waits."""
        self.mark_due = True
        marks = self.marks
        if oldest:
            while len(marks) > 1 and marks[1][0] <= oldest:
                marks.popleft()
        elif self.waiting <= 0 and not self.flight:
            marks.clear()

    def dequeued(self, queue: Queue, entry: Entry) -> None:
        seq = entry.seq
        held = seq <= self.held_last and seq in self.held
        if not held and seq > self.confirmed_through:
            self._gone(seq, len(entry.data))
        if self.link is not None and (seq <= self.sent_through or held):
            self.dequeues.append(seq)
            if not self.gathering:
                self._gather()

    def _gone(self, seq: int, size: int) -> None:
        """A message not known to be on the standby left the queue: it waits no more. One not read yet is never sent
        (most, at 1,000 msg/s with a consumer: taken before the tick); one in flight is counted out of its batch."""
        if seq <= self.sent_through:
            for batch in reversed(self.flight):  # newest first: a consumer takes what was sent last
                if batch.last < seq:
                    break
                if seq >= batch.first:
                    if batch.done:
                        return  # confirmed, before an older batch was
                    batch.count -= 1
                    batch.size -= size
                    self.flying -= 1
                    break
        self.waiting -= 1
        self.held_back = self.held_back - size if self.waiting else 0  # see on_outcome
        if self.over_limit:
            self._limit()

    def _gather(self) -> None:
        """Read and send at the next tick (Ticks)."""
        self.gathering = True
        self.ticks.join(self)

    def gathered(self) -> None:
        """What came in since the last tick (if any is still here unsent), then the dequeues as one D (each names only
        seqs sent before it)."""
        self.gathering = False
        if self.link is None:
            return
        if self.waiting > self.flying:
            self._read()
        else:  # every message enqueued since was consumed (most, with a consumer at 1,000 msg/s): nothing to read
            self._marked_to(self.flight[0].first if self.flight else 0)
        self.fence = self.queue.next_seq - 1
        if self.dequeues:
            self._send_dequeues(self.dequeues)
            self.dequeues = []

    def _send_dequeues(self, seqs: list[int]) -> None:
        assert self.link is not None
        self.link.send(encode_ranges(seq_ranges(seqs)), settled=True, tag=message_tag(protocol.DEQUEUE, max(seqs), 0))

    # -- the standby's answers ------------------------------------------------------------------------
    def on_credit(self) -> None:
        if self.deletion is not None:
            self.deletion.on_credit()
            return
        if self.blocked:
            self._read()

    def on_outcome(self, delivery: Any, outcome: int, failed: bool, undeliverable: bool) -> None:
        batch = self.in_flight.pop(delivery, None)
        if batch is None:
            return
        if outcome == ACCEPTED:
            enqueued = self._enqueued(batch.first)
            if enqueued is not None:
                self.lags.append(time.time() - enqueued)
            self.last_mirrored = max(self.last_mirrored, batch.last)
            self.waiting -= batch.count
            self.flying -= batch.count
            # A message's bytes are counted as it is enqueued and again as it leaves the book, and a failed
            # delivery may have grown its header (delivery-count) meanwhile: once nothing waits, nothing is held.
            self.held_back = self.held_back - batch.size if self.waiting else 0
            batch.done = True
            flight = self.flight
            while flight and flight[0].done:
                self.confirmed_through = flight.popleft().last
            marks = self.marks
            while len(marks) > 1 and marks[1][0] <= self.confirmed_through + 1:
                marks.popleft()
            if self.over_limit:
                self._limit()
        elif self.link is not None:  # the standby could not apply it: start again from what it holds
            error = Link.outcome_error(delivery)
            log.warning("mirror of queue %s: the standby did not take seqs %d-%d (%s); attaching again", self.name,
                        batch.first, batch.last, f"{error[0]}: {error[1]}" if error else "released")
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

    def stop(self, gone: bool = False) -> None:
        """No more mirroring of the queue: it was deleted here (`gone`: the standby deletes its copy, told now if it
        speaks protocol 2 and is connected, else when it next is), or this cluster became a standby."""
        self.deleted = True
        if self in self.queue.observers:
            self.queue.observers.remove(self)
        self.host.standby.remove(self)
        link, self.link = self.link, None
        if link is not None and gone and self.host.standby.protocol >= protocol.BATCH_PROTOCOL:
            self.deletion = Deletion()
            self.deletion.link = link
            self.deletion.on_credit()
        elif link is not None:
            link.close()
        self.host.stopped(self)

    # -- lag ------------------------------------------------------------------------------------------
    def _limit(self) -> None:
        """Say so when the bytes held back pass mirror.max_backlog_bytes, and when they are back under 90 % of it
        (no flapping at the edge)."""
        limit = self.limit
        if not limit:
            return
        if not self.over_limit and self.held_back > limit:
            self.over_limit = True
            log.warning("mirror of queue %s: %d bytes not yet on the standby, over mirror.max_backlog_bytes (%d): "
                        "the mirror keeps counts only until it is back under", self.name, self.held_back, limit)
        elif self.over_limit and self.held_back < limit * LOW_WATER:
            self.over_limit = False
            log.info("mirror of queue %s: %d bytes not yet on the standby, back under mirror.max_backlog_bytes",
                     self.name, self.held_back)

    def _oldest(self) -> float | None:
        """When the oldest message waiting was enqueued (or earlier: its mark's), None if none waits."""
        if self.waiting <= 0:
            return None
        if self.flight:
            return self._enqueued(self.flight[0].first)
        unsent = self.queue.read_after(self.sent_through, 1, page_in=False)
        return self._enqueued(unsent[0].seq if unsent else self.confirmed_through + 1)

    def _enqueued(self, seq: int) -> float | None:
        """When the message `seq` was enqueued: the newest mark at or before it (the first message after the read before
        it; earlier past the backlog limit)."""
        marks = self.marks
        if not marks:
            return None
        i = bisect.bisect_right(marks, seq, key=_mark_seq) - 1
        return marks[max(i, 0)][1]

    def status(self, now: float) -> dict[str, Any]:
        oldest = self._oldest()
        return {"queue": self.name, "state": self.state, "lag_messages": self.waiting,
                "lag_seconds": round(max(0.0, now - oldest), 3) if oldest is not None else 0.0,
                "last_mirrored_seq": self.last_mirrored, "bytes_held_back": max(self.held_back, 0),
                "backlog_limit_reached": self.over_limit, "refused": self.refusal,
                "transfers_in_flight": len(self.in_flight), "messages_per_transfer": self.per_transfer,
                "mirrored_lag_ms": _percentiles(self.lags)}


def _percentiles(lags: deque[float]) -> dict[str, Any]:
    """p50, p99 and max of the latest confirmed transfers' lags, in ms, and how many there were."""
    ordered = sorted(lags)
    n = len(ordered)
    at = (lambda p: round(ordered[min(n - 1, int(p * n))] * 1000, 1)) if n else (lambda p: None)
    return {"transfers": n, "p50": at(0.5), "p99": at(0.99), "max": at(1.0)}


def _mark_seq(mark: tuple[int, float]) -> int:
    return mark[0]
