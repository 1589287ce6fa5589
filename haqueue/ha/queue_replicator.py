"""QueueReplicator: the backup's end of `$ha.queue/<name>`, mirroring one queue's messages and dequeues.

Live enqueues, one or a batch to a transfer, are appended (the primary's seqs kept) and the
transfer settled: that settlement is the backup's confirmation. Catch-up messages arrive newest
first; they are held aside and merged into the queue at their seq positions in one pass when the
caught-up marker arrives (or the link goes), so a 100k-message catch-up costs one sort of two
sorted runs rather than 100k list insertions.
"""
from __future__ import annotations

import bisect
from collections import deque
from typing import Any, Callable, Final, Protocol

from ..broker.completion import Completion
from ..broker.connection import Connection
from ..broker.message import expiry
from ..broker.proton_adapter import ACCEPTED, Link, LinkHandler
from ..broker.queue import Entry, Queue, seq_ranges
from ..broker.server import Durability
from . import protocol
from .adoption import Giver
from .quarantine import Quarantine
from .test_hooks import catchup_stop, replica_to_drop, stop_process
from .transaction_replicator import TransactionReplicator

# The link's first credit; the engine then sizes its window to the transfers' bytes (16 MiB of them, at
# most 2,000): credit for 2,000 messages of 1 MB let a primary copy 2 GB into proton for one backup.
_FIRST_CREDIT: Final = 10


class ReplicaHost(Protocol):
    """What a QueueReplicator needs of the backup that runs it (backup.Backup): it never imports the backup."""

    acquired: dict[str, set[int]]  # queue -> seqs a consumer held on the primary; outlives the link
    applied: int  # replication transfers applied
    from_disk: bool  # confirm from the journal's disk, not from memory
    transactions: TransactionReplicator
    quarantine: Quarantine  # keeps what the primary never had

    @property
    def replication_hooks(self) -> list[Callable[[Queue, bytes, int, int, bytes], None]]: ...

    @property
    def durability(self) -> Durability | None: ...

    def link_properties(self) -> dict[str, Any]:
        """What the backup says of itself on each link it attaches (its name, the highest epoch it has seen)."""

    def caught_up(self, replicator: QueueReplicator) -> None: ...

    def numbered_here(self, seq: int) -> bool:
        """Did this broker number the message itself, as the primary of its epoch?"""

    def replicator_refused(self, replicator: QueueReplicator, error: str) -> None: ...


