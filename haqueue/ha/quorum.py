"""Sync modes (`ha.sync`, design/store.md): when a publish is confirmed, as in ActiveMQ's replicated store.

- `all` (the default): every subscribed backup has it in memory. Each ReplicatingSubscription holds
  the publisher's completion until its backup settles the live enqueue.
- `all_disk`: the same, but a backup settles only once its journal has the message on disk.
- `quorum_mem` / `quorum_disk`: a majority of the cluster, counting the primary, has it in memory /
  on disk. One `Quorums` guard per replicated queue holds the completion until enough backups have
  voted; a backup's subscriptions vote instead of holding.

Whatever the mode, the primary's own journal holds a durable message until it is on its disk (the
store's guard), and a message consumed before it was confirmed is confirmed (nothing left to protect).
"""
from __future__ import annotations

from ..broker.completion import Completion
from ..broker.queue import Entry, Queue
from ..config import SYNC_MODES

ALL, ALL_DISK, QUORUM_MEM, QUORUM_DISK = SYNC_MODES


def from_disk(mode: str) -> bool:
    """Do backups confirm a message only once their journal has it on disk?"""
    return mode in (ALL_DISK, QUORUM_DISK)


def is_quorum(mode: str) -> bool:
    return mode in (QUORUM_MEM, QUORUM_DISK)


class Quorum:
    """One publish waiting for votes: `needed` distinct backups."""

    __slots__ = ("completion", "voters")

    def __init__(self, completion: Completion) -> None:
        completion.hold()
        self.completion = completion
        self.voters: set[str] = set()


class Quorums:
    """The guard and observer of every message-replicated queue under a quorum mode."""

    def __init__(self, cluster_size: int) -> None:
        self.needed = cluster_size // 2  # a majority is size // 2 + 1, and the primary is one of them
        self.pending: dict[Queue, dict[int, Quorum]] = {}

    def guard(self, queue: Queue) -> None:
        if self.needed:
            queue.guards.append(self)
            queue.observers.append(self)

    def hold(self, queue: Queue, entry: Entry, completion: Completion) -> None:
        self.pending.setdefault(queue, {})[entry.seq] = Quorum(completion)

    def vote(self, queue: Queue, seq: int, backup: str) -> None:
        """`backup` has the message (it settled its live enqueue)."""
        pending = self.pending.get(queue)
        quorum = pending.get(seq) if pending else None
        if pending is not None and quorum is not None:
            quorum.voters.add(backup)
            if len(quorum.voters) >= self.needed:
                del pending[seq]
                quorum.completion.release()

    def caught_up(self, queue: Queue, backup: str, missing: set[int]) -> None:
        """`backup` holds every message of the queue but `missing` (a returning backup's catch-up): a vote
        for each, so publishes made while too few backups were there are confirmed once enough are back."""
        for seq in [s for s in self.pending.get(queue, ()) if s not in missing]:
            self.vote(queue, seq, backup)

    def status(self) -> dict[str, int]:
        return {"needed_backups": self.needed, "waiting": sum(len(p) for p in self.pending.values())}

    # -- queue observer: a consumed message needs no more copies --------------------------------
    def enqueued(self, queue: Queue, entry: Entry) -> None:
        pass

    def acquired(self, queue: Queue, entry: Entry) -> None:
        pass

    def dequeued(self, queue: Queue, entry: Entry) -> None:
        pending = self.pending.get(queue)
        quorum = pending.pop(entry.seq, None) if pending else None
        if quorum is not None:
            quorum.completion.release()
        if queue.deleted and not pending:
            self.pending.pop(queue, None)
