"""QueueGuard: holds publishes for a backup that is expected to have a queue's messages but has not
subscribed to it yet.

Two cases: a recovering primary's guard for each backup that was ready under the old primary
(on every replicated queue, until that backup is ready again), and a guard for each connected
backup on a queue created after it joined (until its subscription to that queue has caught up).
Either way a message is not confirmed while only one copy of it exists; `backup_timeout` bounds
the wait. Once the backup has subscribed, its ReplicatingSubscription guards new messages; this
guard keeps holding the ones enqueued before, which the backup receives in catch-up.
"""
from __future__ import annotations

import time

from ..broker.completion import Completion
from ..broker.queue import Entry, Queue


class QueueGuard:
    def __init__(self, backup_name: str) -> None:
        self.backup_name = backup_name
        self.held: dict[Queue, list[Completion]] = {}  # by queue: publishes held for this backup
        self.queues: list[Queue] = []
        self.released = False
        # When the oldest publish it holds was held: its wait, not the guard's age, is what backup_timeout
        # bounds (from the queue's declaration, a queue declared long before its first publish dropped the
        # backup on that publish at once).
        self.held_since = 0.0

    def overdue(self, timeout: float) -> bool:
        return bool(self.held) and time.monotonic() - self.held_since > timeout

    def guard(self, queue: Queue) -> None:
        if not self.released:
            queue.guards.append(self)
            self.queues.append(queue)

    def hold(self, queue: Queue, entry: Entry, completion: Completion) -> None:
        completion.hold()
        if not self.held:
            self.held_since = time.monotonic()
        self.held.setdefault(queue, []).append(completion)

    def release_queue(self, queue: Queue) -> None:
        """The backup has caught up on this queue (its subscription holds what comes next): let what was held
        for it complete. At 10,000 queues a recovering primary waiting for the backup to have them all held
        every publish for seconds."""
        if self in queue.guards:
            queue.guards.remove(self)
        for completion in self.held.pop(queue, ()):
            completion.release()

    def release(self) -> None:
        """The backup is ready (or given up on): let every held publish complete."""
        if self.released:
            return
        self.released = True
        for queue in self.queues:
            if self in queue.guards:
                queue.guards.remove(self)
        held, self.held = self.held, {}
        for completions in held.values():
            for completion in completions:
                completion.release()
