"""TransactionReplicator: the backup's side of a transaction's commit (design/transactions.md).

A commit arrives in parts, one per queue it touches, each on that queue's replication link: its
enqueues (`T`), put in the queue at once to keep the queue's order but not journalled, then a marker
(`K`) naming every queue of the commit and carrying this queue's dequeues. Once every queue's marker
is in, the commit is applied as one: the enqueues journalled and the dequeues applied in one atomic
group of the store, and the markers settled (after the group is on disk when the sync mode confirms
from disk). A commit that never completes here (the primary died, or the link to it broke) is
dropped whole: a promoted backup never serves part of a transaction, and a backup that reconnects
is sent again, as ordinary messages, what the primary did commit.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, ContextManager, Protocol

from ..broker.queue import Entry, Queue, seq_ranges
from ..broker.server import Durability
from . import protocol

log = logging.getLogger("haqueue.ha.transactions")


class CommitHost(Protocol):
    """What the TransactionReplicator needs of the backup that runs it (backup.Backup): it never imports the
    backup."""

    from_disk: bool  # settle from the journal's disk, not from memory

    @property
    def replication_hooks(self) -> list[Callable[[Queue, bytes, int, int, bytes], None]]: ...

    @property
    def durability(self) -> Durability | None: ...

    def atomically(self) -> ContextManager[None]:
        """What is journalled within is recovered whole or not at all."""


class ReplicaLink(Protocol):
    """What it uses of a queue's replication link (queue_replicator.QueueReplicator): its queue, applying the
    commit's dequeues there, and settling the commit's marker."""

    queue: Queue

    def apply_dequeues(self, runs: list[tuple[int, int]]) -> None: ...

    def settle(self, delivery: Any) -> None: ...


class _Commit:
    __slots__ = ("expected", "arrived", "entries", "dequeues", "markers")

    def __init__(self) -> None:
        self.expected: set[str] | None = None  # every queue of the commit, as its first marker says
        self.arrived: set[str] = set()
        self.entries: list[tuple[Queue, Entry]] = []
        self.dequeues: list[tuple[ReplicaLink, list[int]]] = []
        self.markers: list[tuple[ReplicaLink, Any]] = []  # to settle once it is applied


class TransactionReplicator:
    def __init__(self, backup: CommitHost) -> None:
        self.backup = backup
        self.commits: dict[int, _Commit] = {}  # by the primary's transaction number

    def part(self, replicator: ReplicaLink, seq: int, number: int, data: bytes, expiry: float) -> None:
        entry = replicator.queue.enqueue(data, expiry, seq=seq, durable=False)
        self.commits.setdefault(number, _Commit()).entries.append((replicator.queue, entry))

    def marker(self, replicator: ReplicaLink, delivery: Any, number: int, body: dict[str, Any]) -> None:
        commit = self.commits.setdefault(number, _Commit())
        if commit.expected is None:
            commit.expected = set(body.get("queues") or ())
        commit.arrived.add(replicator.queue.name)
        commit.dequeues.append((replicator, [int(s) for s in body.get("dequeues") or ()]))
        commit.markers.append((replicator, delivery))
        if commit.arrived >= commit.expected:
            self._apply(self.commits.pop(number))

    def _apply(self, commit: _Commit) -> None:
        with self.backup.atomically():
            for queue, entry in commit.entries:
                queue.journal(entry)
            for replicator, seqs in commit.dequeues:
                replicator.apply_dequeues(seq_ranges(seqs))
        for queue, entry in commit.entries:
            for hook in self.backup.replication_hooks:
                hook(queue, protocol.ENQUEUE, entry.seq, 0, entry.data)

        def settle() -> None:
            for replicator, delivery in commit.markers:
                replicator.settle(delivery)
        durability = self.backup.durability
        if self.backup.from_disk and durability is not None:
            durability.after_sync(settle)
        else:
            settle()

    def drop_incomplete(self) -> None:
        """The primary that sent these parts is gone (or the link to it): none of them is committed here."""
        for number, commit in self.commits.items():
            log.info("transaction %d of the old primary dropped: %d of %s queues' parts arrived", number,
                     len(commit.arrived), len(commit.expected) if commit.expected is not None else "its")
            for queue, entry in commit.entries:
                queue.dequeue(entry)
        self.commits.clear()
