"""Queue: an ordered log of entries, each with a per-queue sequence number `seq`.

Consumers acquire entries (one holder at a time) and settle them; browsers read without
acquiring. Released entries go back to their place, ahead of newer ones. Observers (HA, the
audit log, a site mirror) are told of every enqueue and dequeue, acquire observers (HA's replicating
subscriptions) of every acquire; guards may hold a publisher's completion.

A consumer or browser may have a selector (selector.py): it is handed only the messages its selector
matches, and the others stay for other consumers, in order. Consumers without one share the queue's
cursor; each selector consumer has its own, and released messages behind it come back to it through
its own heap. Dispatch runs the plain loop while the queue has no selector consumer
(design/selectors.md).
"""
from __future__ import annotations

import heapq
import logging
import time
from typing import Any, Callable, Collection, Final, Iterable, Protocol

from mypy_extensions import trait

from .completion import Completion
from .flow import BLOCK, LOW_WATER, Blocker, MemoryAlarm, ceiling
from .message import annotated, delivery_count, is_durable, with_delivery_count
from .selector import MessageFields, Selector

log = logging.getLogger("haqueue.broker")

AVAILABLE: Final = 0
ACQUIRED: Final = 1
DEQUEUED: Final = 2
DEFERRED: Final = 3  # held back by a plug-in until a time (scheduled delivery): live, but no one is handed it
PURGE_BATCH: Final = 1000  # paged messages a purge reads back a turn, at most Pager.budget bytes of them


class Entry:
    __slots__ = ("seq", "data", "expiry", "state", "durable", "local")

    def __init__(self, seq: int, data: bytes, expiry: float, durable: bool = False) -> None:
        self.seq = seq
        self.data = data
        self.expiry = expiry  # monotonic deadline; 0.0: never expires
        self.state = AVAILABLE
        self.durable = durable  # a durable message on a queue a store journals: the journals hear of it
        self.local = False  # kept on this broker alone (the queue's keep_local): no guard holds it


def seq_ranges(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """Seqs as sorted (first, last) runs: how a batch of them is written and sent."""
    runs: list[tuple[int, int]] = []
    for seq in sorted(seqs):
        if runs and seq == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], seq)
        else:
            runs.append((seq, seq))
    return runs


# The log's searches by seq, written out: mypyc compiles them to native loops, where bisect's key= calls the key
# through the interpreter at every step (~1,000 instructions a search against ~100, under callgrind).
def _index_of(log: list[Entry], seq: int, lo: int) -> int:
    """bisect_left by seq from `lo`: the first index whose entry's seq is `seq` or above."""
    hi = len(log)
    while lo < hi:
        mid = (lo + hi) >> 1
        if log[mid].seq < seq:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _index_after(log: list[Entry], seq: int, lo: int) -> int:
    """bisect_right by seq from `lo`: the first index whose entry's seq is above `seq`."""
    hi = len(log)
    while lo < hi:
        mid = (lo + hi) >> 1
        if log[mid].seq <= seq:
            lo = mid + 1
        else:
            hi = mid
    return lo


# A released entry in a heap: (seq, push, entry). The queue numbers its pushes, so that two items of one
# entry (an entry may be released again before a heap it went to is rid of it) never compare their entries.
Returned = tuple[int, int, Entry]

# What the broker's completion_hooks are: called once a publisher's message on a queue is confirmed.
ConfirmHook = Callable[["Queue", Entry], None]

# A queue's annotated_hook: shown each entry with message annotations as it comes into memory (enqueued, read back,
# merged); `published` for a publisher's message enqueued here, which it may rewrite first (entry.data). It may
# defer the entry (Queue.defer). Plain messages, with no annotations, never reach it.
AnnotatedHook = Callable[["Queue", "Entry", bool], None]

# A queue's redelivery_hook: called when a failed delivery has raised an entry's delivery-count, before the entry
# is made available again; True if it took the entry instead (dequeued it: a plug-in's delivery limit).
RedeliveryHook = Callable[["Queue", Entry], bool]


# Messages a queue's selector consumers and browsers may look at in one dispatch pass (each costs a
# decode of its properties, once per pass, and an evaluation per selector); past it, the next pass goes on.
SCAN_BUDGET: Final = 2048


class Subscriber(Protocol):
    """A consumer or browser link end, as the queue sees it."""

    browse: bool
    cursor: int  # browsers and selector consumers: absolute log index of the next entry to look at
    selector: Selector | None  # only the messages it matches
    returned: list[Returned]  # a selector consumer's: entries released behind its cursor, by seq

    def credit(self) -> int: ...
    def deliver(self, entry: Entry) -> None: ...
    def after_dispatch(self) -> None: ...  # the queue has nothing more for it now
    def queue_deleted(self) -> None: ...


def _fields(views: dict[int, MessageFields], entry: Entry) -> MessageFields:
    """The entry's fields for selectors, decoded at most once a dispatch pass."""
    fields = views.get(entry.seq)
    if fields is None:
        fields = views[entry.seq] = MessageFields(entry.data)
    return fields


def _push_returned(heap: list[Returned], entry: Entry, push: int) -> None:
    """Add a released entry to a heap of them; one that grew large is rid of those no longer available."""
    heapq.heappush(heap, (entry.seq, push, entry))
    if len(heap) >= 1024 and not len(heap) & 1023:
        live = {item[0]: item for item in heap if item[2].state == AVAILABLE}
        heap[:] = sorted(live.values())  # a sorted list is a heap; seqs are unique in it now


