"""Queue.read_after: a reader that keeps its own place by seq (the site mirror) is given the live messages after that
seq in the queue's order, whoever holds them, and takes none: consumers are handed the same messages as without it.
In process: a real queue and a consumer's calls."""
from __future__ import annotations

from haqueue.broker.queue import Entry, Queue
from test_arranged_queue import Taker  # tests/unit/: a consumer as the queue sees it


def seqs(entries: list[Entry]) -> list[int]:
    return [e.seq for e in entries]


def test_read_after_gives_the_live_messages_after_a_seq_in_order_acquired_and_deferred_ones_too():
    queue = Queue("q", {}, "uid-q", lambda q: None)
    entries = [queue.enqueue(b"m%d" % i, 0.0) for i in range(1, 8)]
    consumer = Taker(left=3)
    queue.subscribe(consumer)
    queue.dispatch()
    assert seqs(consumer.got) == [1, 2, 3]
    queue.dequeue(consumer.got[0])  # 1 consumed; 2 and 3 held by the consumer
    queue.defer(entries[4])  # 5 scheduled for later
    assert seqs(queue.read_after(0, 100)) == [2, 3, 4, 5, 6, 7]
    assert seqs(queue.read_after(3, 2)) == [4, 5]
    assert queue.read_after(7, 100) == []
    queue.dequeue(consumer.got[1])
    queue.dequeue(entries[5])  # 6, available, dropped
    assert seqs(queue.read_after(1, 100)) == [3, 4, 5, 7]
    # the reader took nothing: the consumer is handed the next available ones as before
    consumer.left = 10
    queue.dispatch()
    assert seqs(consumer.got) == [1, 2, 3, 4, 7]
