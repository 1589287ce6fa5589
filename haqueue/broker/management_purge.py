"""Management's PURGE of a queue, answered once it is done: a batch of paged messages is read back a pass
(Queue.purge_available), so a queue larger than memory is never read back whole, and the broker serves its
sockets (heartbeats, other requests) between batches. What is enqueued after the request stays."""
from __future__ import annotations

from typing import Any, Callable

from .queue import Queue


class Purge:
    """One PURGE of `queue`: what was on it when asked (up to its newest seq) and no consumer holds."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.upto = queue.next_seq - 1  # the newest message when asked
        self.purged = 0

    def turn(self) -> bool:
        """A turn of it (Queue.purge_available); whether it is done (its queue deleted meanwhile ends it too)."""
        if self.queue.deleted:
            return True
        gone, done = self.queue.purge_available(self.upto)
        self.purged += gone
        return done


def purge_whole(queue: Queue) -> int:
    """Purge `queue` at once (a plug-in's own request, Management.handle); how many messages went."""
    purge = Purge(queue)
    while not purge.turn():
        pass
    return purge.purged


class PurgeInTurns(Purge):
    """A client's PURGE: a turn each pass (broker.schedule), answered once done."""

    deleted = False  # what broker.schedule asks before calling dispatch; a deleted queue ends it in turn()

    def __init__(self, queue: Queue, schedule: Callable[[Any], None], answer: Callable[[int, str, Any], None],
                 failure: Callable[[Exception], tuple[int, str]]) -> None:
        """`answer`: management.Answer; `failure`: how an exception is answered (management.failure)."""
        super().__init__(queue)
        self.schedule, self.answer, self.failure = schedule, answer, failure

    def dispatch(self) -> None:
        try:
            if not self.turn():
                self.schedule(self)
                return
            self.answer(200, "OK", {"purged": self.purged})
        except Exception as e:  # noqa: BLE001 - answered, never raised into the pass
            self.answer(*self.failure(e), None)
