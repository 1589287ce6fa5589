"""Liveness: is a broker that stopped answering pings hung, or only busy?

A primary working through a burst (thousands of pipelined declarations, a long catch-up pass) can leave a
ping unanswered for a few seconds while it makes progress; killing it then turns a slow moment into a
failover. A hung broker (stopped, deadlocked, its machine frozen) uses no CPU. So a broker that does not
answer is judged hung only when its process has used no CPU since the last look, or has not answered for
BUSY_GRACE seconds whatever it does (a broker spinning without serving is as good as hung).
"""
from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("haqueue.cluster")

BUSY_GRACE = 15.0  # seconds a broker that keeps using CPU may leave pings unanswered


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU the process has used; None if it is gone or stopped (state T: SIGSTOP)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if fields[0] in ("T", "t", "Z", "X"):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Liveness:
    """One watched process: since when it has left pings unanswered, and the CPU it had used at the last look."""

    def __init__(self, pid: int, name: str) -> None:
        self.pid, self.name = pid, name
        self.unanswered_since = 0.0  # monotonic time of the first unanswered ping in a row; 0: it answers
        self.cpu = cpu_seconds(pid)

    def answered(self) -> None:
        self.unanswered_since, self.cpu = 0.0, cpu_seconds(self.pid)

    def busy(self) -> bool:
        """A ping went unanswered: has the process used CPU since the last look (busy, not hung), within the grace?"""
        now = time.monotonic()
        if not self.unanswered_since:
            self.unanswered_since = now
        cpu = cpu_seconds(self.pid)
        progressed = cpu is not None and self.cpu is not None and cpu > self.cpu
        self.cpu = cpu
        waited = now - self.unanswered_since
        if progressed and waited < BUSY_GRACE:
            log.warning("%s has not answered for %.1fs but is using CPU: busy, not hung", self.name, waited)
            return True
        return False
