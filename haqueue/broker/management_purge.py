"""Management's PURGE of a queue, answered once it is done: a batch of paged messages is read back a pass
(Queue.purge_available), so a queue larger than memory is never read back whole, and the broker serves its
sockets (heartbeats, other requests) between batches. What is enqueued after the request stays."""
from __future__ import annotations

from typing import Any, Callable

from .queue import Queue


def purge_whole(queue: Queue) -> int:
    """Purge `queue` at once (a plug-in's own request, Management.handle); how many messages went."""
    upto, purged, done = queue.next_seq - 1, 0, False
    while not done:
        gone, done = queue.purge_available(upto)
        purged += gone
    return purged


class Purge:
    """One client's PURGE: a turn each pass (broker.schedule) until nothing paged is left to read back."""

    deleted = False  # what broker.schedule asks before calling dispatch; a deleted queue ends it in dispatch

    def __init__(self, queue: Queue, schedule: Callable[[Any], None], answer: Callable[[int, str, Any], None],
                 failure: Callable[[Exception], tuple[int, str]]) -> None:
        """`answer`: management.Answer; `failure`: how an exception is answered (management.failure)."""
        self.queue, self.schedule, self.answer, self.failure = queue, schedule, answer, failure
        self.upto = queue.next_seq - 1  # the newest message when asked
        self.purged = 0

    def dispatch(self) -> None:
        try:
            if not self.queue.deleted:
                gone, done = self.queue.purge_available(self.upto)
                self.purged += gone
                if not done:
                    self.schedule(self)
                    return
            self.answer(200, "OK", {"purged": self.purged})
        except Exception as e:  # noqa: BLE001 - answered, never raised into the pass
            self.answer(*self.failure(e), None)
