"""Refused connections, logged without flooding the log.

A peer that keeps retrying with a wrong password (a backup every 0.2 s), a client library reconnecting
in a loop, or a scanner would each write a warning per attempt, thousands an hour, burying everything
else. The first refusal of a kind from a host is logged at once; the same one again within WINDOW
seconds is only counted, and the next one logged after that says how many were not.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

WINDOW = 60.0  # seconds a repeated refusal stays counted rather than logged
MAX_KINDS = 1024  # (host, reason) pairs remembered; past that the oldest are forgotten


def host_of(peer: str) -> str:
    """The host of a HOST:PORT peer: a reconnecting client comes from a new port each time."""
    return peer.rpartition(":")[0] or peer


class RefusalLog:
    def __init__(self, log: logging.Logger, clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self.clock = clock
        self._kinds: dict[tuple[str, str], tuple[float, int]] = {}  # -> (when last logged, repeats not logged)

    def __call__(self, level: int, peer: str, reason: str, message: str, *args: object) -> None:
        """log.log(level, message, *args), unless `reason` from this peer's host was logged less than
        WINDOW seconds ago (then counted); the next one logged gives the count."""
        key = (host_of(peer), reason)
        now = self.clock()
        seen = self._kinds.get(key)
        if seen is not None and now - seen[0] < WINDOW:
            self._kinds[key] = (seen[0], seen[1] + 1)
            return
        if seen is not None and seen[1]:
            message += " (and %d more like it from %s in the last %.0f s, not logged)"
            args = (*args, seen[1], key[0], now - seen[0])
        self._kinds.pop(key, None)
        if len(self._kinds) >= MAX_KINDS:
            del self._kinds[next(iter(self._kinds))]
        self._kinds[key] = (now, 0)
        self.log.log(level, message, *args)
