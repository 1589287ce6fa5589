"""Brokers coordinated by a real ZooKeeper ensemble, and the clients the tests drive them with.

`ZkCluster`   an `HaCluster` (tests/ha/ha_harness.py: N `BrokerProcess`es on free loopback ports,
              started, stopped, SIGSTOPped, asked for status like any HA cluster) with `ha.coordinator:
              zookeeper`. There is no public address: as with ActiveMQ or Artemis under ZooKeeper,
              clients list every broker and the backups refuse them, so the client lands on the
              primary (a listener shared by a stopped old primary and a new one could not be bound).
`Producer`    sends numbered messages through its own proton container, one connection per broker
              address in turn, and records when each was sent and when and by whom it was accepted.
`Consumer`    receives and accepts, moving between brokers the same way; records every body.
`Load`        the HA tests' reconnecting producer and consumer (tests/ha/ha_harness.py), each connection
              to the next broker in turn.

Every wait is a poll of a condition with a deadline (`wait_for`).
"""
from __future__ import annotations

import itertools
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from proton import Message, Timeout
from proton.handlers import MessagingHandler
from proton.reactor import Container

import ha_harness
from ha_harness import HaCluster, connect
from harness import BrokerProcess, wait_for


class ZkCluster(HaCluster):
    state_timeout = 20.0
    state_interval = 0.1

    def __init__(self, directory: Path, hosts: str, size: int = 3, session_timeout: float = 3.0,
                 path: str | None = None, weights: list[int] | None = None) -> None:
        super().__init__(directory, size, public=False, ha_extra={"coordinator": "zookeeper"})
        self.path = path or f"/haqueue/{secrets.token_hex(4)}"
        self.session_timeout = session_timeout
        for b, weight in zip(self.brokers, weights or [0] * size):
            b.config["ha"]["zookeeper"] = {"hosts": hosts, "path": self.path, "session_timeout": session_timeout,
                                           "weight": weight}

    @property
    def addresses(self) -> list[str]:
        return [b.address for b in self.brokers]

    def status(self, b: BrokerProcess, timeout: float = 2.0) -> dict[str, Any] | None:
        """The broker's `ha` status, or None if it does not answer."""
        return self.try_status(b, timeout)

    def primaries(self) -> list[BrokerProcess]:
        found = []
        for b in self.brokers:
            if b.running and b.name not in self.stopped:
                s = self.status(b)
                if s and s["role"] == "primary":
                    found.append(b)
        return found

    def wait_primary(self, timeout: float = 20.0, exclude: tuple[BrokerProcess, ...] = ()) -> BrokerProcess:
        def one() -> BrokerProcess | None:
            found = [b for b in self.primaries() if b not in exclude]
            assert len(found) <= 1, f"two primaries: {found}"
            return found[0] if found else None
        return wait_for(one, timeout, interval=0.05, message="a primary elected through ZooKeeper")

    def wait_ready_backups(self, primary: BrokerProcess, timeout: float = 20.0) -> None:
        for b in self.brokers:
            if b is not primary and b.running:
                self.wait_state(b, "backup", "ready", timeout)


# ---------------------------------------------------------------------------------------------
# Clients that move between the brokers

class _Producer(MessagingHandler):
    """Keeps up to `window` messages in flight on one broker; on any loss moves to the next address."""

    def __init__(self, owner: "Producer") -> None:
        super().__init__(auto_settle=True)
        self.owner = owner
        self.conn: Any = None
        self.sender: Any = None
        self.in_flight: dict[Any, int] = {}  # delivery -> body

    def on_start(self, event: Any) -> None:
        self.container = event.container
        self._connect()
        event.container.schedule(0.05, self)

    def _connect(self) -> None:
        owner = self.owner
        address = owner.addresses[owner.turn % len(owner.addresses)]
        owner.turn += 1
        self.address = address
        self.in_flight.clear()
        self.conn = self.container.connect(f"amqp://{address}", sasl_enabled=False, reconnect=False,
                                           heartbeat=1)  # a stopped broker is left within 2 s
        self.conn.turn = owner.turn  # proton wraps each event's connection anew: tell ours by this
        self.sender = self.container.create_sender(self.conn, owner.queue)

    def on_timer_task(self, event: Any) -> None:
        if self.owner.stopping.is_set():
            if self.conn is not None:
                self.conn.close()
            return
        self._send()
        event.container.schedule(0.05, self)

    def on_sendable(self, event: Any) -> None:
        self._send()

    def _send(self) -> None:
        owner = self.owner
        sender = self.sender
        if sender is None or owner.stopping.is_set() or owner.paused.is_set():
            return
        while sender.credit and len(self.in_flight) < owner.window:
            body = owner.next_body()
            delivery = sender.send(Message(body=body, durable=True))
            self.in_flight[delivery] = body
            owner.sent_at[body] = time.monotonic()

    def on_accepted(self, event: Any) -> None:
        body = self.in_flight.pop(event.delivery, None)
        if body is not None:
            self.owner.accepted(body, self.address)

    def on_rejected(self, event: Any) -> None:
        self._failed(event)

    def on_released(self, event: Any) -> None:
        self._failed(event)

    def _failed(self, event: Any) -> None:
        body = self.in_flight.pop(event.delivery, None)
        if body is not None:
            self.owner.retry.append(body)

    def _lost(self, event: Any) -> None:
        if getattr(event.connection, "turn", None) != self.owner.turn or self.sender is None:
            return
        self.owner.retry.extend(self.in_flight.values())  # unconfirmed: send again elsewhere
        self.in_flight.clear()
        self.sender = None
        self.conn.close()
        if not self.owner.stopping.is_set():
            self.container.schedule(0.05, _Reconnect(self))

    on_transport_error = on_connection_error = on_link_error = on_disconnected = _lost
    on_connection_remote_close = on_link_remote_close = _lost


