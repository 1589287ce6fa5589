#!/usr/bin/env python3
"""proton Python (reactor) producer and consumer for bench/run.py --python-clients.

Same options, body layout and JSON output as bench/js/producer.js and
consumer.js, so run.py drives either. Usage:
  py_clients.py producer --port P --address A --messages N [--rate R --duration S] [--delivery-time MS] ...
  py_clients.py consumer --port P --address A --messages N [--warmup W] ...
  py_clients.py storm --port P --connections N [--timeout T]
The proton Python client costs 100-150 µs per message on each side here
(shared/notes/components-here.md), so this row measures the clients more than the broker.
--delivery-time MS (ms since the epoch) puts the message annotation x-opt-delivery-time on every message
(scheduled delivery, bench/scheduled.py).
storm (bench/scale.py --storm): N connections opened at once by one stock Container (proton's own reconnect, so a
connection the broker closes is opened again with proton's backoff); prints {"connections", "admitted", "closed"
(transport errors before open, each retried), "last_s" (the last open, from the start), "cpu_us"} once every
connection has opened or --timeout passed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
import time

from proton import Message, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container

BODY_TS, BODY_SEQ, BODY_MIN = 0, 8, 12
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def now_us() -> float:
    # CLOCK_MONOTONIC, the clock Node's process.hrtime uses: comparable across processes
    return time.monotonic_ns() / 1000


def cpu_us() -> float:
    t = os.times()
    return (t.user + t.system) * 1e6


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def pct(s: list[float], p: float):
    if not s:
        return None
    i = min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))
    return s[i]


def summary(v: list[float]) -> dict:
    s = sorted(v)
    return {"n": len(s), "mean_us": sum(s) / len(s) if s else None,
            "p50_us": pct(s, 50), "p90_us": pct(s, 90), "p99_us": pct(s, 99), "p999_us": pct(s, 99.9),
            "max_us": s[-1] if s else None, "min_us": s[0] if s else None}


class Storm(MessagingHandler):
    def __init__(self, o: argparse.Namespace) -> None:
        super().__init__()
        self.o = o
        self.admitted = self.closed = 0
        self.t0 = self.last = 0.0

    def on_start(self, event) -> None:
        self.t0 = time.monotonic()
        event.container.schedule(self.o.timeout, self)
        for _ in range(self.o.connections):
            event.container.connect(f"{self.o.host}:{self.o.port}")

    def on_connection_opened(self, event) -> None:
        self.admitted += 1
        self.last = time.monotonic()
        if self.admitted == self.o.connections:
            self.done(event.container)

    def on_transport_error(self, event) -> None:
        self.closed += 1  # proton's reconnect opens it again

    def on_timer_task(self, event) -> None:
        self.done(event.container)

    def done(self, container) -> None:
        emit({"connections": self.o.connections, "admitted": self.admitted, "closed": self.closed,
              "last_s": self.last - self.t0 if self.admitted else None, "cpu_us": cpu_us()})
        # Not container.stop(): proton's reactor closes its connections one by one, each removal scanning every
        # other's deadline, minutes at 1,000 connections on a loaded machine. The sockets close with the process.
        os._exit(0)


class Producer(MessagingHandler):
    def __init__(self, o):
        super().__init__()
        self.o = o
        self.target = round(o.rate * o.duration) if o.rate > 0 else o.messages
        self.filler = b"x" * (o.size - BODY_MIN)
        self.annotations = {symbol("x-opt-delivery-time"): o.delivery_time} if o.delivery_time else None
        self.sent = self.settled = self.accepted = self.released = self.rejected = 0
        self.first_send = self.last_send = self.last_settle = 0.0
        self.errors: list[str] = []
        self.sender = None
        self.done = False
        self.cpu0 = cpu_us()

    def on_start(self, event):
        self.conn = event.container.connect(f"amqp://{self.o.host}:{self.o.port}", sasl_enabled=False,
                                            reconnect=False)
        self.sender = event.container.create_sender(self.conn, self.o.address)
        self.t0 = now_us()
        self.timer = event.container.schedule(self.o.timeout, self)
        if self.o.rate > 0:
            event.container.schedule(0.001, self)

    def on_timer_task(self, event):
        if self.done:
            return
        if now_us() - self.t0 >= self.o.timeout * 1e6:
            self.errors.append(f"timeout after {self.o.timeout} s")
            self.finish(2)
            return
        self.pump()
        if self.sent < self.target:
            event.container.schedule(0.001, self)

    def pump(self):
        if self.sender is None or self.done:
            return
        due = self.target
        if self.o.rate > 0:
            due = min(self.target, int((now_us() - self.t0) / 1e6 * self.o.rate) + 1)
        while self.sent < due and self.sent - self.settled < self.o.inflight and self.sender.credit > 0:
            t = now_us()
            body = struct.pack("<dI", t, (self.sent + self.o.seq_base) & 0xFFFFFFFF) + self.filler
            self.sender.send(Message(body=body, inferred=True, durable=self.o.durable or None,
                                     annotations=self.annotations))
            if self.sent == 0:
                self.first_send = t
            self.last_send = t
            self.sent += 1

    def on_sendable(self, event):
        self.pump()

    def on_accepted(self, event):
        self.accepted += 1

    def on_released(self, event):
        self.released += 1

    def on_rejected(self, event):
        self.rejected += 1
        if len(self.errors) < 20:
            self.errors.append(f"rejected: {event.delivery.remote.condition}")

    def on_settled(self, event):
        self.settled += 1
        self.last_settle = now_us()
        if self.settled >= self.target:
            self.finish(1 if self.rejected + self.released else 0)
        else:
            self.pump()

    def on_transport_error(self, event):
        self.errors.append(f"transport_error: {event.transport.condition}")
        self.finish(1)

    def on_connection_error(self, event):
        self.errors.append(f"connection_error: {event.connection.remote_condition}")
        self.finish(1)

    def on_link_error(self, event):
        self.errors.append(f"link_error: {event.link.remote_condition}")
        self.finish(1)

    def finish(self, code):
        if self.done:
            return
        self.done = True
        self.code = code
        el = (self.last_settle or now_us()) - self.first_send
        emit({"role": "producer", "ok": code == 0, "timed_out": code == 2, "target": self.target,
              "size": self.o.size, "rate_target": self.o.rate, "sent": self.sent, "settled": self.settled,
              "accepted": self.accepted, "released": self.released, "rejected": self.rejected,
              "first_send_us": self.first_send, "last_send_us": self.last_send, "last_settle_us": self.last_settle,
              "send_rate": (self.sent - 1) / ((self.last_send - self.first_send) / 1e6) if self.sent > 1 else 0,
              "settle_rate": self.settled / (el / 1e6) if self.settled and el > 0 else 0,
              "client_cpu_us": cpu_us() - self.cpu0, "errors": self.errors[:20]})
        if self.timer:
            self.timer.cancel()
        self.conn.close()


class Consumer(MessagingHandler):
    def __init__(self, o):
        super().__init__(prefetch=o.credit, auto_accept=True)
        self.o = o
        n = o.messages
        self.lat: list[float] = []
        self.lat_seq: list[int] = []
        self.seen = bytearray(n)
        self.received = self.dup = self.ooo = self.unknown = self.bad = self.redelivered = 0
        self.last_seq = -1
        self.first_recv = self.last_recv = 0.0
        self.errors: list[str] = []
        self.done = False
        self.cpu0 = cpu_us()

    def on_start(self, event):
        self.conn = event.container.connect(f"amqp://{self.o.host}:{self.o.port}", sasl_enabled=False,
                                            reconnect=False)
        event.container.create_receiver(self.conn, self.o.address)
        self.t0 = now_us()
        self.last_progress = self.t0
        self.last_count = 0
        event.container.schedule(0.25, self)

    def on_link_opened(self, event):
        if event.receiver:
            emit({"event": "ready"})

    def on_timer_task(self, event):
        if self.done:
            return
        t = now_us()
        if self.received != self.last_count:
            self.last_count, self.last_progress = self.received, t
        elif self.received and t - self.last_progress > self.o.stall * 1e6:
            self.errors.append(f"stalled: nothing received for {self.o.stall} s after {self.received} messages")
            return self.finish(2)
        if t - self.t0 > self.o.timeout * 1e6:
            self.errors.append(f"timeout after {self.o.timeout} s")
            return self.finish(2)
        event.container.schedule(0.25, self)

    def on_message(self, event):
        t = now_us()
        b = event.message.body
        if not isinstance(b, (bytes, memoryview)) or len(b) < BODY_MIN:
            self.bad += 1
        else:
            ts, seq = struct.unpack_from("<dI", b, 0)
            seq -= self.o.seq_base
            if seq < 0 or seq >= self.o.messages:
                self.unknown += 1  # a stray from an earlier run: not counted toward --messages
                return
            else:
                if self.seen[seq]:
                    self.dup += 1
                self.seen[seq] = 1
                if seq < self.last_seq:
                    self.ooo += 1
                self.last_seq = seq
                self.lat.append(t - ts)
                self.lat_seq.append(seq)
        if event.message.delivery_count:
            self.redelivered += 1
        if self.received == 0:
            self.first_recv = t
        self.last_recv = t
        self.received += 1
        if self.received == self.o.messages:
            event.container.schedule(0, self._Finisher(self))

    class _Finisher:
        def __init__(self, c):
            self.c = c

        def on_timer_task(self, event):
            self.c.finish(1 if self.c.dup or self.c.bad else 0)

    def on_transport_error(self, event):
        self.errors.append(f"transport_error: {event.transport.condition}")
        self.finish(1)

    def on_connection_error(self, event):
        self.errors.append(f"connection_error: {event.connection.remote_condition}")
        self.finish(1)

    def on_link_error(self, event):
        self.errors.append(f"link_error: {event.link.remote_condition}")
        self.finish(1)

    def finish(self, code):
        if self.done:
            return
        self.done = True
        self.code = code
        n = self.received
        steady = [v for v, s in zip(self.lat, self.lat_seq) if s >= self.o.warmup]
        emit({"role": "consumer", "ok": code == 0, "timed_out": code == 2, "expected": self.o.messages,
              "received": n, "missing": self.seen.count(0), "duplicates": self.dup, "out_of_order": self.ooo,
              "stray": self.unknown, "bad_body": self.bad, "redelivered": self.redelivered,
              "first_recv_us": self.first_recv, "last_recv_us": self.last_recv,
              "recv_rate": (n - 1) / ((self.last_recv - self.first_recv) / 1e6) if n > 1 else 0,
              "latency": summary(steady), "latency_all": summary(self.lat), "warmup_messages": self.o.warmup,
              "client_cpu_us": cpu_us() - self.cpu0, "errors": self.errors[:20]})
        self.conn.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["producer", "consumer", "storm"])
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5672)
    ap.add_argument("--address", default="bench")
    ap.add_argument("--messages", type=int, default=100000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--inflight", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=0)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--durable", action="store_true")
    ap.add_argument("--credit", type=int, default=1000)
    ap.add_argument("--stall", type=float, default=15)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--seq-base", type=int, default=0)
    ap.add_argument("--delivery-time", type=int, help="x-opt-delivery-time (ms since the epoch) on every message")
    o = ap.parse_args()
    if o.host not in LOOPBACK:
        ap.error("this benchmark only talks to the loopback address")
    if o.size < BODY_MIN:
        ap.error(f"size must be at least {BODY_MIN}")
    h = {"producer": Producer, "consumer": Consumer, "storm": Storm}[o.role](o)
    Container(h).run()
    return getattr(h, "code", 1)


if __name__ == "__main__":
    sys.exit(main())
