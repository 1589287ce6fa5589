"""The nemesis suite's clients: the HA tests' reconnecting `Load` (a producer publishing durable messages
one at a time, each with a unique message-id, and a consumer accepting them), writing client ledgers
(haqueue/audit/ledger.py) that the checker reads.

`VipLoad`       through the Pacemaker VIP (tests/pacemaker/pcmk_clients.py's Load: one connect attempt
                per try, so a refused connection counts as a failed send and the client goes on).
`RotatingLoad`  through the list of brokers, as ZooKeeper clients do: each attempt goes to the next
                broker; backups refuse clients, so the client settles on the primary.

Both count the consumer's failures (each one may redeliver up to `CREDIT` messages it had been sent
but not yet settled) so the duplicate bound can be computed: the producer has one publish in flight, so
each failed send may leave one more copy.
"""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Callable

from proton.utils import BlockingConnection

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pacemaker"))

import ha_harness  # noqa: E402
from ha_harness import connect  # noqa: E402
from pcmk_clients import Load as PcmkLoad  # noqa: E402

CREDIT = 20  # the consumer's link credit (ha_harness.Load._consume)
WINDOW = 1  # the producer's publishes in flight


class Counted:
    """Counts failures per side (the base class keeps at most `max_errors` texts)."""

    producer_failures = 0
    consumer_failures = 0

    def _error(self, text: str) -> None:
        if text.startswith("receive"):
            self.consumer_failures += 1
        elif text.startswith(("send", "connect")):
            self.producer_failures += 1
        super()._error(text)  # type: ignore[misc]

    def start_producer(self) -> None:
        self.threads[0].start()  # type: ignore[attr-defined]

    def start_consumer(self) -> None:
        """Idempotent: the consumer may start with the producer or only for the drain."""
        if not self.threads[1].is_alive() and self.threads[1].ident is None:  # type: ignore[attr-defined]
            self.threads[1].start()  # type: ignore[attr-defined]

    def attempted(self) -> set[tuple[str, str]]:
        """(queue, id) of publishes sent but not confirmed: the one the producer is on."""
        return {(self.queue, f"{self.queue}-{self.next}")}  # type: ignore[attr-defined]

    def duplicate_bound(self) -> int:
        return self.producer_failures * WINDOW + self.consumer_failures * CREDIT

    def drain(self, depth: Callable[[], int | None], timeout: float = 60.0, quiet: float = 2.0) -> None:
        """With the producer stopped: let the consumer go on until it has every confirmed message, or the
        primary's queue is empty and nothing came for `quiet` s (a lost message never comes); bounded."""
        deadline = time.monotonic() + timeout
        last, last_change = -1, time.monotonic()
        while time.monotonic() < deadline:
            with self._lock:  # type: ignore[attr-defined]
                got = len(self.received)  # type: ignore[attr-defined]
                if set(self.confirmed) <= set(self.received):  # type: ignore[attr-defined]
                    return
            if got != last:
                last, last_change = got, time.monotonic()
            elif time.monotonic() - last_change > quiet and depth() == 0:
                return
            time.sleep(0.2)


class VipLoad(Counted, PcmkLoad):
    pass


class RotatingLoad(Counted, ha_harness.Load):
    connect_timeout = 2.0
    send_timeout = 5.0
    retry_pause = 0.05

    def __init__(self, addresses: list[str], queue: str, ledger: Path) -> None:
        super().__init__(addresses[0], queue, ledger=ledger)
        self.addresses = addresses
        self._turns = {"producer": 0, "consumer": 0}

    def _connect(self, stop: threading.Event) -> BlockingConnection:
        side = threading.current_thread().name
        turn = self._turns[side] = self._turns.get(side, 0) + 1
        return connect(self.addresses[turn % len(self.addresses)], timeout=self.connect_timeout)
