"""How long the journal's syncs take, as a histogram of fixed buckets of plain ints.

The writer thread counts each `fdatasync` (a bisect and two additions, next to a sync of a millisecond
or more); metrics read the counts when scraped (design/metrics.md).
"""
from __future__ import annotations

import bisect

# Upper bounds in seconds; a sync longer than the last counts in the overflow bucket (+Inf).
BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class SyncLatency:
    __slots__ = ("counts", "seconds")

    def __init__(self) -> None:
        self.counts = [0] * (len(BOUNDS) + 1)  # syncs per bucket (not cumulative); the last: over BOUNDS[-1]
        self.seconds = 0.0  # the syncs' total time

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BOUNDS, seconds)] += 1  # bucket i holds BOUNDS[i-1] < seconds <= BOUNDS[i]
        self.seconds += seconds