class Pager(Protocol):
    """Keeps a queue's newest messages out of memory (a store's paging, design/store.md). What it holds is
    always newer than every entry in memory, and counts in the queue's depth."""

    count: int
    bytes: int  # message data it holds, out of memory or not
    budget: int  # bytes of message data a read-back brings into memory at most

    def page(self, entries: list[Entry]) -> int: ...  # take these, the newest (oldest first); bytes out of memory
    def can_page(self, entry: Entry) -> bool: ...  # can it be read back later (is it journalled)?
    def take(self, n: int, max_bytes: int = 0) -> tuple[list[Entry], int]: ...  # up to n of the oldest (and
    # with max_bytes, up to that much data, one at least); the bytes back in memory
    def peek(self) -> list[Entry]: ...  # every paged message as an entry, left paged (cold path)
    def paged_seqs(self) -> list[int]: ...
    def oldest(self) -> int: ...  # the seq of the oldest paged message (count > 0)
    def drop(self, first: int, last: int) -> list[tuple[int, int, int]]: ...  # (seq, size, size in memory) of each
    def clear(self) -> int: ...  # the queue is gone; the bytes it held in memory


DEPAGE_BELOW: Final = 1000  # entries in memory under which a paging queue reads the next paged ones back
DEPAGE_BATCH: Final = 1000
SWEEP_SLACK: Final = 4096  # dequeued entries the log may hold beyond twice its live ones before a sweep


class Guard(Protocol):
    """Consulted for each message enqueued on a queue it guards, but those kept local: holds its publisher's
    completion (HA: until the backups have it)."""

    def hold(self, queue: "Queue", entry: Entry, completion: Completion) -> None: ...


# The observers are traits, not Protocols: the compiled queue calls a trait's method through its vtable, and a
# Protocol's by looking it up by name and boxing its arguments, ~10x the instructions (under callgrind, ~300 a call
# against ~30), twice a message for each observer. So an observer is a compiled class (the audit's C recorder is
# wrapped in one: audit/queue_observer.py).
@trait
class QueueObserver:
    """Told of every enqueue and dequeue (HA's quorums and replicating subscriptions, the audit, a site mirror)."""

    def enqueued(self, queue: "Queue", entry: Entry) -> None:
        pass

    def dequeued(self, queue: "Queue", entry: Entry) -> None:
        pass


@trait
class AcquireObserver:
    """Told when a consumer takes a message; apart from QueueObserver, so that the many observers with nothing to
    do then cost no call per acquire."""

    def acquired(self, queue: "Queue", entry: Entry) -> None:
        pass


class Arranger(Protocol):
    """A plug-in's say in what a queue holds and which message a consumer gets next (messaging/: priority,
    groups, last value), on the queues whose arguments ask for one; the others have none and pay nothing.
    A queue with an arranger keeps every message in memory (never paged) and takes no selector consumers."""

    picks: bool  # chooses each consumer's next message (next, returned); else the queue's own order stands

    def entered(self, entries: list[Entry], published: bool) -> None: ...  # came into memory (published: here)
    def left(self, entry: Entry) -> None: ...  # dequeued
    def returned(self, entry: Entry) -> None: ...  # available again: released, or no longer deferred
    def next(self, consumer: Subscriber, now: float) -> Entry | None: ...  # to be acquired by the consumer
    def rebuild(self, entries: list[Entry]) -> None: ...  # every live entry, in seq order (after a merge)


class Journal(Protocol):
    """A store keeping this queue's durable messages: it hears of them, and only of them, so that a
    transient message costs it nothing. Its guard holds a durable publish until it is on disk."""

    @property
    def refusal(self) -> str | None: ...  # why durable messages are refused now (a full disk), or None

    def hold(self, queue: "Queue", entry: Entry, completion: Completion) -> None: ...
    def enqueued(self, queue: "Queue", entry: Entry) -> None: ...
    def dequeued(self, queue: "Queue", entry: Entry) -> None: ...
    def merged(self, queue: "Queue", entries: list[Entry]) -> None: ...  # a replica's catch-up, put in place
    def redelivered(self, queue: "Queue", entry: Entry) -> None: ...  # its delivery-count was raised


