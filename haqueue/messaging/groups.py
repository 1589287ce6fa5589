"""Message groups: `x-group-header: NAME` (as Qpid's qpid.group_header_key; `true` for JMSXGroupID). A message's
group is its AMQP group-id property (what Qpid JMS sends for JMSXGroupID), else its application property NAME.
The messages of one group go to one consumer at a time, in order: a consumer that takes one holds the group
until it has settled or released every message of it it took (or detached, which releases them); then the
group goes to whichever consumer asks next. Messages without a group go to anyone, in order.

A consumer is offered the oldest message it may take: of its own groups, of a group no one holds, or of
none. Browsers see the queue in arrival order. A grouped queue is held in memory (never paged); a failover
frees every group (a promoted backup knows no consumer of the old primary).
"""
from __future__ import annotations

import heapq
from typing import Any

from ..broker.message import application_property, group_id
from ..broker.queue import Entry, Queue, Returned, Subscriber
from .heaps import Heaps

GROUP_HEADER = "x-group-header"
DEFAULT_HEADER = "JMSXGroupID"


def header_name(value: Any) -> str:
    """The application property x-group-header names (true: the JMS one)."""
    return DEFAULT_HEADER if value is True else str(value)


def validate(value: Any) -> str | None:
    if value is True or (isinstance(value, str) and value):
        return None
    return f"argument '{GROUP_HEADER}' must be the name of an application property (or true for " \
           f"{DEFAULT_HEADER}), got {value!r}"


class Group:
    __slots__ = ("key", "heap", "owner", "held")

    def __init__(self, key: Any) -> None:
        self.key = key
        self.heap: list[Returned] = []  # its available (and lately dead) entries
        self.owner: Subscriber | None = None
        self.held = 0  # of its entries, how many its owner has acquired and not yet settled or released


class Groups:
    """A queue's arranger under x-group-header."""

    picks = True

    def __init__(self, queue: Queue, header: str) -> None:
        self.queue = queue
        self.header = header
        self._reset()

    def _reset(self) -> None:
        self.groups: dict[Any, Group] = {}
        self.group_of: dict[int, Group] = {}  # seq -> group, for each live entry in one
        self.holding: dict[int, Group] = {}  # seq -> group, for each acquired entry of a group
        self.owned: dict[Subscriber, list[Group]] = {}
        self.free: list[tuple[int, int, Group]] = []  # (seq of its head, push, group) of groups no one holds
        self.ungrouped: list[Returned] = []
        self.kept = Heaps()

    def _key(self, data: bytes) -> Any:
        key = group_id(data)
        if key is None:
            key = application_property(data, self.header)
        return key if isinstance(key, (str, int, bytes)) and not isinstance(key, bool) else None

    def _offer(self, group: Group, entry: Entry) -> None:
        self.kept.push(group.heap, entry)
        if group.owner is None:
            self.kept.pushes += 1
            heapq.heappush(self.free, (entry.seq, self.kept.pushes, group))

    def entered(self, entries: list[Entry], published: bool) -> None:
        for entry in entries:
            key = self._key(entry.data)
            if key is None:
                self.kept.push(self.ungrouped, entry)
                continue
            group = self.groups.get(key)
            if group is None:
                group = self.groups[key] = Group(key)
            self.group_of[entry.seq] = group
            self._offer(group, entry)

    def left(self, entry: Entry) -> None:
        group = self.group_of.pop(entry.seq, None)
        held = self.holding.pop(entry.seq, None)
        if held is not None:
            self._let_go(held)
        if group is not None and group.owner is None and not group.heap and group.key in self.groups:
            del self.groups[group.key]  # nothing of it is left anywhere: a later message starts it again
        if self.kept.left():
            self._prune()

    def returned(self, entry: Entry) -> None:
        held = self.holding.pop(entry.seq, None)
        group = self.group_of.get(entry.seq)
        if group is None:
            self.kept.push(self.ungrouped, entry)
            return
        self._offer(group, entry)
        if held is not None:
            self._let_go(held)

    def _let_go(self, group: Group) -> None:
        group.held -= 1
        if group.held == 0 and group.owner is not None:
            mine = self.owned[group.owner]
            mine.remove(group)
            if not mine:
                del self.owned[group.owner]
            group.owner = None
            head = self.queue.first_available(group.heap, 0.0)
            if head is not None:
                self.kept.pushes += 1
                heapq.heappush(self.free, (head.seq, self.kept.pushes, group))

    def _free_head(self, now: float) -> tuple[Entry, Group] | None:
        """The oldest head of a group no one holds; stale items are dropped or moved on the way."""
        free = self.free
        first_available = self.queue.first_available
        while free:
            seq, _, group = free[0]
            head = first_available(group.heap, now) if group.owner is None else None
            if head is None:
                heapq.heappop(free)
            elif head.seq != seq:
                self.kept.pushes += 1
                heapq.heapreplace(free, (head.seq, self.kept.pushes, group))
            else:
                return head, group
        return None

    def next(self, consumer: Subscriber, now: float) -> Entry | None:
        first_available = self.queue.first_available
        best: Entry | None = None
        best_group: Group | None = None
        for group in self.owned.get(consumer, ()):
            head = first_available(group.heap, now)
            if head is not None and (best is None or head.seq < best.seq):
                best, best_group = head, group
        free = self._free_head(now)
        if free is not None and (best is None or free[0].seq < best.seq):
            best, best_group = free
        loose = first_available(self.ungrouped, now)
        if loose is not None and (best is None or loose.seq < best.seq):
            heapq.heappop(self.ungrouped)
            self.kept.popped()
            return loose
        if best is None or best_group is None:
            return None
        heapq.heappop(best_group.heap)
        self.kept.popped()
        if best_group.owner is None:
            best_group.owner = consumer
            self.owned.setdefault(consumer, []).append(best_group)
        best_group.held += 1
        self.holding[best.seq] = best_group
        return best

    def _prune(self) -> None:
        heaps = [self.ungrouped] + [group.heap for group in self.groups.values()]
        for heap in heaps:
            self.kept.pruned(heap)
        self.kept.recount(heaps)
        for key in [key for key, group in self.groups.items() if not group.heap and group.owner is None]:
            del self.groups[key]
        self.free = [item for item in self.free if item[2].owner is None and item[2].heap]
        heapq.heapify(self.free)

    def rebuild(self, entries: list[Entry]) -> None:
        self._reset()
        self.entered(entries, False)

    def info(self) -> dict[str, int]:
        return {"groups": len(self.groups), "groups_held": sum(len(mine) for mine in self.owned.values())}
