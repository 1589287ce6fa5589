"""RabbitMQ's side of bench/scale.py over AMQP 0-9-1 with pika's asynchronous connection: durable queues
declared on `window` channels at once (a channel answers its declares one at a time, so the channels are
what keeps `window` in flight), and durable messages published with publisher confirms, at most
`inflight` unconfirmed. Every wait is bounded by the ioloop's timer."""
from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable

import pika
from pika.spec import Basic, BasicProperties

HOST = "127.0.0.1"


def _run(port: int, timeout: float, on_open: Callable[[Any, Callable[[str | None], None]], None]) -> str | None:
    """Connect, call on_open(connection, finish) and run the ioloop until finish(error or None) or timeout."""
    outcome: list[str | None] = []

    def finish(error: str | None) -> None:
        if not outcome:
            outcome.append(error)
            conn.ioloop.stop()

    def on_close(c: Any, e: Exception) -> None:
        finish(f"connection closed: {e}")
        c.ioloop.stop()  # also after our own close, below

    conn = pika.SelectConnection(
        # a busy RabbitMQ (a thousand quorum queues electing) takes longer than pika's 10-15 s to let us in
        pika.ConnectionParameters(HOST, port, channel_max=2047, socket_timeout=timeout, stack_timeout=timeout,
                                  blocked_connection_timeout=timeout),
        on_open_callback=lambda c: on_open(c, finish),
        on_open_error_callback=lambda c, e: finish(f"cannot connect: {e}"),
        on_close_callback=on_close)
    conn.ioloop.call_later(timeout, lambda: finish(f"not done within {timeout:g} s"))
    conn.ioloop.start()
    if conn.is_open:
        conn.close()
        conn.ioloop.call_later(10, conn.ioloop.stop)  # a broker that never answers the close
        conn.ioloop.start()  # until closed
    return outcome[0]


def _span(t0: float, t1: float) -> float | None:
    """Seconds from t0 to t1 (to now if the work did not end; None if it never began)."""
    return (t1 or time.monotonic()) - t0 if t0 else None


def declare(port: int, names: list[str], arguments: dict, window: int, timeout: float) -> dict[str, Any]:
    """Durable queues with `arguments` (x-queue-type...): seconds from the connection's opening to the
    last declare-ok."""
    todo = deque(names)
    declared, t0, t1 = 0, 0.0, 0.0

    def on_open(conn: Any, finish: Callable[[str | None], None]) -> None:
        nonlocal t0
        t0 = time.monotonic()

        def next_on(ch: Any) -> None:
            if todo:
                ch.queue_declare(todo.popleft(), durable=True, arguments=arguments, callback=lambda _: done(ch))

        def done(ch: Any) -> None:
            nonlocal declared, t1
            declared += 1
            if declared == len(names):
                t1 = time.monotonic()
                finish(None)
            next_on(ch)

        for _ in range(min(window, len(names))):
            conn.channel(on_open_callback=next_on)

    error = _run(port, timeout, on_open)
    return {"declared": declared, "seconds": _span(t0, t1), **({"error": error} if error else {})}


class Confirms:
    """Publisher confirms by delivery tag, single or `multiple` (all tags up to this one)."""

    def __init__(self) -> None:
        self.unconfirmed: deque[int] = deque()
        self.early: set[int] = set()  # confirmed singly ahead of older ones
        self.acked = self.nacked = 0

    def sent(self, tag: int) -> None:
        self.unconfirmed.append(tag)

    def confirm(self, tag: int, multiple: bool, ack: bool) -> None:
        done = 0
        while self.unconfirmed and self.unconfirmed[0] <= tag and multiple:
            first = self.unconfirmed.popleft()
            done += first not in self.early
            self.early.discard(first)
        if not multiple:
            self.early.add(tag)
            done = 1
        while self.unconfirmed and self.unconfirmed[0] in self.early:
            self.early.discard(self.unconfirmed.popleft())
        if ack:
            self.acked += done
        else:
            self.nacked += done

    def in_flight(self) -> int:
        return len(self.unconfirmed) - len(self.early)


def publish(port: int, names: list[str], per_queue: int, size: int, inflight: int, timeout: float) -> dict[str, Any]:
    """per_queue durable messages of `size` bytes to each queue (the default exchange, round robin over the
    queues), confirmed: seconds from the first publish to the last confirm."""
    routes = [name for _ in range(per_queue) for name in names]
    body, props = b"x" * size, BasicProperties(delivery_mode=2)
    confirms = Confirms()
    sent, t0, t1 = 0, 0.0, 0.0

    def on_open(conn: Any, finish: Callable[[str | None], None]) -> None:
        def fill(ch: Any) -> None:
            nonlocal sent
            while sent < len(routes) and confirms.in_flight() < inflight:
                ch.basic_publish("", routes[sent], body, props)
                sent += 1
                confirms.sent(sent)  # delivery tags count from 1

        def on_confirm(frame: Any, ch: Any) -> None:
            nonlocal t1
            m = frame.method
            confirms.confirm(m.delivery_tag, m.multiple, isinstance(m, Basic.Ack))
            if confirms.acked + confirms.nacked == len(routes):
                t1 = time.monotonic()
                finish(None)
            fill(ch)

        def on_confirming(ch: Any) -> None:
            nonlocal t0
            t0 = time.monotonic()
            fill(ch)

        conn.channel(on_open_callback=lambda ch: ch.confirm_delivery(lambda frame: on_confirm(frame, ch),
                                                                     callback=lambda _: on_confirming(ch)))

    error = _run(port, timeout, on_open)
    return {"sent": sent, "outcomes": {"accepted": confirms.acked, "nacked": confirms.nacked},
            "seconds": _span(t0, t1), **({"error": error} if error else {})}
