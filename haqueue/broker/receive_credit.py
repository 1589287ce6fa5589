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

"At the same time" is counted in top-ups, not in seconds: a link shares with the links among the latest
RECENT_TOP_UPS top-ups. Ten publishers sending at once all appear in any forty (a client sends a link's credit in a
burst, so a link may top up a few times in a row); one sending alone soon fills them by itself; one that stopped
drops out once the others have topped up forty times. A window of time said the same on an idle machine, but on a
loaded one ten publishers topped up further apart than any window short enough to let a stopped one go, and each
took a whole 2,000 (7,656 credits between ten, at load 15).
"""
from __future__ import annotations

import collections
from typing import Final

RECEIVE_WINDOW: Final = 2000
RECEIVE_FIRST: Final = 10  # a new link's, until its messages' sizes are known
RECEIVE_MIN: Final = 2
RECEIVE_BYTES: Final = 16 * 1024 * 1024
SHARED_MIN: Final = 100
RECENT_TOP_UPS: Final = 2 * RECEIVE_WINDOW // SHARED_MIN


class ReceiveShare:
    """Which receiving links are topping up their credit together, and each one's share of RECEIVE_WINDOW.
    Asked once per top-up (every half window), not per message."""

    __slots__ = ("_recent", "_counts")

    def __init__(self) -> None:
        self._recent: collections.deque[int] = collections.deque()  # the links (by address) of the latest top-ups
        self._counts: dict[int, int] = {}  # how often each link is among them

    def window(self, link: int) -> int:
        """The window of `link`, topping up now."""
        recent, counts = self._recent, self._counts
        if len(recent) == RECENT_TOP_UPS:
            old = recent.popleft()
            left = counts[old] - 1
            if left:
                counts[old] = left
            else:
                del counts[old]
        recent.append(link)
        counts[link] = counts.get(link, 0) + 1
        return max(SHARED_MIN, RECEIVE_WINDOW // len(counts))

    def forget(self, link: int) -> None:
        """A link gone: it shares no more, and its top-ups leave the count (its address may be another link's next)."""
        if self._counts.pop(link, None) is not None:
            self._recent = collections.deque(other for other in self._recent if other != link)
