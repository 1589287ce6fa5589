"""Flow control: the overflow policies, and the broker-wide memory alarm.

Queues count the bytes of message data they hold and add them to one `MemoryAlarm`. A publish that
would take a queue over its `max_depth` or `max_bytes`, or that arrives while the broker is over
`memory_limit`, meets the queue's overflow policy (links.Publisher applies it): `block` (accept it,
then give the publisher no more credit until the cause lifts), `reject-publish` or `drop-head`.
Why credit and not rejection is the default: design/architecture.md, "Flow control".
"""
from __future__ import annotations

import logging
import sys
from typing import Final, Protocol

from ..config import OVERFLOW_POLICIES

log = logging.getLogger("haqueue.broker")

BLOCK: Final = OVERFLOW_POLICIES[0]
REJECT_PUBLISH: Final = OVERFLOW_POLICIES[1]
DROP_HEAD: Final = OVERFLOW_POLICIES[2]
# Held publishers resume once below this share of the limit, so they do not flap at its edge.
LOW_WATER: Final = 0.9


def ceiling(limit: int) -> int:
    """A limit as a bound to compare against: 0 (no limit) never reached."""
    return limit or sys.maxsize


class Waiter(Protocol):
    """A publisher whose credit is held."""

    def lifted(self, blocker: "Blocker") -> None: ...


class Blocker:
    """A cause publishers' credit waits on (a full queue, the memory alarm) and who waits on it."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held: set[Waiter] = set()

    def lift(self) -> None:
        held, self.held = self.held, set()
        for waiter in held:
            waiter.lifted(self)


class MemoryAlarm(Blocker):
    """Bytes of message data held in all queues against the broker's `memory_limit` (0: none).

    Queues add and subtract `used` themselves, inline, to keep the hot path cheap; they call
    `over()` once `used` reaches `limit`, and `under()` once it is below `low` while `on`."""

    __slots__ = ("configured", "limit", "low", "used", "on")

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.configured = limit
        self.limit = ceiling(limit)
        self.low = int(limit * LOW_WATER)
        self.used = 0
        self.on = False

    def over(self) -> None:
        if not self.on:
            self.on = True
            log.warning("memory alarm: queues hold %d bytes of messages, memory_limit is %d: publishers get "
                        "no more credit until they hold less than %d", self.used, self.configured, self.low)

    def under(self) -> None:
        self.on = False
        log.warning("memory alarm cleared: queues hold %d bytes of messages (memory_limit %d): %d held "
                    "publishers resume", self.used, self.configured, len(self.held))
        self.lift()
