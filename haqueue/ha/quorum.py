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

from typing import Final

from ..broker.completion import Completion
from ..broker.queue import Entry, Queue
from ..config import SYNC_MODES

ALL: Final = SYNC_MODES[0]
ALL_DISK: Final = SYNC_MODES[1]
QUORUM_MEM: Final = SYNC_MODES[2]
QUORUM_DISK: Final = SYNC_MODES[3]


def from_disk(mode: str) -> bool:
    """Do backups confirm a message only once their journal has it on disk?"""
    return mode in (ALL_DISK, QUORUM_DISK)


def is_quorum(mode: str) -> bool:
    return mode in (QUORUM_MEM, QUORUM_DISK)


class Quorums:
    """The guard and observer of every message-replicated queue under a quorum mode.

    Each backup votes once per message: for a live enqueue when it settles the transfer, for the
    messages it caught up with when it settles the caught-up marker (ReplicatingSubscription keeps the
    two apart), so votes are counted, not collected per voter. In a 3-broker cluster one vote is a
    majority: no count is kept at all, a publish costs a dict entry.
    """

    def __init__(self, cluster_size: int) -> None:
        self.needed = cluster_size // 2  # a majority is size // 2 + 1, and the primary is one of them
        self.pending: dict[Queue, dict[int, Completion]] = {}
        self.votes: dict[Queue, dict[int, int]] = {}  # votes so far, when more than one is needed

    def guard(self, queue: Queue) -> None:
        if self.needed:
            queue.guards.append(self)
            queue.observers.append(self)

    def hold(self, queue: Queue, entry: Entry, completion: Completion) -> None:
        completion.hold()
        pending = self.pending.get(queue)
        if pending is None:
            pending = self.pending[queue] = {}
        pending[entry.seq] = completion

    def vote(self, queue: Queue, seq: int) -> None:
        """A backup has the message (it settled its live enqueue)."""
        pending = self.pending.get(queue)
        if pending is None or seq not in pending:
            return
        if self.needed > 1:
            votes = self.votes.setdefault(queue, {})
            count = votes.get(seq, 0) + 1
            if count < self.needed:
                votes[seq] = count
                return
            votes.pop(seq, None)
        pending.pop(seq).release()

    def caught_up(self, queue: Queue, before: int) -> None:
        """A returning backup holds every message of the queue older than `before` (its first live
        enqueue, which it votes for as it settles): a vote for each, so publishes made while too few
        backups were there are confirmed once enough are back."""
        for seq in [s for s in self.pending.get(queue, ()) if s < before]:
            self.vote(queue, seq)

    def status(self) -> dict[str, int]:
        return {"needed_backups": self.needed, "waiting": sum(len(p) for p in self.pending.values())}

    # -- queue observer: a consumed message needs no more copies --------------------------------
    def enqueued(self, queue: Queue, entry: Entry) -> None:
        pass

    def acquired(self, queue: Queue, entry: Entry) -> None:
        pass

    def dequeued(self, queue: Queue, entry: Entry) -> None:
        pending = self.pending.get(queue)
        completion = pending.pop(entry.seq, None) if pending else None
        if completion is not None:
            completion.release()
            if self.needed > 1:
                self.votes.get(queue, {}).pop(entry.seq, None)
        if queue.deleted and not pending:
            self.pending.pop(queue, None)
            self.votes.pop(queue, None)
