"""Clients of the cluster's virtual IP: a producer and a consumer that reconnect across a failover.

`Load` publishes bodies 0, 1, 2, ... to one queue through the VIP, one at a time, waiting for each
settlement (a confirmed publish), and records when each was confirmed; a consumer accepts what
it receives. Either reconnects at once on any error (a refused connection, a reset, a timeout),
which is what a failover-capable client does. After `stop`, `report()` counts confirmed,
received, lost (confirmed but never received) and duplicated messages, and `recovery_after(t)`
is the time from `t` to the first publish confirmed after the producer noticed the failure.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from proton import Message, Timeout
from proton.utils import BlockingConnection

SEND_TIMEOUT = 5.0
CONNECT_TIMEOUT = 3.0


def connect(address: str, timeout: float = CONNECT_TIMEOUT) -> BlockingConnection:
    return BlockingConnection(f"amqp://{address}", timeout=timeout, reconnect=False, sasl_enabled=False)


def _close(conn: BlockingConnection | None) -> None:
    if conn is not None:
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - the broker is gone: nothing to tidy
            pass


class Load:
    def __init__(self, address: str, queue: str) -> None:
        self.address, self.queue = address, queue
        self.confirmed: dict[int, float] = {}  # body -> monotonic time of its confirmation
        self.received: list[int] = []
        self.errors: list[str] = []
        self.error_times: list[float] = []  # of the producer's failures
        self.next = 0
        self._lock = threading.Lock()
        self._stop_producer = threading.Event()
        self._stop_consumer = threading.Event()
        self.threads = [threading.Thread(target=self._produce, daemon=True, name="producer"),
                        threading.Thread(target=self._consume, daemon=True, name="consumer")]

    def start(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def _error(self, text: str) -> None:
        with self._lock:
            if len(self.errors) < 500:
                self.errors.append(f"{time.monotonic():.3f} {text}")

    def _produce(self) -> None:
        conn = sender = None
        while not self._stop_producer.is_set():
            try:
                if conn is None:
                    conn = connect(self.address)
                    sender = conn.create_sender(self.queue)
                sender.send(Message(body=self.next, durable=True), timeout=SEND_TIMEOUT)
                with self._lock:
                    self.confirmed[self.next] = time.monotonic()
                self.next += 1
            except Exception as e:  # noqa: BLE001 - lost connection, timeout, refusal: retry this body
                self._error(f"send {self.next}: {type(e).__name__}: {e}")
                with self._lock:
                    self.error_times.append(time.monotonic())
                conn = _close(conn)
                self._stop_producer.wait(0.05)  # retry pace while the VIP moves
        _close(conn)

    def _consume(self) -> None:
        conn = receiver = None
        while not self._stop_consumer.is_set():
            try:
                if conn is None:
                    conn = connect(self.address)
                    receiver = conn.create_receiver(self.queue, credit=20)
                try:
                    m = receiver.receive(timeout=0.5)
                except Timeout:
                    continue
                receiver.accept()
                with self._lock:
                    self.received.append(m.body)
            except Exception as e:  # noqa: BLE001
                self._error(f"receive: {type(e).__name__}: {e}")
                conn = _close(conn)
                self._stop_consumer.wait(0.05)
        _close(conn)

    # ---- observing ----------------------------------------------------------------------------
    def confirmed_count(self) -> int:
        with self._lock:
            return len(self.confirmed)

    def wait_confirmed(self, n: int, timeout: float) -> None:
        """Until n more publishes than now are confirmed (bounded)."""
        target = self.confirmed_count() + n
        deadline = time.monotonic() + timeout
        while self.confirmed_count() < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {self.confirmed_count()}/{target} publishes confirmed within "
                                     f"{timeout} s; last errors: {self.errors[-5:]}")
            time.sleep(0.05)

    def recovery_after(self, t: float) -> float | None:
        """Seconds from monotonic time t (the failure) to the first publish confirmed after the
        producer noticed it (its first error after t): a settlement the old primary sent just
        before t does not count."""
        with self._lock:
            noticed = min((e for e in self.error_times if e > t), default=t)
            after = [c for c in self.confirmed.values() if c > noticed]
        return min(after) - t if after else None

    def outage_after(self, t: float) -> float | None:
        """Seconds between the producer's first failure after t and its next confirmed publish:
        how long the client could not publish."""
        with self._lock:
            noticed = min((e for e in self.error_times if e > t), default=None)
            if noticed is None:
                return 0.0
            after = [c for c in self.confirmed.values() if c > noticed]
        return min(after) - noticed if after else None

    def stop(self, drain_timeout: float = 30.0) -> None:
        """Stop publishing, let the consumer receive every confirmed message (bounded), stop it."""
        self._stop_producer.set()
        self.threads[0].join(SEND_TIMEOUT + CONNECT_TIMEOUT + 5)
        deadline = time.monotonic() + drain_timeout
        while time.monotonic() < deadline:
            with self._lock:
                if set(self.confirmed) <= set(self.received):
                    break
            time.sleep(0.1)
        self._stop_consumer.set()
        self.threads[1].join(CONNECT_TIMEOUT + 5)

    def report(self) -> dict[str, Any]:
        with self._lock:
            counts = Counter(self.received)
            return {"confirmed": len(self.confirmed), "received": len(self.received),
                    "lost": sorted(set(self.confirmed) - set(counts)),
                    "duplicates": sum(1 for c in counts.values() if c > 1),
                    "errors": len(self.errors), "first_errors": self.errors[:5]}
