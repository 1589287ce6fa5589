"""Completion: a publisher's delivery is settled when every guard on its message has released it.

A guard (queue.Guard: HA's QueueGuard, a durable store) calls `hold()` when the message is enqueued and
`release()` when it has done its part. With no guard the publisher is settled at once and no
Completion is made.
"""
from __future__ import annotations

from typing import Callable


class Completion:
    __slots__ = ("pending", "on_complete")

    def __init__(self, on_complete: Callable[[], None]) -> None:
        self.pending = 1  # the publisher's own hold, released once routing is done
        self.on_complete = on_complete

    def hold(self) -> None:
        self.pending += 1

    def release(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self.complete()

    def complete(self) -> None:
        """Every hold is released. A subclass on the hot path does its work here instead, and skips
        making a callback per message."""
        self.on_complete()

