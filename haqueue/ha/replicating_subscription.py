"""The primary's end of one backup's replication link for one queue.

It is three things at once: a link handler (the `$ha.queue/<name>` link the backup attached),
a queue observer (live enqueues, acquisitions, dequeues) and a queue guard (the publisher's
completion waits for this backup's settlement of the live enqueue).

On one ordered link it sends, in this order of priority: live enqueues (at the end of the loop's
pass, many to a transfer), then batched acquire and dequeue events, then catch-up messages newest
first (skipping any dequeued meanwhile), then the caught-up marker once nothing older is left.

A transaction's commit reaches the backup in parts, one per queue it touches: its enqueues as `T`
transfers, then a `K` marker carrying its dequeues. The backup applies it once it has every queue's
marker, and settles the markers then: a marker's settlement confirms the transaction's enqueues on
that queue (design/transactions.md).
"""
from __future__ import annotations

import bisect
import logging
import time
from collections import deque
from typing import Any, Callable, Final, Protocol

from ..broker.completion import Completion
from ..broker.message import delivery_count
from ..broker.proton_adapter import ACCEPTED, Link, LinkHandler
from ..broker.queue import DEQUEUED, AcquireObserver, Entry, Queue, QueueObserver, seq_ranges
from . import protocol
from .quorum import Quorums
from .test_hooks import caught_up_held

log = logging.getLogger("haqueue.ha.primary")

BATCH_BYTES: Final = 32 * 1024  # message bytes per live transfer at most: one frame, which the backup reads whole
EVENT_DELAY: Final = 0.005  # seconds acquire/dequeue events may wait for a live enqueue to ride with
_CATCHUP_PER_PASS: Final = 500  # catch-up transfers per pass, so live traffic and IO interleave (2000 gave live p99 19 ms)


class Confirmations(Protocol):
    """A backup's totals (primary.BackupCounters): what it confirmed."""

    confirmed: int


class SubscriptionHost(Protocol):
    """What a ReplicatingSubscription needs of the backup it serves (primary.RemoteBackup): it never imports the
    primary."""

    name: str

    @property
    def counters(self) -> Confirmations: ...

    @property
    def quorums(self) -> Quorums | None:
        """The primary's votes (the floor, and the majority of a quorum mode); None when nothing counts them."""

    @property
    def holds(self) -> bool:
        """Does each backup hold the publishes it has not confirmed (`all`, `all_disk`)?"""

    def schedule(self, sub: ReplicatingSubscription) -> None:
        """Call sub.dispatch() at the end of this pass."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> None: ...

    def context_changing(self) -> None:
        """The backups ready for a queue are about to change (the audit log writes what it buffered)."""

    def caught_up(self, sub: ReplicatingSubscription) -> None: ...

    def never_here(self, queue: Queue) -> tuple[int, int]:
        """The seqs [start, end) of the queue that the primary never had: above what it held when promoted, below
        its own epoch's first."""

    def adopted(self, queue: Queue) -> list[tuple[int, int]]:
        """Runs of those seqs that the primary adopted from another backup and has confirmed (adoption.py)."""

    def subscription_closed(self, sub: ReplicatingSubscription) -> None: ...

    def drop(self, reason: str) -> None:
        """Drop the backup: release its holds, close its connection."""


def _in_runs(starts: list[int], runs: list[tuple[int, int]], seq: int) -> bool:
    i = bisect.bisect_right(starts, seq) - 1
    return i >= 0 and runs[i][1] >= seq


