"""AskFirst: while a backup catches up, the queues that publishes wait on go first.

A backup subscribes to the primary's queues SUBSCRIBING at a time (backup.py), in the snapshot's order. A publish
on a queue whose subscriptions have not caught up waits for them (the floor's votes; under `all`, the guards of
the backups that were ready under the old primary): at 10,000 queues, after a failover or a whole-cluster restart,
that was the whole re-subscription. While a backup catches up, this guard stands on every message-replicated queue
and, the first time a publish on a queue waits, has the primary send each backup lacking that queue a `first`
event; the backup subscribes to it before the rest. It never holds a publish itself. Every other publish costs a
set lookup, and once every backup is ready the guard leaves the queues: a cluster in steady state pays nothing.
"""
from __future__ import annotations

from typing import Callable

from ..broker.completion import Completion
from ..broker.queue import Entry, Queue


class AskFirst:
    def __init__(self, ask: Callable[[Queue], None]) -> None:
        self.ask = ask  # sends the `first` events for a queue
        self.asked: set[Queue] = set()  # queues asked for since the last backup attached
        self.queues: list[Queue] = []  # those it stands on

    @property
    def standing(self) -> bool:
        return bool(self.queues)

    def stand_on(self, queues: list[Queue]) -> None:
        for queue in queues:
            queue.guards.append(self)
        self.queues.extend(queues)

    def leave(self) -> None:
        for queue in self.queues:
            if self in queue.guards:
                queue.guards.remove(self)
        self.queues = []
        self.asked.clear()

    def hold(self, queue: Queue, entry: Entry, completion: Completion) -> None:
        if queue not in self.asked:
            self.asked.add(queue)
            self.ask(queue)
