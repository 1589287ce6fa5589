"""The guard that, while backups catch up, asks them first for the queues publishes wait on (ha/ask_first.py): it
asks once per queue until told a backup attached, never holds a publish, and leaves the queues when done. In
process: real queues and real completions."""
from __future__ import annotations

from haqueue.broker.completion import Completion
from haqueue.broker.queue import Queue
from haqueue.ha.ask_first import AskFirst

MESSAGE = b"\x00Sw\xa1\x01x"


def publish(queue: Queue, confirmed: list[str]) -> None:
    completion = Completion(lambda: confirmed.append(queue.name))
    queue.enqueue(MESSAGE, 0.0, completion)
    completion.release()


def test_asks_once_per_queue_holds_nothing_and_leaves():
    asked: list[str] = []
    guard = AskFirst(lambda queue: asked.append(queue.name))
    a, b = (Queue(name, {}, f"uid-{name}", lambda q: None) for name in "ab")
    guard.stand_on([a, b])
    confirmed: list[str] = []
    for queue in (a, a, b, a):
        publish(queue, confirmed)
    assert asked == ["a", "b"] and confirmed == ["a", "a", "b", "a"]
    guard.asked.clear()  # a backup attached: asked again
    publish(b, confirmed)
    assert asked == ["a", "b", "b"]
    guard.leave()
    publish(a, confirmed)
    assert asked == ["a", "b", "b"] and not guard.standing and guard not in a.guards and guard not in b.guards
