"""The heaps of entries an arranger keeps (priority levels, message groups): entries in seq order, dropped
lazily. A dequeue does not search them: it counts, and once more than half of what they hold is dead, they
are rebuilt from the live entries (a backup's queue, whose entries only ever leave by dequeue, stays small)."""
from __future__ import annotations

import heapq

from ..broker.queue import AVAILABLE, DEFERRED, Entry, Returned


class Heaps:
    """Numbered pushes (two items of one entry never compare their entries) and the count of dead items."""

    def __init__(self) -> None:
        self.pushes = 0
        self.items = 0  # items in every heap, dead ones included
        self.dead = 0  # items whose entry left (approximately: a count, not a search)

    def push(self, heap: list[Returned], entry: Entry) -> None:
        self.pushes += 1
        self.items += 1
        heapq.heappush(heap, (entry.seq, self.pushes, entry))

    def popped(self) -> None:
        self.items -= 1

    def left(self) -> bool:
        """An entry left the queue: whether the heaps are due for a rebuild (then call pruned on each)."""
        self.dead += 1
        return self.dead > 1024 and self.dead * 2 > self.items

    def pruned(self, heap: list[Returned]) -> None:
        """The heap without its dead items and duplicates (still a heap: a sorted list)."""
        live = {item[0]: item for item in heap if item[2].state in (AVAILABLE, DEFERRED)}
        heap[:] = sorted(live.values())

    def recount(self, heaps: list[list[Returned]]) -> None:
        self.items = sum(len(heap) for heap in heaps)
        self.dead = 0
