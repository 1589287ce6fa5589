"""The floor's guard (ha/quorum.py): a publish is confirmed once enough backups voted for it, never while a
coordinator has suspended confirmations, and at once when they resume; `confirmations_needed` reads
ha.min_confirmations and the sync mode. In process: real queues and real completions."""
from __future__ import annotations

from haqueue.broker.completion import Completion
from haqueue.broker.queue import Queue
from haqueue.config import HaConfig
from haqueue.ha.quorum import Quorums, confirmations_needed

MESSAGE = b"\x00Sw\xa1\x01x"


def publish(queue: Queue, confirmed: list[int], n: int) -> int:
    completion = Completion(lambda: confirmed.append(n))
    entry = queue.enqueue(MESSAGE, 0.0, completion)
    completion.release()  # the publisher's own hold: the guards' are left
    return entry.seq


def guarded(needed: int) -> tuple[Quorums, Queue]:
    quorums = Quorums(needed)
    queue = Queue("q", {}, "uid-q", lambda q: None)
    quorums.guard(queue)
    return quorums, queue


def test_a_publish_waits_for_enough_votes():
    quorums, queue = guarded(2)
    confirmed: list[int] = []
    seq = publish(queue, confirmed, 1)
    quorums.vote(queue, seq)
    assert confirmed == [] and quorums.waiting() == 1
    quorums.vote(queue, seq)
    assert confirmed == [1] and quorums.waiting() == 0


def test_suspended_confirms_nothing_until_resumed_even_with_every_vote():
    quorums, queue = guarded(1)
    confirmed: list[int] = []
    before = publish(queue, confirmed, 1)
    quorums.suspend("the ZooKeeper session is suspended")
    during = publish(queue, confirmed, 2)
    quorums.vote(queue, before)
    quorums.vote(queue, during)
    assert confirmed == [] and quorums.status()["suspended"] == "the ZooKeeper session is suspended"
    unvoted = publish(queue, confirmed, 3)
    quorums.resume()
    assert confirmed == [1, 2] and "suspended" not in quorums.status()
    quorums.vote(queue, unvoted)
    assert confirmed == [1, 2, 3]


def test_the_opt_out_holds_nothing_but_while_suspended():
    quorums, queue = guarded(0)
    confirmed: list[int] = []
    publish(queue, confirmed, 1)
    assert confirmed == [1]
    quorums.suspend("the ZooKeeper session is suspended")
    publish(queue, confirmed, 2)
    assert confirmed == [1]
    quorums.resume()
    assert confirmed == [1, 2]


def test_confirmations_needed_is_a_majority_unless_configured():
    def needed(brokers: int, sync: str = "all", minimum: int = 0) -> int:
        return confirmations_needed(HaConfig([("h", i) for i in range(brokers)], "ha", "pw", sync=sync,
                                             min_confirmations=minimum))
    assert [needed(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert needed(3, minimum=1) == 1 and needed(3, minimum=3) == 3
    assert needed(3, "quorum_mem", minimum=1) == 2  # a quorum mode never asks for less than a majority
    assert needed(5, "quorum_disk", minimum=4) == 4
