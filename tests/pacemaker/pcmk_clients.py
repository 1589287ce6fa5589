"""Clients of the cluster's virtual IP: a producer and a consumer that reconnect across a failover.

`Load` is the HA tests' reconnecting `Load` (tests/ha/ha_harness.py) through the VIP: it publishes
bodies 0, 1, 2, ... to one queue, one at a time, waiting for each settlement (a confirmed publish),
and records when each was confirmed; a consumer accepts what it receives. Either reconnects at once
on any error (a refused connection, a reset, a timeout), which is what a failover-capable client
does. After `stop`, `report()` counts confirmed, received, lost (confirmed but never received) and
duplicated messages, and `recovery_after(t)` is the time from `t` to the first publish confirmed
after the producer noticed the failure.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from proton.utils import BlockingConnection

import ha_harness
from ha_harness import connect

CONNECT_TIMEOUT = 3.0


class Load(ha_harness.Load):
    """One connect attempt per try: a refused connection counts as a failed send (or receive),
    like a lost one, and each failure is followed by a short pause while the VIP moves."""

    connect_timeout = CONNECT_TIMEOUT
    retry_pause = 0.05
    # Seconds of silence after which a connection is given up (AMQP idle-timeout), None: never. The VIP leaves a
    # node before its broker stops, so a client never hears that broker close: with a heartbeat it moves on
    # within seconds, without one a consumer waits on a dead connection until something else breaks it.
    heartbeat: float | None = None

    def _connect(self, stop: threading.Event) -> BlockingConnection:
        if self.heartbeat is None:
            return connect(self.address, timeout=self.connect_timeout)
        return ha_harness.Connection(f"amqp://{self.address}", timeout=self.connect_timeout, heartbeat=self.heartbeat,
                                  reconnect=False, sasl_enabled=False)

    def stop(self, drain_timeout: float = 30.0) -> None:
        """Stop publishing, let the consumer receive every confirmed message (bounded), stop it."""
        self.stop_producer(self.send_timeout + self.connect_timeout + 5)
        deadline = time.monotonic() + drain_timeout
        while time.monotonic() < deadline:
            with self._lock:
                if set(self.confirmed) <= set(self.received):
                    break
            time.sleep(0.1)
        super().stop(self.connect_timeout + 5)

    def report(self) -> dict[str, Any]:
        report = super().report()
        return {**report, "duplicates": len(report["duplicates"])}