class _Reconnect:
    def __init__(self, producer: _Producer) -> None:
        self.producer = producer

    def on_timer_task(self, event: Any) -> None:
        self.producer._connect()


class Producer:
    """Publishes 0, 1, 2, ... (a refused or lost body is sent again), `window` in flight at most.

    `confirmed` maps each accepted body to (time, broker address); `sent_at` to when it was last sent.
    """

    def __init__(self, addresses: list[str], queue: str, window: int = 50) -> None:
        self.addresses, self.queue, self.window = addresses, queue, window
        self.turn = 0
        self.confirmed: dict[int, tuple[float, str]] = {}
        self.sent_at: dict[int, float] = {}
        self.retry: list[int] = []
        self._next = 0
        self.stopping = threading.Event()
        self.paused = threading.Event()
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=lambda: Container(_Producer(self)).run(), daemon=True)

    def next_body(self) -> int:
        if self.retry:
            return self.retry.pop()
        self._next += 1
        return self._next - 1

    def accepted(self, body: int, address: str) -> None:
        with self._lock:
            self.confirmed.setdefault(body, (time.monotonic(), address))

    def count(self) -> int:
        with self._lock:
            return len(self.confirmed)

    def snapshot(self) -> dict[int, tuple[float, str]]:
        with self._lock:
            return dict(self.confirmed)

    def start(self) -> "Producer":
        self.thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self.thread.join(timeout)


def received_of_confirmed(producer: Producer, address: str) -> tuple[dict[int, tuple[float, str]], list[int], list[int]]:
    """Drain the producer's queue from `address`: what was confirmed, what was received, which confirmed were not."""
    confirmed = producer.snapshot()
    got = drain([address], producer.queue, set(confirmed))
    return confirmed, got, sorted(set(confirmed) - set(got))


def drain(addresses: list[str], queue: str, expected: set[int], timeout: float = 60.0) -> list[int]:
    """Receive (and accept) from whichever broker serves until every expected body was seen."""
    got: list[int] = []
    deadline = time.monotonic() + timeout
    while not expected <= set(got) and time.monotonic() < deadline:
        for address in addresses:
            try:
                conn = connect(address, timeout=5.0)
            except Exception:  # noqa: BLE001 - a backup refuses, a dead broker does not answer
                continue
            try:
                receiver = conn.create_receiver(queue, credit=500)
                while time.monotonic() < deadline:
                    try:
                        m = receiver.receive(timeout=2.0)
                    except Timeout:
                        break
                    receiver.accept()
                    got.append(m.body)
            except Exception:  # noqa: BLE001
                pass
            finally:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001
                    pass
            if expected <= set(got):
                break
    return got


class Load(ha_harness.Load):
    """`ha_harness.Load` over a cluster without a public address: each try to connect goes to the next broker of
    `addresses` (a backup refuses clients at open, a stopped broker the connection), so the producer and the
    consumer land on the primary wherever the election put it."""

    def __init__(self, addresses: list[str], queue: str) -> None:
        super().__init__(",".join(addresses), queue)
        self._turn = itertools.cycle(addresses)

    def _address(self) -> str:
        return next(self._turn)


# ---------------------------------------------------------------------------------------------
# One publisher pinned to one broker, for the zombie case

class PinnedPublisher(MessagingHandler):
    """Publishes to one broker only, every `interval` s, with no heartbeat (its connection survives
    the broker being stopped); records when each body was sent and when it was accepted."""

    def __init__(self, address: str, queue: str, interval: float = 0.01) -> None:
        super().__init__(auto_settle=True)
        self.address, self.queue, self.interval = address, queue, interval
        self.sent: dict[Any, tuple[int, float]] = {}  # delivery -> (body, sent at)
        self.accepted: list[tuple[int, float, float]] = []  # (body, sent at, accepted at)
        self.rejected = 0
        self.closed_at: float | None = None
        self.stopping = threading.Event()
        self._next = 0
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=lambda: Container(self).run(), daemon=True)

    def start(self) -> "PinnedPublisher":
        self.thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self.thread.join(timeout)

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(f"amqp://{self.address}", sasl_enabled=False, reconnect=False)
        self.sender = event.container.create_sender(self.conn, self.queue)
        event.container.schedule(self.interval, self)

    def on_timer_task(self, event: Any) -> None:
        if self.stopping.is_set() or self.closed_at is not None:
            if self.closed_at is None:
                self.conn.close()
            return
        if self.sender.credit:
            delivery = self.sender.send(Message(body=self._next, durable=True))
            self.sent[delivery] = (self._next, time.monotonic())
            self._next += 1
        event.container.schedule(self.interval, self)

    def on_accepted(self, event: Any) -> None:
        body, sent = self.sent.pop(event.delivery, (None, 0.0))
        if body is not None:
            with self._lock:
                self.accepted.append((body, sent, time.monotonic()))

    def on_rejected(self, event: Any) -> None:
        self.rejected += 1

    def _closed(self, event: Any) -> None:
        if self.closed_at is None:
            self.closed_at = time.monotonic()
            self.conn.close()

    on_transport_error = on_connection_error = on_disconnected = on_connection_remote_close = _closed

    def accepted_list(self) -> list[tuple[int, float, float]]:
        with self._lock:
            return list(self.accepted)
