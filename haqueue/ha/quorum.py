"""Sync modes (`ha.sync`, design/store.md) and the floor under them (`ha.min_confirmations`): when a publish is
confirmed.

- `all` (the default): every subscribed backup has it in memory. Each ReplicatingSubscription holds
  the publisher's completion until its backup settles the live enqueue.
- `all_disk`: the same, but a backup settles only once its journal has the message on disk.
- `quorum_mem` / `quorum_disk`: a majority of the cluster, counting the primary, has it in memory /
  on disk; a backup's subscriptions vote instead of holding.

Under every mode, one `Quorums` guard per replicated queue holds each publish until `min_confirmations`
brokers (the primary counted; a majority of `ha.brokers` unless configured) hold it: a backup dropped
for a timeout, or cut off by a partition, no longer makes the primary confirm alone (issue 27: a primary
isolated from its peers but not its clients confirmed what the majority side never had, and lost it at
the rejoin). `min_confirmations: 1` opts out, for availability over safety.

Whatever the mode, the primary's own journal holds a durable message until it is on its disk (the
store's guard), and a message consumed before it was confirmed is confirmed (nothing left to protect).
"""
from __future__ import annotations

from typing import Final

from ..broker.completion import Completion
from ..broker.queue import Entry, Queue, QueueObserver
from ..config import SYNC_MODES, HaConfig

ALL: Final = SYNC_MODES[0]
ALL_DISK: Final = SYNC_MODES[1]
QUORUM_MEM: Final = SYNC_MODES[2]
QUORUM_DISK: Final = SYNC_MODES[3]


def from_disk(mode: str) -> bool:
    """Do backups confirm a message only once their journal has it on disk?"""
    return mode in (ALL_DISK, QUORUM_DISK)


def is_quorum(mode: str) -> bool:
    return mode in (QUORUM_MEM, QUORUM_DISK)


def confirmations_needed(config: HaConfig) -> int:
    """Brokers, the primary counted, that must hold a message before it is confirmed: `min_confirmations`,
    a majority by default; a quorum mode never asks for less than a majority."""
    majority = len(config.brokers) // 2 + 1
    wanted = config.min_confirmations or majority
    return max(wanted, majority) if is_quorum(config.sync) else wanted


class Quorums(QueueObserver):
    """The guard and observer of every message-replicated queue: holds each publish until `needed` backups
    have voted for it, and every publish while `suspended` (a coordinator cannot prove this broker is
    still the primary).

    Each backup votes once per message: for a live enqueue when it settles the transfer, for the
    messages it caught up with when it settles the caught-up marker (ReplicatingSubscription keeps the
    two apart), so votes are counted, not collected per voter. In a 3-broker cluster one vote is a
    majority: no count is kept at all, a publish costs a dict entry.
    """

    def __init__(self, needed: int) -> None:
        self.needed = needed  # backup votes: the primary is one of the brokers that hold it
        self.pending: dict[Queue, dict[int, Completion]] = {}
        self.votes: dict[Queue, dict[int, int]] = {}  # votes so far, when more than one is needed
        self.suspended = ""  # why confirmations are held whatever the votes; "" when they are not
        self.deferred: list[tuple[Queue, int]] = []  # messages voted for enough while suspended

    def guard(self, queue: Queue) -> None:
        queue.guards.append(self)
        queue.observers.append(self)

    def hold(self, queue: Queue, entry: Entry, completion: Completion) -> None:
        if not self.needed and not self.suspended:
            return  # the opt-out: the primary's copy is enough
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
        if self.suspended:
            self.deferred.append((queue, seq))
            return
        pending.pop(seq).release()

    def caught_up(self, queue: Queue, before: int) -> None:
        """A returning backup holds every message of the queue older than `before` (its first live
        enqueue, which it votes for as it settles): a vote for each, so publishes made while too few
        backups were there are confirmed once enough are back."""
        for seq in [s for s in self.pending.get(queue, ()) if s < before]:
            self.vote(queue, seq)

    def suspend(self, reason: str) -> None:
        """Confirm nothing until resume(): votes are counted, their releases wait."""
        self.suspended = reason

    def resume(self) -> None:
        self.suspended = ""
        deferred, self.deferred = self.deferred, []
        for queue, seq in deferred:
            completion = self.pending.get(queue, {}).pop(seq, None)
            if completion is not None:
                completion.release()
        if not self.needed:  # the opt-out held only while suspended
            pending, self.pending = self.pending, {}
            for completions in pending.values():
                for completion in completions.values():
                    completion.release()

    def waiting(self) -> int:
        return sum(len(p) for p in self.pending.values())

    def status(self) -> dict[str, int | str]:
        status: dict[str, int | str] = {"needed_backups": self.needed, "waiting": self.waiting()}
        if self.suspended:
            status["suspended"] = self.suspended
        return status

    # -- queue observer: a consumed message needs no more copies --------------------------------
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
