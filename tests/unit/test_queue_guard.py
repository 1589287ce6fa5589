"""A QueueGuard (a backup expected to have a queue, not subscribed yet) is overdue once a publish it holds has
waited backup_timeout, not once the guard itself is that old: a queue declared long before its first publish
once had both backups dropped on that publish at once. In process: a real queue and real completions."""
from __future__ import annotations

import time

from haqueue.broker.completion import Completion
from haqueue.broker.queue import Queue
from haqueue.ha.queue_guard import QueueGuard

TIMEOUT = 0.2


def wait_past(moment: float) -> None:
    """Let the clock pass `moment` (the guard reads time.monotonic)."""
    while time.monotonic() <= moment:
        time.sleep(0.01)


def test_the_timeout_runs_from_the_oldest_held_publish_not_from_the_declaration():
    queue = Queue("q", {}, "uid-q", lambda q: None)
    guard = QueueGuard("b1")
    guard.guard(queue)
    wait_past(time.monotonic() + 2 * TIMEOUT)  # the queue waits, empty, longer than the timeout
    assert not guard.overdue(TIMEOUT)
    confirmed: list[int] = []
    completion = Completion(lambda: confirmed.append(1))
    queue.enqueue(b"\x00Sw\xa1\x01x", 0.0, completion)
    completion.release()  # the publisher's own hold: the guard's is left
    held_at = time.monotonic()
    assert not guard.overdue(TIMEOUT) and not confirmed
    wait_past(held_at + TIMEOUT)
    assert guard.overdue(TIMEOUT)
    guard.release()
    assert confirmed == [1] and not guard.overdue(TIMEOUT)
