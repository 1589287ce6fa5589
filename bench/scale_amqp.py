"""The AMQP 1.0 clients of bench/scale.py, lean enough that the brokers, not the client, set the pace:
`Engine`, one connection driven by proton's engine over a non-blocking socket (no reactor: only delivery
events reach Python), for `manage` ($management requests, many in flight: about 150 µs of client CPU per
request) and `publish` (pre-encoded messages through the anonymous relay, many unsettled: about 25 µs per
message). The idle connections are tests/many_connections.py's."""
from __future__ import annotations

import select
import socket
import time
from collections import Counter
from typing import Any, Callable, cast

from proton import Collector, Connection, Delivery, Endpoint, Event, Message, Transport, symbol

from haqueue.admin import ADMIN_TOOL, MANAGEMENT_ADDRESS

HOST = "127.0.0.1"
READ_CHUNK = 1 << 20


class AmqpFailure(Exception):
    """The peer closed the connection or a link, or a deadline passed."""


class Engine:
    """One AMQP connection and session. Without `user` there is no SASL layer (a haqueue broker lets such
    clients in as anonymous); with it, SASL PLAIN and the admin-tool mark a backup lets in."""

    def __init__(self, address: str, timeout: float, user: str | None = None, password: str | None = None):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.poller = select.poll()
        self.poller.register(self.sock, select.POLLIN)
        self.conn = Connection()
        self.conn.container = "haqueue-bench-scale"
        self.transport = Transport()
        if user is not None:
            self.conn.user, self.conn.password = user, password or ""
            self.conn.properties = {symbol(ADMIN_TOOL): True}
            sasl = self.transport.sasl()
            sasl.allowed_mechs("PLAIN")
            sasl.allow_insecure_mechs = True  # PLAIN without TLS, as haqueue.admin's client does on loopback
        self.transport.bind(self.conn)
        self.collector = Collector()
        self.conn.collect(self.collector)
        self.conn.open()
        self.session = self.conn.session()
        self.session.open()

    def run(self, done: Callable[[], bool], deadline: float, on_delivery: Callable[[Delivery], None],
            what: str) -> None:
        """Exchange bytes and hand each delivery event to on_delivery until done() (checked after each)."""
        while True:
            ev = self.collector.peek()
            while ev is not None:
                if ev.type == Event.DELIVERY and ev.delivery is not None:
                    on_delivery(ev.delivery)
                self.collector.pop()
                ev = self.collector.peek()
            self._check(what)
            if done():
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise AmqpFailure(f"{what}: not done before the deadline")
            self._io(min(left, 1.0))

    def _io(self, timeout: float) -> None:
        """One wait for the socket: write what proton has (as much as the socket takes), read what came.
        poll, not select: this process may hold thousands of other sockets (the idle connections)."""
        t = self.transport
        self.poller.modify(self.sock, select.POLLIN | (select.POLLOUT if t.pending() > 0 else 0))
        ready = dict(self.poller.poll(timeout * 1000)).get(self.sock.fileno(), 0)
        if ready & select.POLLOUT:
            try:
                t.pop(self.sock.send(t.peek(t.pending()) or b""))
            except BlockingIOError:
                pass
        while ready & (select.POLLIN | select.POLLHUP | select.POLLERR) and t.capacity() > 0:
            try:
                data = self.sock.recv(min(t.capacity(), READ_CHUNK))
            except BlockingIOError:
                break
            except ConnectionError:
                data = b""
            if not data:
                t.close_tail()
                break
            t.push(data)
        t.tick(time.monotonic())  # heartbeats, if the broker asked for them

    def _check(self, what: str) -> None:
        for endpoint in (self.conn, self.session, *self.links()):
            if endpoint.state & Endpoint.REMOTE_CLOSED:
                cond = endpoint.remote_condition
                raise AmqpFailure(f"{what}: {type(endpoint).__name__.lower()} closed by the broker"
                                  + (f": {cond.name} {cond.description}" if cond else ""))
        if self.transport.closed:
            cond = self.transport.condition
            raise AmqpFailure(f"{what}: connection lost" + (f": {cond.name} {cond.description}" if cond else ""))

    def links(self) -> list:
        """The connection's links, whatever their state."""
        link, out = self.conn.link_head(0), []
        while link is not None:
            out.append(link)
            link = link.next(0)
        return out

    def close(self) -> None:
        """Close as a client should (the broker logs an abort otherwise), waiting at most a second."""
        self.conn.close()
        deadline = time.monotonic() + 1.0
        try:
            while not self.conn.state & Endpoint.REMOTE_CLOSED and not self.transport.closed \
                    and time.monotonic() < deadline:
                self._io(0.1)
        except OSError:
            pass
        finally:
            self.sock.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def manage(address: str, requests: list[tuple[str, str, str | None, Any]], window: int, timeout: float,
           user: str | None = None, password: str | None = None) -> list[tuple[int, str, Any]]:
    """Management requests (operation, type, name, body) with up to `window` unanswered; the answers
    (statusCode, statusDescription, body) in the requests' order."""
    deadline = time.monotonic() + timeout
    answers: list[tuple[int, str, Any] | None] = [None] * len(requests)
    sent = answered = 0
    with Engine(address, timeout, user, password) as eng:
        snd = eng.session.sender("scale-management")
        snd.target.address = MANAGEMENT_ADDRESS
        rcv = eng.session.receiver("scale-answers")
        rcv.source.dynamic = True
        snd.open()
        rcv.open()
        rcv.flow(window)
        eng.run(lambda: rcv.remote_source.address is not None, deadline, lambda d: None, "reply address")
        reply_to = rcv.remote_source.address

        def on_delivery(d: Delivery) -> None:
            nonlocal answered
            if d.link.is_receiver and d.readable and not d.partial:
                msg = Message()
                msg.decode(rcv.recv(d.pending) or b"")
                rcv.advance()
                d.update(Delivery.ACCEPTED)
                props: dict[str, Any] = msg.properties or {}
                answers[cast(int, msg.correlation_id)] = (props.get("statusCode", 0),
                                                          props.get("statusDescription", ""), msg.body)
                answered += 1
                rcv.flow(1)
            elif not d.settled:  # our request, settled by the broker: forget it
                return
            d.settle()

        def done() -> bool:
            nonlocal sent
            while snd.credit > 0 and sent < len(requests) and sent - answered < window:
                op, type_, name, body = requests[sent]
                props = {"operation": op, "type": type_, **({"name": name} if name is not None else {})}
                snd.delivery(str(sent))
                snd.stream(Message(id=sent, reply_to=reply_to, properties=props, body=body).encode())
                snd.advance()
                sent += 1
            return answered == len(requests)

        try:
            eng.run(done, deadline, on_delivery, f"{len(requests)} management requests")
        except AmqpFailure as e:
            raise AmqpFailure(f"{e} ({answered} answered)") from e
    return [a for a in answers if a is not None]


