"""A queue with an arranger (haqueue/messaging/) in memory, without a broker: priority order through many
messages, and what a long-lived old message does to the queue's memory (its log is swept of dequeued
entries wherever they are, browsers keeping their place)."""
from __future__ import annotations

import random
from typing import Any

import pytest
from proton import Message

from haqueue.broker.queue import Entry, Queue
from haqueue.messaging.groups import Groups
from haqueue.messaging.priority import Priorities

pytestmark = pytest.mark.timeout(60)


def encoded(body: Any, priority: int) -> bytes:
    return bytes(Message(body=body, priority=priority).encode())


class Taker:
    """A consumer or browser as the queue sees it, with `left` credit, settling nothing by itself."""

    def __init__(self, browse: bool = False, left: int = 1_000_000) -> None:
        self.browse = browse
        self.left = left
        self.cursor = 0
        self.selector = None
        self.returned: list = []
        self.got: list[Entry] = []

    def credit(self) -> int:
        return self.left

    def deliver(self, entry: Entry) -> None:
        self.left -= 1
        self.got.append(entry)

    def after_dispatch(self) -> None:
        pass

    def queue_deleted(self) -> None:
        pass


def priority_queue() -> Queue:
    queue = Queue("prio", {"x-priorities": 10}, "uid", lambda q: None)
    queue.arranger = Priorities(queue, 10)
    return queue


def test_one_old_low_message_does_not_keep_what_flows_past_it():
    queue = priority_queue()
    queue.enqueue(encoded("old", 0), 0.0)
    consumer, browser = Taker(left=0), Taker(browse=True)
    queue.subscribe(consumer)
    queue.subscribe(browser)
    for i in range(50_000):
        queue.enqueue(encoded(i, 9), 0.0)
        if i % 100 == 99:  # a consumer takes the high ones as they come (credit for 100), leaving the old one
            consumer.left = 100
            queue.dispatch()
            assert len(consumer.got) == 100
            for entry in consumer.got:
                queue.dequeue(entry)
            consumer.got = []
    assert queue.depth == 1
    assert len(queue._log) < 10_000  # swept: not 50,001 entries held
    consumer.left = 10
    queue.dispatch()
    assert [e.seq for e in consumer.got] == [1]  # the old one, last
    assert len(browser.got) == 50_001  # the browser saw each message once, its place kept across sweeps
    assert [e.seq for e in browser.got] == sorted(e.seq for e in browser.got)


def test_groups_under_random_consumers_never_share_a_group_and_keep_its_order():
    """Three consumers taking, settling and releasing at random: no group is ever held by two at once,
    each group's messages are first delivered in order, and every message is settled in the end."""
    rng = random.Random(28)
    queue = Queue("grouped", {"x-group-header": True}, "uid", lambda q: None)
    queue.arranger = Groups(queue, "JMSXGroupID")
    consumers = [Taker(left=0) for _ in range(3)]
    for consumer in consumers:
        queue.subscribe(consumer)
    held: dict[int, list[Entry]] = {i: [] for i in range(3)}
    group_of: dict[int, str] = {}
    first_seen: dict[str, list[int]] = {}
    settled = 0
    sent = 0
    for step in range(3000):
        if sent < 2000 and rng.random() < 0.6:
            group = f"g{rng.randrange(8)}" if rng.random() < 0.9 else None
            message = Message(body=sent, group_id=group) if group else Message(body=sent)
            entry = queue.enqueue(bytes(message.encode()), 0.0)
            group_of[entry.seq] = group or ""
            sent += 1
        k = rng.randrange(3)
        consumer = consumers[k]
        consumer.left = rng.randrange(4)
        queue.dispatch()
        for entry in consumer.got:
            group = group_of[entry.seq]
            if group:
                holders = {j for j in range(3) if any(group_of[e.seq] == group for e in held[j])}
                assert holders <= {k}, f"{group} held by {holders} and given to {k}"
                if entry.seq not in first_seen.setdefault(group, []):
                    first_seen[group].append(entry.seq)
            held[k].append(entry)
        consumer.got = []
        for entry in list(held[k]):
            if rng.random() < 0.3:
                held[k].remove(entry)
                if rng.random() < 0.2:
                    queue.release(entry)
                else:
                    queue.dequeue(entry)
                    settled += 1
    for k, consumer in enumerate(consumers):  # drain: settle everything
        for entry in held[k]:
            queue.dequeue(entry)
            settled += 1
        held[k] = []
    while queue.depth:
        for consumer in consumers:
            consumer.left = 100
        queue.dispatch()
        for consumer in consumers:
            for entry in consumer.got:
                queue.dequeue(entry)
                settled += 1
            consumer.got = []
    assert settled == sent
    for group, seqs in first_seen.items():
        assert seqs == sorted(seqs), group


def test_an_expired_message_on_a_priority_queue_is_dropped_as_expired_not_delivered():
    queue = priority_queue()
    queue.enqueue(encoded("stale", 9), 1.0)  # a monotonic deadline long past
    queue.enqueue(encoded("fresh", 1), 0.0)
    consumer = Taker()
    queue.subscribe(consumer)
    queue.dispatch()
    assert [e.seq for e in consumer.got] == [2]
    assert (queue.expired, queue.depth) == (1, 1)
