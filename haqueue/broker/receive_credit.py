"""The credit the broker gives the peers that send to it (publishers, and a backup's primary).

A link the broker receives on is topped up when half its window is used, to as many messages of the
sizes it sends as make RECEIVE_BYTES, at most its share of RECEIVE_WINDOW and at least RECEIVE_MIN.
A publisher of large messages thus holds them back in its own memory, not the socket's or the broker's:
a window of 2,000 messages of 1 MB had the rhea producer spend 50 % more CPU per message than one of 20
(design/performance.md, "Large messages").

The share: RECEIVE_WINDOW divided among the links topping up at the same time, never below SHARED_MIN.
One publisher keeps the 2,000 messages a fast client needs (200 made the rhea producer 15 % slower);
ten publishers at once get 200 each, the same messages in flight as one publisher rather than ten times
as many: ten C-client pairs went 1.06x as fast for 0.94x the broker's CPU per message
(design/performance.md, "Many queues at once").
"""
from __future__ import annotations

import time
from typing import Final

RECEIVE_WINDOW: Final = 2000
RECEIVE_FIRST: Final = 10  # a new link's, until its messages' sizes are known
RECEIVE_MIN: Final = 2
RECEIVE_BYTES: Final = 16 * 1024 * 1024
SHARED_MIN: Final = 100
# Links count as topping up at the same time when they did within this period or the one before. At 0.1 s,
# ten publishers sending at once on a busy 2-core machine (the test suite on two workers) topped up more than
# 0.2 s apart and each took a whole window (5,288 credits held between them, not ~2,000).
PERIOD: Final = 0.3


class ReceiveShare:
    """Which receiving links are topping up their credit now, and each one's share of RECEIVE_WINDOW.
    Asked once per top-up (every half window), not per message."""

    __slots__ = ("_now", "_before", "_since")

    def __init__(self) -> None:
        self._now: set[int] = set()  # links (by address) that topped up in this period
        self._before = 0  # how many did in the period before
        self._since = time.monotonic()

    def window(self, link: int) -> int:
        """The window of `link`, topping up now."""
        at = time.monotonic()
        if at - self._since >= PERIOD:
            self._before = len(self._now) if at - self._since < 2 * PERIOD else 0
            self._now = set()
            self._since = at
        self._now.add(link)
        return max(SHARED_MIN, RECEIVE_WINDOW // max(len(self._now), self._before))