class Queue:
    kind = "queue"

    def __init__(self, name: str, args: dict[str, Any], uid: str,
                 schedule: Callable[["Queue"], None], memory: MemoryAlarm | None = None) -> None:
        self.name = name
        self.args = args
        self.uid = uid  # distinguishes a queue from an earlier one of the same name
        self.max_depth: int = int(args.get("max_depth", 0))
        self.max_bytes: int = int(args.get("max_bytes", 0))
        self.overflow: str = args.get("overflow", BLOCK)
        self._depth_ceiling = ceiling(self.max_depth)
        self._bytes_ceiling = ceiling(self.max_bytes)
        self.memory = memory or MemoryAlarm(0)  # the broker's; a queue made alone accounts for itself
        self.blocker = Blocker()  # publishers held until this queue drains (overflow: block)
        self.exclusive: bool = bool(args.get("exclusive", False))
        self.auto_delete: bool = bool(args.get("auto-delete", False))
        self.default_ttl: float = float(args.get("ttl", 0))
        self.dead_letter_address: str | None = args.get("dead_letter_address")
        self._schedule = schedule  # asks the broker to dispatch this queue at the end of the pass
        # The log holds entries in seq order; dequeued ones are dropped lazily from the front.
        self._log: list[Entry] = []
        self._base = 0  # absolute index of _log[0]
        self._head = 0  # index in _log of the first entry that may be live
        self._cursor = 0  # absolute index of the first entry never handed to a consumer
        self._returned: list[Returned] = []  # released entries, back in seq order
        self._pushes = 0  # items pushed on heaps of released entries
        self._sweep_due = False  # the log holds many dequeued entries behind a live one (_compact)
        self.next_seq = 1
        self.depth = 0
        self.bytes = 0  # message data held: the bytes of the live entries
        self.dropped = 0  # entries dropped to make room (overflow: drop-head)
        # Totals since start, read by management and metrics (design/metrics.md); depth = enqueued - dequeued.
        self.enqueued = 0  # messages that came in: published, replicated, recovered
        self.dequeued = 0  # messages that left, for any reason: consumed, expired, dropped, dead-lettered, purged
        self.expired = 0  # messages whose time to live ran out here
        self.dead_lettered = 0  # rejected messages sent on to the dead-letter address
        self.poisoned = 0  # messages a redelivery_hook took out after too many failed deliveries
        self.kept_local = 0  # messages keep_local kept on this broker alone
        self.expiring = 0  # entries with an expiry, so the TTL sweep can skip queues without
        self.consumers: list[Subscriber] = []
        self.browsers: list[Subscriber] = []
        self.selective = 0  # consumers with a selector: dispatch leaves the plain loop while there are any
        self.discard_unmatched = False  # one link's own subscription queue: what its selector skips is dropped
        # a selector consumer has acquired here: an acquired entry may lie ahead of the shared cursor, so a
        # release looks where it is (_return_selective) even once the selector consumers are gone
        self._scattered = False
        self._budget = 0  # what selector scans may still look at this pass (SCAN_BUDGET)
        self._rotation = 0
        self.observers: list[QueueObserver] = []
        self.acquire_observers: list[AcquireObserver] = []
        self.guards: list[Guard] = []
        self.journals: list[Journal] = []  # a store's, for the durable messages
        self.deleted = False
        self.temporary = False  # made for one link (dynamic or an exchange subscription); goes with it
        self.pager: Pager | None = None  # set by a store for a durable queue
        self.redelivery_hook: RedeliveryHook | None = None  # set by a plug-in (messaging/poison.py)
        # told when a message's delivery-count was raised (HA's subscriptions: the backups raise theirs)
        self.recount_watchers: list[Callable[[Queue, Entry], None]] = []
        self.annotated_hook: AnnotatedHook | None = None  # set by a plug-in (messaging/scheduled.py)
        self.arranger: Arranger | None = None  # set by a plug-in (messaging/: priority, groups, last value)
        self.deferred = 0  # entries held back until a time (scheduled delivery)
        # Which messages stay on this broker alone (HA's selective replication, set on a primary): the guards
        # pass them by, and HA's observers send them nowhere. None: every message is for the guards.
        self.keep_local: Callable[[bytes], bool] | None = None
        # Why no client may publish here now, or None (a plug-in's: a mirror queue on its standby, mirror/target.py).
        # Asked for what reaches the queue through an exchange, the anonymous relay or the broker's own messages;
        # a link to the queue itself is refused at attach (Broker.link_routes).
        self.publish_refusal: Callable[[], str | None] | None = None

    # -- enqueue -------------------------------------------------------------------------
    def fits(self, size: int) -> bool:
        """Whether a message of `size` bytes can be added within max_depth and max_bytes."""
        return self.depth < self._depth_ceiling and self.bytes + size <= self._bytes_ceiling

    def over_limit(self, size: int) -> str:
        """Why a message of `size` bytes does not fit, naming the queue and the limit."""
        if self.depth >= self._depth_ceiling:
            return f"queue '{self.name}' is full (max_depth {self.max_depth})"
        return f"queue '{self.name}' is full (max_bytes {self.max_bytes}: holds {self.bytes}, message of {size})"

    def drop_head(self, size: int, memory_alarm: bool) -> None:
        """Drop the oldest available entries until a message of `size` bytes fits (under the memory
        alarm: until as many bytes are freed) or none is left; acquired entries stay."""
        now = time.monotonic() if self.expiring else 0.0
        freed = 0
        while not self.fits(size) or (memory_alarm and freed < size):
            entry = self._next_available(now)
            if entry is None:
                return
            freed += len(entry.data)
            self.dequeue(entry)
            self.dropped += 1
            log.debug("queue %s: dropped message seq %d to make room (overflow drop-head)", self.name, entry.seq)

    def _grow(self, size: int) -> None:
        """Account `size` more bytes of message data, here and broker-wide."""
        self.bytes += size
        self._into_memory(size)

    def _out_of_memory(self, size: int) -> None:
        """`size` bytes of this queue's messages left memory (paged): still the queue's, not the broker's RAM."""
        memory = self.memory
        memory.used -= size
        if memory.on and memory.used < memory.low:
            memory.under()

    def _into_memory(self, size: int) -> None:
        memory = self.memory
        memory.used += size
        if memory.used >= memory.limit:
            memory.over()

    def _lift_drained(self) -> None:
        """Resume the publishers held on this queue once it is below the low-water mark of its limits."""
        if self.depth < self._depth_ceiling * LOW_WATER and self.bytes < self._bytes_ceiling * LOW_WATER:
            self.blocker.lift()

    def closed(self) -> str | None:
        """Why no client may publish here now (publish_refusal), or None."""
        return self.publish_refusal() if self.publish_refusal is not None else None

    def refusal(self, durable: bool) -> str | None:
        """Why a message cannot be taken now (a store that cannot write refuses durable ones), or None."""
        if durable:
            for journal in self.journals:
                if journal.refusal:
                    return f"queue '{self.name}': {journal.refusal}"
        return None

    def enqueue(self, data: bytes, expiry: float, completion: Completion | None = None, seq: int = 0,
                durable: bool | None = None) -> Entry:
        """Append a message; `seq` is given only by a replica, which keeps its primary's numbering.
        `durable`: whether it is a durable message, if the caller has read it already (else read here)."""
        if self.default_ttl and not expiry:
            expiry = time.monotonic() + self.default_ttl
        if seq:
            self.next_seq = max(self.next_seq, seq)
        durable = bool(self.journals) and (is_durable(data) if durable is None else durable)
        entry = Entry(self.next_seq, data, expiry, durable)
        if self.keep_local is not None and self.keep_local(data):
            entry.local = True
            self.kept_local += 1
        self.next_seq += 1
        self.enqueued += 1
        paging = self.pager is not None and self.pager.count > 0
        if self.annotated_hook is not None and annotated(data):
            self.annotated_hook(self, entry, not seq)  # a paged entry is shown again when it is read back
            if paging and entry.state == DEFERRED:
                self._undefer_paged(entry)
            data = entry.data
        if not paging:
            self._log.append(entry)
        self.depth += 1
        size = len(data)  # _grow, inline: the hot path
        self.bytes += size
        memory = self.memory
        memory.used += size
        if memory.used >= memory.limit:
            memory.over()
        if expiry:
            self.expiring += 1
        if completion is not None and not entry.local:
            for guard in self.guards:
                guard.hold(self, entry, completion)
        if durable:
            for journal in self.journals:
                if completion is not None:
                    journal.hold(self, entry, completion)
                journal.enqueued(self, entry)
        for observer in self.observers:
            observer.enqueued(self, entry)
        if self.arranger is not None:
            self.arranger.entered([entry], not seq)
            if self._many_dequeued():
                self._sweep()
        if paging:  # behind what is paged already, so the order holds
            self._out_of_memory(self.pager.page([entry]))  # type: ignore[union-attr]
        if self.consumers or self.browsers:
            self._schedule(self)
        return entry

    def journal(self, entry: Entry) -> None:
        """A replica's entry enqueued as not durable for now (part of a transaction not yet complete here)
        is journalled now, if it is a durable message and still here."""
        if self.journals and not entry.durable and entry.state != DEQUEUED and is_durable(entry.data):
            entry.durable = True
            for journal in self.journals:
                journal.enqueued(self, entry)

    # -- settlement ------------------------------------------------------------------------
    def dequeue(self, entry: Entry) -> None:
        state = entry.state
        if state == DEQUEUED:
            return
        entry.state = DEQUEUED
        if state == DEFERRED:
            self.deferred -= 1
        self.depth -= 1
        self.dequeued += 1
        size = len(entry.data)
        self.bytes -= size
        memory = self.memory
        memory.used -= size
        if memory.on and memory.used < memory.low:
            memory.under()
        if self.blocker.held:
            self._lift_drained()
        if entry.expiry:
            self.expiring -= 1
        if entry.durable:
            for journal in self.journals:
                journal.dequeued(self, entry)
        for observer in self.observers:
            observer.dequeued(self, entry)
        if self.arranger is not None:
            self.arranger.left(entry)
        self._compact()

    def release(self, entry: Entry, failed: bool = False) -> None:
        """Make an acquired entry available again at its place; a failed delivery raises its delivery-count."""
        if entry.state != ACQUIRED:
            return
        if failed:
            self._raise_delivery_count(entry)
            hook = self.redelivery_hook
            if hook is not None and hook(self, entry):
                return
        self._make_available(entry)

    def _make_available(self, entry: Entry) -> None:
        """An acquired or deferred entry goes back to its place among the available ones."""
        entry.state = AVAILABLE
        arranger = self.arranger
        if arranger is not None and arranger.picks:
            arranger.returned(entry)
        else:
            self._pushes += 1
            if self._scattered:
                self._return_selective(entry)
            else:
                heapq.heappush(self._returned, (entry.seq, self._pushes, entry))
        self._schedule(self)

    # -- deferral (scheduled delivery, messaging/scheduled.py) ----------------------------------
    def defer(self, entry: Entry) -> None:
        """Hold an available entry back: live (counted, replicated, journalled) but handed to no one until
        `undefer`. The plug-in that defers keeps the time."""
        if entry.state == AVAILABLE:
            entry.state = DEFERRED
            self.deferred += 1

    def undefer(self, entry: Entry) -> None:
        """A deferred entry's time has come: available again at its place."""
        if entry.state == DEFERRED:
            self.deferred -= 1
            self._make_available(entry)

    def _undefer_paged(self, entry: Entry) -> None:
        """An entry deferred as it goes to the pager: it is shown to the hook again when read back."""
        entry.state = AVAILABLE
        self.deferred -= 1

    def _annotated(self, entries: list[Entry]) -> None:
        """Entries that came into memory other than by enqueue (read back from the pager, merged), shown to
        the annotated_hook as a replica's message is."""
        hook = self.annotated_hook
        if hook is not None:
            for entry in entries:
                if annotated(entry.data):
                    hook(self, entry, False)

    def _return_selective(self, entry: Entry) -> None:
        """A released entry on a queue selector consumers took from: it goes back to whoever's cursor has
        passed it (consumers without a selector share the queue's); one ahead of a cursor is found there."""
        position = self._base + _index_of(self._log, entry.seq, self._head)
        push = self._pushes
        if position < self._cursor:
            _push_returned(self._returned, entry, push)
        for consumer in self.consumers:
            if consumer.selector is not None and position < consumer.cursor:
                _push_returned(consumer.returned, entry, push)

    def _raise_delivery_count(self, entry: Entry) -> None:
        self._set_delivery_count(entry, delivery_count(entry.data) + 1)

    def _set_delivery_count(self, entry: Entry, count: int) -> None:
        data = with_delivery_count(entry.data, count)
        self._grow(len(data) - len(entry.data))  # a delivery-count may add a header
        entry.data = data
        if entry.durable:
            for journal in self.journals:
                journal.redelivered(self, entry)
        for watcher in self.recount_watchers:
            watcher(self, entry)

    # -- dispatch --------------------------------------------------------------------------
    def _next_available(self, now: float) -> Entry | None:
        returned = self._returned
        while returned:
            entry = heapq.heappop(returned)[2]
            if entry.state == AVAILABLE and not self._expired(entry, now):
                return entry
        log = self._log
        i = max(self._cursor - self._base, 0)
        n = len(log)
        while i < n:
            entry = log[i]
            i += 1
            if entry.state == AVAILABLE:
                if entry.expiry and entry.expiry <= now:
                    i = max(i - self._drop_expired(entry), 0)
                    n = len(log)
                    continue
                self._cursor = self._base + i
                return entry
        self._cursor = self._base + n
        return None

    def _expired(self, entry: Entry, now: float) -> bool:
        if entry.expiry and entry.expiry <= now:
            self.expired += 1
            self.dequeue(entry)
            return True
        return False

    def _drop(self, entry: Entry) -> int:
        """Dequeue an entry met by a scan of the log (expired, or unmatched on a selector's own subscription);
        how many entries that dropped from the log's front (dequeue compacts it): the scan's index moves back
        as many."""
        base = self._base
        self.dequeue(entry)
        return self._base - base

    def _drop_expired(self, entry: Entry) -> int:
        self.expired += 1
        return self._drop(entry)

    def dispatch(self) -> None:
        """Hand available entries to consumers with credit (round robin), then feed browsers."""
        if self._sweep_due:
            self._sweep_due = False
            self._sweep()
        pager = self.pager
        # stalled: nothing came back, the oldest paged one is not on disk yet (the store dispatches again once it is)
        stalled = False
        if pager is not None and self._short_in_memory(pager):
            stalled = not self._depage(DEPAGE_BATCH, pager.budget)
        now = time.monotonic() if self.expiring else 0.0
        consumers = self.consumers
        self._budget = SCAN_BUDGET
        views: dict[int, MessageFields] = {}  # each message's fields, decoded once this pass for every selector
        if consumers and (self.selective or (self.arranger is not None and self.arranger.picks)):
            self._dispatch_selective(now, views)
        elif consumers:
            exhausted = True
            if self.depth:
                credits = [c.credit() for c in consumers]
                n = len(consumers)
                remaining = sum(credits)
                i = self._rotation % n
                while remaining:
                    while not credits[i]:
                        i = (i + 1) % n
                    entry = self._next_available(now)
                    if entry is None:
                        break
                    entry.state = ACQUIRED
                    for observer in self.acquire_observers:
                        observer.acquired(self, entry)
                    credits[i] -= 1
                    remaining -= 1
                    consumers[i].deliver(entry)
                    i = (i + 1) % n
                else:
                    exhausted = False
                self._rotation = i
            if exhausted and pager is not None and pager.count:
                # credit is left and more is paged: read the next ones back now, even with enough in memory
                # (_short_in_memory) when consumers hold them all, for the next pass to hand out. None came back
                # (stalled): the store dispatches again once the oldest paged one is on disk. A drain waits.
                if not stalled and self._depage(DEPAGE_BATCH, pager.budget):
                    self._schedule(self)
            elif exhausted:  # nothing left to send: answer any drain request
                for consumer in consumers:
                    consumer.after_dispatch()
        for browser in self.browsers:
            self._browse(browser, now, views)
        if self._budget <= 0:  # a selector's scan stopped short: go on next pass
            self._schedule(self)

    def _dispatch_selective(self, now: float, views: dict[int, MessageFields]) -> None:
        """Round robin as in dispatch, each consumer handed the next entry it may take: on a queue whose arranger
        picks, what it picks for the consumer (a message group may be held for another); else a consumer without
        a selector the next available one, a selector consumer the next it matches, from its own cursor.
        A consumer that finds nothing is done for this pass (and told, for a drain); one that ran out of
        the pass's budget is not: the next pass goes on from its cursor."""
        consumers = self.consumers
        arranger = self.arranger if self.arranger is not None and self.arranger.picks else None
        n = len(consumers)
        credits = [c.credit() for c in consumers]
        dry = [False] * n
        remaining = sum(credits)
        i = self._rotation % n
        while remaining:
            while not credits[i]:
                i = (i + 1) % n
            consumer = consumers[i]
            selector = consumer.selector
            if arranger is not None:  # it takes no selector consumers
                entry = arranger.next(consumer, now)
            elif selector is None:
                entry = self._next_available(now)
            else:
                entry = self._next_match(consumer, selector, now, views) if self._budget > 0 else None
                self._scattered = True
            if entry is None:
                dry[i] = selector is None or self._budget > 0
                remaining -= credits[i]
                credits[i] = 0
            else:
                entry.state = ACQUIRED
                for observer in self.acquire_observers:
                    observer.acquired(self, entry)
                credits[i] -= 1
                remaining -= 1
                consumer.deliver(entry)
            i = (i + 1) % n
        self._rotation = i
        for k in range(n):
            if dry[k]:
                consumers[k].after_dispatch()

    def first_available(self, heap: list[Returned], now: float) -> Entry | None:
        """For an arranger: the oldest available entry in one of its heaps, left there; those no longer
        available are dropped from the heap on the way, an expired one dequeued."""
        while heap:
            entry = heap[0][2]
            if entry.state == AVAILABLE and not (entry.expiry and entry.expiry <= now):
                return entry
            heapq.heappop(heap)  # off the heap before an expired one leaves: its leaving may rebuild the heap
            if entry.state == AVAILABLE:
                self._drop_expired(entry)
        return None

    def _next_match(self, consumer: Subscriber, selector: Selector, now: float,
                    views: dict[int, MessageFields]) -> Entry | None:
        """The oldest available entry this selector consumer matches: first among those released behind its
        cursor, then from the cursor on (which moves past everything it looks at: an entry it does not
        match now it never will, unless released again). Each look costs the pass's budget."""
        returned = consumer.returned
        while returned:
            entry = heapq.heappop(returned)[2]
            if entry.state == AVAILABLE and not self._expired(entry, now) \
                    and selector.matches(_fields(views, entry)):
                return entry
        log = self._log
        i = max(consumer.cursor - self._base, self._head)
        n = len(log)
        budget = self._budget
        found: Entry | None = None
        while True:
            while i < n and budget > 0:
                entry = log[i]
                i += 1
                if entry.state != AVAILABLE:
                    continue
                budget -= 1
                if entry.expiry and entry.expiry <= now:
                    i = max(i - self._drop_expired(entry), 0)
                    n = len(log)
                    continue
                if selector.matches(_fields(views, entry)):
                    found = entry
                    break
                if self.discard_unmatched:
                    i = max(i - self._drop(entry), 0)
                    n = len(log)
            if found is not None or i < n or budget <= 0 or not self._more_paged():
                break
            n = len(log)
        self._budget = budget
        consumer.cursor = self._base + i
        return found

    def _browse(self, browser: Subscriber, now: float, views: dict[int, MessageFields]) -> None:
        credit = browser.credit()
        selector = browser.selector
        log = self._log
        i = max(browser.cursor - self._base, 0)
        n = len(log)
        paged = False
        while credit:
            if i >= n:
                if paged or not self._more_paged():
                    break
                paged = True  # one batch a pass for a browser: the next pass goes on
                n = len(log)
                continue
            entry = log[i]
            i += 1
            if entry.state >= DEQUEUED:  # or deferred: browsers see a scheduled message once it is due
                continue
            if entry.expiry and entry.expiry <= now:
                i = max(i - self._drop_expired(entry), 0)
                n = len(log)
                continue
            if selector is not None:
                if self._budget <= 0:
                    i -= 1
                    break
                self._budget -= 1
                if not selector.matches(_fields(views, entry)):
                    continue
            browser.deliver(entry)
            credit -= 1
        browser.cursor = self._base + i
        if i >= n and not (self.pager is not None and self.pager.count):
            browser.after_dispatch()
        elif paged and credit:
            self._schedule(self)

    def _more_paged(self) -> bool:
        """A browser or a selector consumer reached the end of what is in memory with credit left: the next
        paged messages come back into memory (as a consumer's would), if any are paged."""
        pager = self.pager
        if pager is None or not pager.count:
            return False
        self._depage(DEPAGE_BATCH, pager.budget)
        return True

    def expire(self) -> None:
        """Drop expired entries that no consumer has looked at (called by a periodic sweep)."""
        if not self.expiring:
            return
        now = time.monotonic()
        for entry in self._log:
            if entry.state == AVAILABLE and entry.expiry and entry.expiry <= now:
                self.expired += 1
                self.dequeue(entry)

    def _compact(self) -> None:
        log = self._log
        head = self._head
        n = len(log)
        while head < n and log[head].state == DEQUEUED:
            head += 1
        if head >= 1024 or head == n:  # drop the dequeued prefix in batches, not per entry
            del log[:head]
            self._base += head
            head = 0
        self._head = head
        if not self._sweep_due and self._many_dequeued():
            # A message held at the front (a consumer that never settles) would keep every dequeued one behind it
            # in memory: they are swept out at the next dispatch, never in the middle of a scan of the log.
            self._sweep_due = True
            self._schedule(self)

    def _many_dequeued(self) -> bool:
        """The log holds more than SWEEP_SLACK dequeued entries beyond twice its live ones in memory (depth
        counts the paged ones too): time for a sweep."""
        pager = self.pager
        live = self.depth - pager.count if pager is not None else self.depth
        return len(self._log) - self._head > 2 * live + SWEEP_SLACK

    def _sweep(self) -> None:
        """Drop the dequeued entries from anywhere in the log, not only its front: an arranger's queue dequeues
        out of log order, and one old message at the front would keep every later dequeued one. Cursors keep
        their place by the seq they point at. Never called during a scan of the log: from an arranger's enqueue, or as
        a dispatch starts (_compact asks for it there)."""
        log, head = self._log, self._head
        live = [e for e in log[head:] if e.state != DEQUEUED]

        def moved(cursor: int) -> int:
            i = cursor - self._base
            if i <= head:
                return self._base
            if i >= len(log):
                return self._base + len(live)
            return self._base + _index_of(live, log[i].seq, 0)
        self._cursor = moved(self._cursor)
        for subscriber in self.browsers + [c for c in self.consumers if c.selector is not None]:
            subscriber.cursor = moved(subscriber.cursor)
        self._log = live
        self._head = 0

    # -- subscribers -----------------------------------------------------------------------
    def subscribe(self, subscriber: Subscriber) -> None:
        if subscriber.browse:
            subscriber.cursor = self._base
            self.browsers.append(subscriber)
        else:
            if subscriber.selector is not None:
                subscriber.cursor = self._base + self._head
                subscriber.returned = []
                self.selective += 1
            self.consumers.append(subscriber)
        self._schedule(self)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        group = self.browsers if subscriber.browse else self.consumers
        if subscriber in group:
            group.remove(subscriber)
            if not subscriber.browse and subscriber.selector is not None:
                self.selective -= 1

    # -- paging ----------------------------------------------------------------------------
    def page_out(self, wanted: int) -> int:
        """Hand up to `wanted` of the newest entries to the pager; how many went. Only entries no consumer
        or browser has reached, and only into an empty pager, so that it always holds the newest."""
        pager = self.pager
        if pager is None or pager.count or self.arranger is not None:
            return 0
        log = self._log
        floor = max([self._head, self._cursor - self._base] + [b.cursor - self._base for b in self.browsers]
                    + [c.cursor - self._base for c in self.consumers if c.selector is not None])
        taken: list[Entry] = []
        while len(taken) < wanted and len(log) > floor and log[-1].state == AVAILABLE and pager.can_page(log[-1]):
            taken.append(log.pop())
        if taken:
            taken.reverse()
            self._out_of_memory(pager.page(taken))
        return len(taken)

    def count_paged(self) -> None:
        """Add what a store's recovery gave the pager directly (never in memory) to depth and bytes."""
        if self.pager is not None:
            self.depth += self.pager.count
            self.enqueued += self.pager.count
            self.bytes += self.pager.bytes
            if self.arranger is not None and self.pager.count:  # an arranger's queue is held in memory
                self._depage(self.pager.count)

    def _short_in_memory(self, pager: Pager) -> bool:
        """More is paged and fewer than DEPAGE_BELOW are in memory: dispatch reads the next ones back."""
        return pager.count > 0 and self.depth - pager.count < DEPAGE_BELOW

    def _depage(self, n: int, max_bytes: int = 0) -> int:
        """Read back up to n of the paged messages (and up to max_bytes of data); how many came."""
        entries, size = self.pager.take(n, max_bytes)  # type: ignore[union-attr]
        self._mark_local(entries)
        self._log.extend(entries)
        self._into_memory(size)
        self._annotated(entries)
        if self.arranger is not None:
            self.arranger.entered(entries, False)
        return len(entries)

    # -- a replica's view: by seq ------------------------------------------------------------
    def live_seqs(self) -> list[int]:
        """The seq of every live message, paged ones included, in order (cold path)."""
        seqs = [e.seq for e in self._log if e.state != DEQUEUED]
        if self.pager is not None and self.pager.count:
            seqs += self.pager.paged_seqs()
        return seqs

    def find(self, seq: int) -> Entry | None:
        """The live entry in memory with this seq, if any."""
        log = self._log
        i = _index_of(log, seq, self._head)
        return log[i] if i < len(log) and log[i].seq == seq and log[i].state != DEQUEUED else None

    def read_after(self, seq: int, n: int, page_in: bool = True) -> list[Entry]:
        """Up to n live messages with a seq above `seq`, in seq order, acquired, deferred or not, none taken: for a
        reader that keeps its own place by seq and is no subscriber (a site mirror reading what the queue holds at
        its own pace), so that dispatch never hands it anything. Reaching the end of what is in memory, it reads
        the next paged ones back (one batch a call, as a browser's pass does), unless not `page_in`."""
        log = self._log
        i = _index_after(log, seq, self._head)
        found: list[Entry] = []
        paged = not page_in
        while len(found) < n:
            if i >= len(log):
                if paged or not self._more_paged():
                    break
                paged = True
                i = _index_after(log, seq, i)  # what came back, past `seq`
                continue
            entry = log[i]
            i += 1
            if entry.state != DEQUEUED:
                found.append(entry)
        return found

    def dequeue_range(self, first: int, last: int) -> list[tuple[int, bytes]]:
        """Dequeue every live message whose seq is in [first, last], in memory or paged (a replica applying
        its primary's dequeues); the seq and bytes of each (no bytes for a paged one). The log is in seq
        order, so a range far wider than the queue costs a search, not a scan."""
        log = self._log
        i = _index_of(log, first, self._head)
        found = []
        while i < len(log) and log[i].seq <= last:
            if log[i].state != DEQUEUED:
                found.append(log[i])
            i += 1
        gone = [(e.seq, e.data) for e in found]
        for entry in found:
            self.dequeue(entry)
        if self.pager is not None and self.pager.count:
            for seq, size, in_memory in self.pager.drop(first, last):
                self.depth -= 1
                self.dequeued += 1
                self.bytes -= size
                self._out_of_memory(in_memory)
                gone.append((seq, b""))
        return gone

    def redeliver(self, seqs: set[int]) -> None:
        """Raise the delivery-count of these messages (held by a consumer elsewhere: a replica promoted)."""
        for entry in self._live(seqs):
            self._raise_delivery_count(entry)

    def count_deliveries(self, counts: dict[int, int]) -> None:
        """Raise these messages' delivery-counts to these (a replica: what failed deliveries on its primary
        raised them to); a count no higher than the message's is left."""
        for entry in self._live(counts):
            if counts[entry.seq] > delivery_count(entry.data):
                self._set_delivery_count(entry, counts[entry.seq])

    def _live(self, seqs: Collection[int]) -> list[Entry]:
        """The live entries of these seqs. Those paged are read back first, up to the newest of them: the count
        is in a message's bytes."""
        pager = self.pager
        if seqs and pager is not None and pager.count:
            newest = max(seqs)
            paged = sum(1 for seq in pager.paged_seqs() if seq <= newest)
            if paged:
                self._depage(paged)
        return [entry for seq in seqs if (entry := self.find(seq)) is not None]

    def merge(self, entries: list[Entry]) -> None:
        """Put entries made elsewhere (a replica's catch-up) at their seq positions, in one pass.

        Only for a queue nobody consumes from yet: consumer and browser positions start over. What is
        paged comes back into memory first if the catch-up is newer than some of it."""
        pager = self.pager
        if entries and pager is not None and pager.count and max(e.seq for e in entries) > pager.paged_seqs()[0]:
            self._depage(pager.count)
            if pager.count:
                log.warning("queue %s: %d paged messages not yet on disk stay paged behind a catch-up merge",
                            self.name, pager.count)
        live = [e for e in self._log[self._head:] if e.state != DEQUEUED]
        added = [e for e in entries if e.state != DEQUEUED]
        self._base += len(self._log)
        self._log = sorted(live + added, key=lambda e: e.seq)  # two sorted runs: linear
        self._head = 0
        self._cursor = self._base
        self._returned = []
        self.depth += len(added)
        self.enqueued += len(added)
        self._grow(sum(len(e.data) for e in added))
        self.expiring += sum(1 for e in added if e.expiry)
        if self._log:
            self.next_seq = max(self.next_seq, self._log[-1].seq + 1)
        self._annotated(added)
        if self.arranger is not None:
            self.arranger.rebuild(self._log)
        if self.journals:
            durable = [e for e in added if is_durable(e.data)]
            for entry in durable:
                entry.durable = True
            for journal in self.journals:
                journal.merged(self, durable)

    def entries(self) -> list[Entry]:
        """Live entries in seq order, paged ones read back as copies (cold path: management, HA catch-up)."""
        live = [e for e in self._log if e.state != DEQUEUED]
        if self.pager is not None and self.pager.count:
            paged = self.pager.peek()
            self._mark_local(paged)
            live += paged
        return live

    def keep_local_where(self, test: Callable[[bytes], bool]) -> None:
        """From now on `test` tells which messages stay on this broker alone; those here already (recovered,
        replicated) are judged too."""
        self.keep_local = test
        self._mark_local(self._log[self._head:])

    def _mark_local(self, entries: list[Entry]) -> None:
        """Entries made from stored bytes (recovered, read back from the pager) by keep_local."""
        test = self.keep_local
        if test is not None:
            for entry in entries:
                entry.local = test(entry.data)

    def purge(self) -> None:
        for entry in self.entries():
            self.dequeue(entry)

    def purge_available(self, upto: int) -> tuple[int, bool]:
        """A turn of management's PURGE: drop the messages up to seq `upto` that no consumer holds, as consumed
        ones leave (journalled and replicated dequeues); acquired ones stay until their consumer settles them.
        Paged messages are read back PURGE_BATCH a turn, so a purge of a queue larger than memory never holds
        it all in memory, nor the loop for long. (How many went, whether nothing is left to read back.)"""
        gone = [e for e in self._log[self._head:] if e.seq <= upto and (e.state == AVAILABLE or e.state == DEFERRED)]
        for entry in gone:
            self.dequeue(entry)
        pager = self.pager
        more = pager is not None and pager.count > 0 and pager.oldest() <= upto
        if more:
            self._depage(PURGE_BATCH, pager.budget)  # type: ignore[union-attr]
        return len(gone), not more

    def first(self, n: int) -> list[Entry]:
        """The first `n` live messages in seq order, taken or not (management's PEEK: a look that takes nothing);
        paged ones are read back as copies only if fewer are in memory."""
        found: list[Entry] = []
        log, i = self._log, self._head
        while i < len(log) and len(found) < n:
            if log[i].state != DEQUEUED:
                found.append(log[i])
            i += 1
        if len(found) < n and self.pager is not None and self.pager.count:
            found += self.pager.peek()[:n - len(found)]
        return found

    def delete(self) -> None:
        """Deleted by an admin or its owner: drop the messages, detach the subscribers."""
        self.deleted = True
        for subscriber in self.consumers + self.browsers:
            subscriber.queue_deleted()
        self.consumers, self.browsers = [], []
        self.selective = 0
        if self.pager is not None and self.pager.count:
            self.depth -= self.pager.count
            self.bytes -= self.pager.bytes
            self._out_of_memory(self.pager.clear())
        self.purge()

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "depth": self.depth, "bytes": self.bytes, "dropped": self.dropped,
                "enqueued": self.enqueued, "dequeued": self.dequeued, "expired": self.expired,
                "dead_lettered": self.dead_lettered, "poisoned": self.poisoned, "scheduled": self.deferred,
                "kept_local": self.kept_local,
                "consumers": len(self.consumers) + len(self.browsers), "temporary": self.temporary, "args": dict(self.args)}
