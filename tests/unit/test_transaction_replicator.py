"""A backup applies a replicated commit whole, once every queue's part is in, and drops a commit
whose parts never all arrived (its primary died mid-replication): the queues as a promoted backup
would serve them. In process: real queues, the replication links stood in for."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

from haqueue.broker.queue import Queue
from haqueue.ha.transaction_replicator import TransactionReplicator


class Link:
    """A QueueReplicator as the TransactionReplicator uses it (transaction_replicator.ReplicaLink): its queue,
    applying dequeues, settling markers."""

    def __init__(self, name: str) -> None:
        self.queue = Queue(name, {}, f"uid-{name}", lambda q: None)
        self.settled: list[str] = []

    def apply_dequeues(self, runs: list[tuple[int, int]]) -> None:
        for first, last in runs:
            self.queue.dequeue_range(first, last)

    def settle(self, delivery: str) -> None:
        self.settled.append(delivery)

    def bodies(self) -> list[bytes]:
        return [e.data for e in self.queue.entries()]


def replicator() -> TransactionReplicator:
    """The backup stood in for: no store, no hooks (what transaction_replicator.CommitHost names)."""
    return TransactionReplicator(SimpleNamespace(atomically=contextlib.nullcontext, durability=None,
                                                 replication_hooks=[], from_disk=False))


def test_a_commit_is_applied_once_every_queue_marker_is_in():
    txns, a, b = replicator(), Link("a"), Link("b")
    a.queue.enqueue(b"old", 0.0, seq=1)
    txns.part(a, 2, 7, b"a-txn", 0.0)
    txns.part(b, 1, 7, b"b-txn", 0.0)
    txns.marker(a, "Ka", 7, {"queues": ["a", "b"], "dequeues": [1]})
    assert a.bodies() == [b"old", b"a-txn"] and a.settled == []  # b's part is not complete yet
    txns.marker(b, "Kb", 7, {"queues": ["a", "b"], "dequeues": []})
    assert (a.bodies(), b.bodies()) == ([b"a-txn"], [b"b-txn"])
    assert (a.settled, b.settled) == (["Ka"], ["Kb"])
    assert txns.commits == {}


def test_a_commit_whose_parts_never_all_arrived_is_dropped_whole():
    txns, a, b = replicator(), Link("a"), Link("b")
    a.queue.enqueue(b"old", 0.0, seq=1)
    txns.part(a, 2, 8, b"a-txn", 0.0)
    txns.marker(a, "Ka", 8, {"queues": ["a", "b"], "dequeues": [1]})
    txns.part(b, 1, 8, b"b-txn", 0.0)  # its marker never comes: the primary died
    txns.drop_incomplete()
    assert (a.bodies(), b.bodies()) == ([b"old"], [])  # neither the enqueues nor the dequeue
    assert (a.settled, b.settled) == ([], [])