def relay_message(address: str, size: int) -> bytes:
    """A durable message of `size` body bytes (one data section) for `address`, encoded once."""
    return Message(address=address, durable=True, body=b"x" * size, inferred=True).encode()


def publish(address: str, messages: list[bytes], inflight: int, timeout: float) -> dict[str, Any]:
    """Pre-encoded messages through the anonymous relay (a sender with no target address), at most
    `inflight` unsettled; counts the broker's outcomes. `seconds`: first send to last settlement."""
    deadline = time.monotonic() + timeout
    outcomes: Counter[str] = Counter()
    sent = 0
    with Engine(address, timeout) as eng:
        snd = eng.session.sender("scale-relay")  # its target has no address: the anonymous relay
        snd.open()
        t0 = time.monotonic()

        def on_delivery(d: Delivery) -> None:
            if d.settled:
                outcomes["accepted" if d.remote_state == Delivery.ACCEPTED else str(d.remote_state)] += 1
                d.settle()

        def done() -> bool:
            nonlocal sent
            while snd.credit > 0 and sent < len(messages) and sent - sum(outcomes.values()) < inflight:
                snd.delivery(str(sent))
                snd.stream(messages[sent])
                snd.advance()
                sent += 1
            return sum(outcomes.values()) == len(messages)

        try:
            eng.run(done, deadline, on_delivery, f"publishing {len(messages)} messages")
        except AmqpFailure as e:
            return {"sent": sent, "outcomes": dict(outcomes), "error": str(e), "seconds": time.monotonic() - t0}
    return {"sent": sent, "outcomes": dict(outcomes), "seconds": time.monotonic() - t0}
