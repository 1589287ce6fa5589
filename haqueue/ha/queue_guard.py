"""QueueGuard: a recovering primary's hold on publishes for a backup that was ready under the old
primary and has not caught up with the new one yet.

Until that backup is ready again (or `backup_timeout` passes) every publish to a replicated queue
waits for it, so a message is not confirmed while only one copy of it exists. Once the backup has
subscribed, its ReplicatingSubscription guards new messages; this guard keeps holding the ones
enqueued before, which the backup receives in catch-up.
"""
from __future__ import annotations

from ..broker.completion import Completion
from ..broker.queue import Entry, Queue


class QueueGuard:
    def __init__(self, backup_name: str) -> None:
        self.backup_name = backup_name
        self.held: list[Completion] = []
        self.queues: list[Queue] = []
        self.released = False

    def guard(self, queue: Queue) -> None:
        if not self.released:
            queue.guards.append(self)
            self.queues.append(queue)

    def hold(self, queue: Queue, entry: Entry, completion: Completion) -> None:
        completion.hold()
        self.held.append(completion)

    def release(self) -> None:
        """The backup is ready (or given up on): let every held publish complete."""
        if self.released:
            return
        self.released = True
        for queue in self.queues:
            if self in queue.guards:
                queue.guards.remove(self)
        held, self.held = self.held, []
        for completion in held:
            completion.release()