def _split(runs: list[tuple[int, int]], start: int, end: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The parts of runs inside [start, end), and those outside."""
    inside: list[tuple[int, int]] = []
    outside: list[tuple[int, int]] = []
    for first, last in runs:
        low, high = max(first, start), min(last, end - 1)
        if low > high:
            outside.append((first, last))
            continue
        inside.append((low, high))
        if first < low:
            outside.append((first, low - 1))
        if high < last:
            outside.append((high + 1, last))
    return inside, outside


def _missing(runs: list[tuple[int, int]], live: list[int]) -> list[tuple[int, int]]:
    """The parts of runs (what the backup holds) that are not live seqs on the primary."""
    gaps: list[tuple[int, int]] = []
    for first, last in runs:
        i = bisect.bisect_left(live, first)
        position = first
        while i < len(live) and live[i] <= last:
            if live[i] > position:
                gaps.append((position, live[i] - 1))
            position = live[i] + 1
            i += 1
        if position <= last:
            gaps.append((position, last))
    return gaps


class ReplicatingSubscription(LinkHandler, QueueObserver, AcquireObserver):
    def __init__(self, backup: SubscriptionHost, link: Link, queue: Queue, have: list[tuple[int, int]]) -> None:
        self.backup = backup
        self.link = link
        self.queue = queue
        self.pending: list[Entry] = []  # live enqueues not sent yet: at the end of the pass, or on credit
        self.dequeued_seqs: list[int] = []
        self.acquired_seqs: list[int] = []
        self.recounts: dict[int, int] = {}  # seq -> the delivery-count a failed delivery raised it to
        self.held: dict[int, Completion] = {}  # seq -> the publisher's completion this backup holds
        self.deliveries: dict[int, list[int]] = {}  # unconfirmed live transfer -> the seqs it carries
        self.unconfirmed = 0  # messages in them
        self.txn = 0  # the transaction being committed now: what happens to the queue meanwhile is part of it
        self.txn_parts: dict[int, list[int]] = {}  # transaction -> its enqueues' seqs, until its marker is sent
        self.txn_seqs: dict[int, int] = {}  # those seqs -> their transaction, until sent
        self.txn_dequeues: list[int] = []  # the current transaction's dequeues, sent with its marker
        self.txn_pending = 0  # pending entries that are transaction parts or markers (sent one by one)
        # (time sent, delivery, its seqs list) of live transfers, oldest first. proton reuses a settled
        # delivery's address for the next transfer at once, so an entry is still unconfirmed only while
        # `deliveries` maps its delivery to that very list: by address alone a confirmed transfer whose
        # address was in use again looked unconfirmed, and lag_seconds (and the timeout) counted from it.
        self.sent: deque[tuple[float, int, list[int]]] = deque()
        self.closed = False
        self.caught_up = False
        self.marker_sent = caught_up_held(queue.name)  # a test hook (test_hooks.py); False but in tests
        self.marker: Any = None  # the caught-up marker's delivery
        self._events_timer = False
        self.first_live = queue.next_seq  # older messages reach the backup by catch-up (or it has them)
        live = queue.entries()
        starts = [first for first, _ in have]
        self.catchup = [e for e in live if not e.local and not _in_runs(starts, have, e.seq)]
        self.catchup_total = len(self.catchup)  # what the catch-up started with (its progress: status)
        gone = _missing(have, [e.seq for e in live])
        if gone:  # the backup holds messages the primary no longer has
            never_here, consumed = _split(gone, *backup.never_here(queue))
            for first, last in backup.adopted(queue) if never_here else ():  # here now, under new seqs
                here, never_here = _split(never_here, first, last + 1)
                consumed += here
            self._diverged(never_here, consumed)
        self.quorums = backup.quorums  # this backup's confirmations are votes
        if backup.holds:  # and under `all`, holds too
            queue.guards.append(self)
        queue.observers.append(self)
        queue.acquire_observers.append(self)
        self._recount_watcher = self.recounted
        queue.recount_watchers.append(self._recount_watcher)
        self.backup.schedule(self)

    def _diverged(self, never_here: list[tuple[int, int]], consumed: list[tuple[int, int]]) -> None:
        """Messages the backup holds that this primary never had: it gives them to be adopted (adoption.py) or, those
        it published to alone as a primary cut off from the cluster, keeps them aside; those consumed here since it
        left (or adopted from another backup), it removes."""
        if never_here:
            log.warning("backup %s holds messages of queue '%s' that this primary never had (seqs %s, at most %d "
                        "messages): it gives them to be adopted, or keeps them aside in its diverged files",
                        self.backup.name, self.queue.name,
                        protocol.show_ranges(never_here), sum(last - first + 1 for first, last in never_here))
            self.link.send(protocol.encode_ranges(never_here), settled=True,
                           tag=protocol.message_tag(protocol.DIVERGED, 0, 0))
        if consumed:
            self.link.send(protocol.encode_ranges(consumed), settled=True, tag=protocol.message_tag(protocol.DEQUEUE, 0, 0))

    @property
    def deleted(self) -> bool:
        return self.closed

    @property
    def lag(self) -> int:
        """Messages this backup does not have yet: unconfirmed, waiting, and catch-up left."""
        return self.unconfirmed + len(self.pending) + len(self.catchup)

    # -- guard and observer (called by the queue) ----------------------------------------------
    def hold(self, queue: Queue, entry: Entry, completion: Completion) -> None:
        completion.hold()
        self.held[entry.seq] = completion

    def enqueued(self, queue: Queue, entry: Entry) -> None:
        if entry.local:  # kept on the primary (policy.py): the backup never hears of it
            return
        if not self.pending:
            self.backup.schedule(self)
        self.pending.append(entry)
        if self.txn:
            self.txn_parts.setdefault(self.txn, []).append(entry.seq)
            self.txn_seqs[entry.seq] = self.txn
            self.txn_pending += 1

    def acquired(self, queue: Queue, entry: Entry) -> None:
        if entry.local:  # the backup would remember its seq for good (it never holds it to dequeue)
            return
        self.acquired_seqs.append(entry.seq)
        self._events_due()

    def recounted(self, queue: Queue, entry: Entry) -> None:
        """A failed delivery raised the message's delivery-count: the backup raises its copy's (a poison message's
        limit, x-max-deliveries, counts the deliveries before a failover too)."""
        if entry.local:
            return
        # The backup forgets the acquisition this ends (queue_replicator): sent before the acquisitions, the count
        # must not take one made since, nor leave one not sent yet.
        if entry.seq in self.acquired_seqs:
            self.acquired_seqs.remove(entry.seq)
        self.recounts[entry.seq] = delivery_count(entry.data)
        self._events_due()

    def dequeued(self, queue: Queue, entry: Entry) -> None:
        if entry.local:  # the backup's work stays in proportion to what it holds
            return
        completion = self.held.pop(entry.seq, None)
        if completion is not None:  # consumed before this backup confirmed: nothing left to protect
            completion.release()
        if self.txn:
            self.txn_dequeues.append(entry.seq)
            return
        self.dequeued_seqs.append(entry.seq)
        self._events_due()

    # -- a transaction's commit (Primary tells each subscription of the queues it touches) ----------
    def committing(self, number: int) -> None:
        self.txn = number

    def committed(self, number: int, queues: list[str]) -> None:
        """Its marker follows its enqueues: an entry of seq 0 in the pending list."""
        marker = Entry(0, protocol.encode_map({"txn": number, "queues": queues, "dequeues": self.txn_dequeues}), 0.0)
        self.txn, self.txn_dequeues = 0, []
        self.txn_parts.setdefault(number, [])
        self.enqueued(self.queue, marker)
        self.txn_pending += 1

    def _events_due(self) -> None:
        """Acquire and dequeue events ride with the next live enqueue, or go after EVENT_DELAY: at
        moderate rates that saves the backup a wakeup per event, and nothing waits on them."""
        if not self._events_timer:
            self._events_timer = True
            self.backup.call_later(EVENT_DELAY, self._events_timeout)

    def _events_timeout(self) -> None:
        self._events_timer = False
        if (self.dequeued_seqs or self.acquired_seqs or self.recounts) and not self.closed:
            self.backup.schedule(self)

    # -- sending -------------------------------------------------------------------------------
    def _send_live(self, credit: int) -> int:
        """Send the pending live enqueues, up to BATCH_BYTES of messages to a transfer (a message
        larger than that alone, as `E`), as far as `credit` goes; returns the credit used."""
        pending, link, deliveries, sent = self.pending, self.link, self.deliveries, self.sent
        stamp = int(time.time() * 1e6)
        now = time.monotonic()
        start, count, used = 0, len(pending), 0
        if self.txn_pending:
            return self._send_one_by_one(credit, stamp, now)
        while start < count and used < credit:
            entry = pending[start]
            size = len(entry.data)
            end = start + 1
            while end < count and size + len(pending[end].data) <= BATCH_BYTES:
                size += len(pending[end].data)
                end += 1
            if end - start == 1:
                seqs = [entry.seq]
                delivery = link.send(entry.data, tag=protocol.message_tag(protocol.ENQUEUE, entry.seq, stamp))
            else:
                batch = pending[start:end]
                seqs = [e.seq for e in batch]
                pieces = [e.data for e in batch]
                pieces.append(protocol.batch_index(seqs, [len(e.data) for e in batch]))
                delivery = link.send(pieces, tag=protocol.message_tag(protocol.BATCH, entry.seq, stamp))
            assert delivery is not None  # sent unsettled
            deliveries[delivery] = seqs
            sent.append((now, delivery, seqs))
            self.unconfirmed += len(seqs)
            used += 1
            start = end
        del pending[:start]
        return used

    def _send_one_by_one(self, credit: int, stamp: int, now: float) -> int:
        """The pending list holds a transaction's parts or marker: each entry its own transfer. A part is
        confirmed by its transaction's marker (its own settlement confirms nothing)."""
        pending, link, deliveries, sent = self.pending, self.link, self.deliveries, self.sent
        used = 0
        while used < min(credit, len(pending)):
            entry = pending[used]
            used += 1
            if entry.seq == 0:  # a commit marker
                number = int(protocol.decode_map(entry.data)["txn"])
                seqs = self.txn_parts.pop(number, [])
                tag = protocol.message_tag(protocol.COMMIT, number, stamp)
                self.txn_pending -= 1
            elif entry.seq in self.txn_seqs:
                seqs = []
                number = self.txn_seqs.pop(entry.seq)
                tag = protocol.message_tag(protocol.TXN_PART, entry.seq, number)
                self.txn_pending -= 1
            else:
                seqs = [entry.seq]
                tag = protocol.message_tag(protocol.ENQUEUE, entry.seq, stamp)
            delivery = link.send(entry.data, tag=tag)
            assert delivery is not None  # sent unsettled
            deliveries[delivery] = seqs
            sent.append((now, delivery, seqs))
            self.unconfirmed += len(seqs)
        del pending[:used]
        return used

    def dispatch(self) -> None:
        if self.closed:
            return
        link = self.link
        credit = link.credit()
        pending = self.pending
        if pending and credit:
            credit -= self._send_live(credit)
        limit = pending[0].seq if pending else None  # events only for messages the backup has been sent
        recounts = self.recounts
        if recounts and credit:
            counted = sorted((seq, count) for seq, count in recounts.items() if limit is None or seq < limit)
            if counted:
                link.send(protocol.encode_ranges(counted), settled=True,
                          tag=protocol.message_tag(protocol.REDELIVERED, 0, 0))
                credit -= 1
                for seq, _ in counted:
                    del recounts[seq]
        # acquisitions first: a message acquired and dequeued since the last dispatch must reach the backup
        # acquired, then dequeued, or its seq would stay in the backup's acquired set for good
        for kind, seqs in ((protocol.ACQUIRE, self.acquired_seqs), (protocol.DEQUEUE, self.dequeued_seqs)):
            if seqs and credit:
                now = [s for s in seqs if limit is None or s < limit]
                if now:
                    later = [s for s in seqs if limit is not None and s >= limit]
                    link.send(protocol.encode_ranges(seq_ranges(now)), settled=True,
                              tag=protocol.message_tag(kind, 0, 0))
                    credit -= 1
                    seqs[:] = later
        budget = min(credit, _CATCHUP_PER_PASS)
        catchup = self.catchup
        while budget and catchup:
            entry = catchup.pop()  # newest first
            if entry.state == DEQUEUED:
                continue
            link.send(entry.data, settled=True, tag=protocol.message_tag(protocol.CATCHUP, entry.seq, 0))
            budget -= 1
            credit -= 1
        if not catchup and not self.marker_sent and credit and not pending:
            self.marker_sent = True
            self.marker = link.send(b"", tag=protocol.message_tag(protocol.CAUGHT_UP, 0, 0))
        if catchup and credit:
            self.backup.schedule(self)  # more next pass, after IO

    # -- link events ---------------------------------------------------------------------------
    def on_credit(self) -> None:
        self.backup.schedule(self)

    def on_outcome(self, delivery: Any, outcome: int, failed: bool, undeliverable: bool) -> None:
        seqs = self.deliveries.pop(delivery, None)
        if seqs is not None and outcome != ACCEPTED:  # it does not hold them: not in sync any more
            self.backup.drop(f"it refused replicated messages of queue '{self.queue.name}' (outcome {outcome})")
            return
        if seqs is not None:
            self.unconfirmed -= len(seqs)
            self.backup.counters.confirmed += len(seqs)
            held, quorums = self.held, self.quorums
            for seq in seqs:
                completion = held.pop(seq, None)
                if completion is not None:
                    completion.release()
                if quorums is not None:
                    quorums.vote(self.queue, seq)
        elif self.marker_sent and not self.caught_up and delivery == self.marker:
            self.backup.context_changing()
            self.caught_up = True
            if self.quorums is not None:
                self.quorums.caught_up(self.queue, self.first_live)
            self.backup.caught_up(self)

    def overdue(self, timeout: float) -> bool:
        """Has a live enqueue waited longer than timeout for this backup's confirmation?"""
        oldest = self.oldest_unconfirmed()
        return oldest > 0.0 and time.monotonic() - oldest > timeout

    def oldest_unconfirmed(self) -> float:
        """When (monotonic) the oldest live transfer this backup has not confirmed yet was sent; 0.0: none."""
        sent, deliveries = self.sent, self.deliveries
        if not deliveries:
            sent.clear()
            return 0.0
        while sent and deliveries.get(sent[0][1]) is not sent[0][2]:
            sent.popleft()
        return sent[0][0] if sent else 0.0

    def on_detach(self) -> None:
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        if self.caught_up:
            self.backup.context_changing()
        self.closed = True
        queue = self.queue
        if self in queue.guards:
            queue.guards.remove(self)
        if self in queue.observers:
            queue.observers.remove(self)
        if self in queue.acquire_observers:
            queue.acquire_observers.remove(self)
        if self._recount_watcher in queue.recount_watchers:
            queue.recount_watchers.remove(self._recount_watcher)
        held, self.held = self.held, {}
        for completion in held.values():
            completion.release()
        self.backup.subscription_closed(self)