class QueueReplicator(LinkHandler):
    def __init__(self, backup: ReplicaHost, queue: Queue, conn: Connection) -> None:
        self.backup = backup
        self.queue = queue
        self.catchup: dict[int, Entry] = {}  # received in catch-up, not merged yet
        # delivered to a consumer on the primary and not settled there; outlives this link
        self.acquired: set[int] = backup.acquired.setdefault(queue.name, set())
        self.caught_up = False
        self.received = {kind: 0 for kind in (protocol.ENQUEUE, protocol.CATCHUP, protocol.DEQUEUE,
                                              protocol.ACQUIRE, protocol.CAUGHT_UP, protocol.TXN_PART,
                                              protocol.COMMIT)}
        # The first and last seqs catch-up delivered, in arrival order: status shows it is newest first.
        self.catchup_first: list[int] = []
        self.catchup_last: deque[int] = deque(maxlen=5)
        self.hooks = backup.replication_hooks
        self.drop_at = replica_to_drop(queue.name)  # 0 unless a test planted a loss (test_hooks.py)
        self.stop_at = catchup_stop(queue.name)  # 0 unless a test holds the catch-up part way (test_hooks.py)
        have = seq_ranges(queue.live_seqs())  # paged ones included, without reading them back
        address = f"{protocol.QUEUE}/{queue.name}"
        self.link: Link = conn.open_link(False, address, address, self, credit=_FIRST_CREDIT, properties={
            **backup.link_properties(), protocol.UID: queue.uid, protocol.HAVE: protocol.flatten(have)})

    def on_message(self, delivery: Any, data: bytes, settled: bool) -> None:
        kind, seq, enqueued_us = protocol.read_tag(Link.tag(delivery))
        if kind == protocol.ENQUEUE or kind == protocol.BATCH:
            self._enqueue(delivery, [(seq, data)] if kind == protocol.ENQUEUE else protocol.unpack_batch(data),
                          enqueued_us, settled)
            return
        self.received[kind] = self.received.get(kind, 0) + 1
        self.backup.applied += 1
        if kind == protocol.TXN_PART:  # the tag's third field is the transaction's number
            self.backup.transactions.part(self, seq, enqueued_us, data, expiry(data))
        elif kind == protocol.COMMIT:  # settled once the whole transaction is applied
            self.backup.transactions.marker(self, delivery, seq, protocol.decode_map(data))
            return
        elif kind == protocol.CATCHUP:
            self.catchup[seq] = Entry(seq, data, expiry(data))
            if len(self.catchup_first) < 5:
                self.catchup_first.append(seq)
            self.catchup_last.append(seq)
            if self.received[kind] == self.stop_at:
                stop_process()
        elif kind == protocol.DEQUEUE:
            self.apply_dequeues(protocol.decode_ranges(data))
        elif kind == protocol.DIVERGED:
            self._diverged(protocol.decode_ranges(data))
        elif kind == protocol.ACQUIRE:
            for first, last in protocol.decode_ranges(data):
                self.acquired.update(range(first, last + 1))
        elif kind == protocol.REDELIVERED:  # each a failed delivery: that acquisition is over
            counts = dict(protocol.decode_ranges(data))
            self.queue.count_deliveries(counts)
            self.acquired.difference_update(counts)
        elif kind == protocol.CAUGHT_UP:
            self.merge()
            self.caught_up = True
            self.backup.caught_up(self)
            durability = self.backup.durability
            if self.backup.from_disk and durability is not None:  # the catch-up, merged, is on disk
                durability.after_sync(lambda: self.settle(delivery))
                return
        self._applied(kind, seq, enqueued_us, data)
        self.link.settle(delivery, 0 if settled else ACCEPTED)

    def _enqueue(self, delivery: Any, messages: list[tuple[int, bytes]], enqueued_us: int, settled: bool) -> None:
        """Live enqueues; the transfer is settled once they are in memory, or (from_disk) once the
        journal has the durable ones on disk."""
        before = self.received[protocol.ENQUEUE]
        self.received[protocol.ENQUEUE] += len(messages)
        self.backup.applied += len(messages)
        if self.drop_at and before < self.drop_at <= before + len(messages):
            del messages[self.drop_at - before - 1]
        completion = Completion(lambda: self.settle(delivery)) if self.backup.from_disk and not settled else None
        queue, hooks = self.queue, self.hooks
        for seq, data in messages:
            queue.enqueue(data, expiry(data), completion, seq=seq)
            for hook in hooks:
                hook(queue, protocol.ENQUEUE, seq, enqueued_us, data)
        if completion is not None:
            completion.release()
        else:
            self.link.settle(delivery, 0 if settled else ACCEPTED)

    def _applied(self, kind: bytes, seq: int, enqueued_us: int, data: bytes) -> None:
        if self.hooks and kind == protocol.CATCHUP:
            for hook in self.hooks:
                hook(self.queue, kind, seq, enqueued_us, data)

    def settle(self, delivery: Any) -> None:
        if not self.link.closed:
            self.link.settle(delivery, ACCEPTED)

    def _diverged(self, runs: list[tuple[int, int]]) -> None:
        """Messages this broker holds that the primary never had (cold: once at a rejoin). Those it received as a
        backup it gives the primary to adopt (adoption.py), each removed here once the primary's copy is safe;
        those it numbered itself, as a primary cut off from the cluster, it keeps aside."""
        own: list[tuple[int, int]] = []
        given: list[tuple[int, int]] = []
        for first, last in runs:
            while first <= last:  # a range may span epochs: split it at their bounds
                end = min(last, (((first >> protocol.EPOCH_SEQ_SHIFT) + 1) << protocol.EPOCH_SEQ_SHIFT) - 1)
                (own if self.backup.numbered_here(first) else given).append((first, end))
                first = end + 1
        if own:
            self.apply_dequeues(own, diverged=True)
        messages = self._held(given)
        if messages:
            Giver(self.link.conn, self.queue, messages, self.backup.link_properties(),
                  lambda seq: self.apply_dequeues([(seq, seq)]))

    def _held(self, runs: list[tuple[int, int]]) -> list[tuple[int, bytes]]:
        """(seq, message) of what this broker holds in these seq ranges; entries() reads paged messages back."""
        starts = [first for first, _ in runs]
        return [(e.seq, e.data) for e in [*self.queue.entries(), *self.catchup.values()]
                if (i := bisect.bisect_right(starts, e.seq) - 1) >= 0 and e.seq <= runs[i][1]]

    def apply_dequeues(self, runs: list[tuple[int, int]], diverged: bool = False) -> None:
        """Remove the messages of these seq ranges; `diverged`: the primary never had them, keep them aside first
        (they leave the queue only once their file is on disk)."""
        catchup = self.catchup
        if diverged:
            kept = self._held(runs)
            if kept:
                self.backup.quarantine.keep(self.queue.name, kept)
        for first, last in runs:
            # A range may be far wider than what is held (a returning backup's old seqs).
            seqs = range(first, last + 1) if last - first < len(catchup) else [s for s in catchup if first <= s <= last]
            gone = [(seq, entry.data) for seq in seqs if (entry := catchup.pop(seq, None)) is not None]
            gone += self.queue.dequeue_range(first, last)
            for seq, data in gone:
                self.acquired.discard(seq)
                for hook in self.hooks:  # the audit log: kept aside, or dequeued as the primary said
                    hook(self.queue, protocol.DIVERGED if diverged else protocol.DEQUEUE, seq, 0, data)

    def merge(self) -> None:
        if self.catchup:
            self.queue.merge(list(self.catchup.values()))
            self.catchup = {}

    def status(self) -> dict[str, Any]:
        return {"caught_up": self.caught_up, "depth": self.queue.depth,
                "catchup_received": self.received[protocol.CATCHUP], "catchup_first": self.catchup_first,
                "catchup_last": list(self.catchup_last), "acquired": len(self.acquired)}

    def on_detach(self) -> None:
        self.merge()
        error = self.link.remote_error()
        if error:
            self.backup.replicator_refused(self, error)

    def close(self) -> None:
        self.link.close()
