"""Client-side helpers for the integration tests: real proton clients over real sockets.

`Client`       a proton BlockingConnection with helpers: senders, receivers that keep the raw
               bytes of each delivery and never grant credit on their own, `send`, `drain`,
               management requests (`mgmt`), and `roundtrip()` (a request answered on the same
               connection, so the broker has processed every frame sent before it).
`RawAmqp`      a socket driven by a bare proton Transport (no reactor), for what a well-behaved
               client never does: go silent, send garbage, send oversized frames, open thousands
               of links without waiting.

Every wait here is bounded.
"""
from __future__ import annotations

import collections
import itertools
import select
import socket
import struct
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from proton import (Collector, Connection, Delivery, Endpoint, Handler, Message, SSLDomain,
                    Timeout, Transport)
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender

DEFAULT_TIMEOUT = 10.0
MANAGEMENT_ADDRESS = "$management"


def url_of(target: Any, index: int = 0) -> str:
    """A URL for a BrokerProcess (listener `index`), a ``HOST:PORT`` string or a URL."""
    if hasattr(target, "url"):
        return target.url(index)
    text = str(target)
    return text if "://" in text else f"amqp://{text}"


# ---------------------------------------------------------------------------------------------
# Receiving

@dataclass
class Received:
    """One complete incoming delivery: the decoded message, its delivery and its raw bytes."""
    message: Message
    delivery: Delivery
    raw: bytes

    @property
    def body(self) -> Any:
        if self.message is None:
            raise AssertionError(f"received bytes that are not an AMQP message: {self.raw[:64]!r}")
        return self.message.body


class _ReceiverHandler(Handler):
    """Collects complete deliveries with their bytes; records a remote detach instead of raising."""

    def __init__(self, wake: Callable[[], None]):
        super().__init__()
        self.incoming: collections.deque[Received] = collections.deque()
        self.remote_closed = False
        self.remote_condition = None
        self._wake = wake

    def on_delivery(self, event):
        d = event.delivery
        link = d.link
        if not link.is_receiver or not d.readable or d.partial:
            return
        data = link.recv(d.pending) or b""
        while d.pending:  # pending can exceed what one recv returns
            more = link.recv(d.pending)
            if not more:
                break
            data += more
        link.advance()
        msg = Message()
        try:
            msg.decode(data)
        except Exception:  # not a valid AMQP message: keep the bytes, the test decides
            msg = None
        self.incoming.append(Received(msg, d, data))
        self._wake()

    def on_link_remote_close(self, event):
        self.remote_closed = True
        self.remote_condition = event.link.remote_condition
        if event.link.state & Endpoint.LOCAL_ACTIVE:
            event.link.close()


class Receiver:
    """A receiving link that grants credit only when asked (`flow`, `drain`, or `receive`'s `credit`)."""

    def __init__(self, client: "Client", blocking: BlockingReceiver, handler: _ReceiverHandler):
        self.client = client
        self.blocking = blocking
        self.link = blocking.link
        self.handler = handler

    # -- credit
    def flow(self, n: int) -> None:
        self.link.flow(n)
        self.client.process()

    @property
    def credit(self) -> int:
        return self.link.credit

    def drain(self, n: int, timeout: float = DEFAULT_TIMEOUT) -> list[Received]:
        """Grant `n` with drain set; wait until the broker has used or returned all credit.

        Returns what arrived meanwhile."""
        self.link.drain(n)
        # done when the broker has answered the drain and every delivery it sent is read
        self.client.wait(lambda: (not self.link.draining() and self.link.queued == 0)
                         or self.handler.remote_closed, timeout, "drain to complete")
        out = list(self.handler.incoming)
        self.handler.incoming.clear()
        return out

    # -- messages
    @property
    def address(self) -> str | None:
        return self.link.remote_source.address

    @property
    def available(self) -> int:
        return len(self.handler.incoming)

    def receive(self, timeout: float = DEFAULT_TIMEOUT, credit: bool = True) -> Received:
        """The next delivery. With `credit` (default), grants 1 if the link has none left."""
        if credit and not self.handler.incoming and self.link.credit == 0:
            self.link.flow(1)
        self.client.wait(lambda: self.handler.incoming or self.handler.remote_closed,
                         timeout, f"a message on {self.address}")
        if not self.handler.incoming:
            raise AssertionError(f"receiver {self.address} detached: {self.handler.remote_condition}")
        return self.handler.incoming.popleft()

    def receive_n(self, n: int, timeout: float = DEFAULT_TIMEOUT, settle: str | None = "accept",
                  credit: bool = True) -> list[Received]:
        """`n` deliveries, in order of arrival; each settled with `settle` (None: left unsettled).

        With `credit`, tops the link up so that `n` can arrive."""
        if credit:
            need = n - len(self.handler.incoming) - self.link.credit
            if need > 0:
                self.link.flow(need)
        self.client.wait(lambda: len(self.handler.incoming) >= n or self.handler.remote_closed,
                         timeout, f"{n} messages on {self.address} (have {len(self.handler.incoming)})")
        if len(self.handler.incoming) < n:
            raise AssertionError(f"receiver {self.address} detached after "
                                 f"{len(self.handler.incoming)} of {n}: {self.handler.remote_condition}")
        out = [self.handler.incoming.popleft() for _ in range(n)]
        if settle:
            for r in out:
                self.settle(r, settle)
        return out

    def expect_nothing(self, window: float = 0.5) -> None:
        """Assert that nothing arrives within `window` seconds (a bounded observation, not a sync)."""
        self.client.wait(lambda: bool(self.handler.incoming), window, None, raise_on_timeout=False)
        if self.handler.incoming:
            r = self.handler.incoming[0]
            raise AssertionError(f"unexpected message on {self.address}: {r.message}")

    # -- dispositions
    def settle(self, r: Received, outcome: str = "accept", *, failed: bool = False,
               undeliverable: bool = False, annotations: dict | None = None) -> None:
        """Settle `r` with accept, release, reject or modify, then flush it to the broker."""
        d = r.delivery
        if outcome == "accept":
            d.update(Delivery.ACCEPTED)
        elif outcome == "release":
            d.update(Delivery.RELEASED)
        elif outcome == "reject":
            d.update(Delivery.REJECTED)
        elif outcome == "modify":
            d.local.failed = failed
            d.local.undeliverable = undeliverable
            if annotations:
                d.local.annotations = annotations
            d.update(Delivery.MODIFIED)
        else:
            raise ValueError(outcome)
        d.settle()
        self.client.process()

    def accept(self, r: Received) -> None:
        self.settle(r, "accept")

    def release(self, r: Received) -> None:
        self.settle(r, "release")

    def reject(self, r: Received) -> None:
        self.settle(r, "reject")

    def modify(self, r: Received, failed: bool = False, undeliverable: bool = False) -> None:
        self.settle(r, "modify", failed=failed, undeliverable=undeliverable)

    @property
    def remote_condition(self):
        return self.handler.remote_condition

    def close(self) -> None:
        if self.link.state & Endpoint.LOCAL_ACTIVE:
            self.link.close()
        self.client.wait(lambda: not (self.link.state & Endpoint.REMOTE_ACTIVE), DEFAULT_TIMEOUT,
                         "receiver detach")


# ---------------------------------------------------------------------------------------------
# The client

class ManagementError(AssertionError):
    def __init__(self, status: int, description: str, reply: Message):
        super().__init__(f"{status} {description}")
        self.status = status
        self.description = description
        self.reply = reply


@dataclass
class MgmtReply:
    status: int
    description: str
    body: Any
    message: Message


class Client:
    """A proton BlockingConnection with test helpers.

    `target` is a BrokerProcess, ``HOST:PORT`` or URL; `listener` selects the broker's listener.
    Extra keyword arguments go to BlockingConnection / Container.connect: `user`, `password`,
    `sasl_enabled`, `allowed_mechs`, `allow_insecure_mechs`, `ssl_domain`, `heartbeat`,
    `max_frame_size`...
    """

    _ids = itertools.count(1)

    def __init__(self, target: Any, listener: int = 0, timeout: float = DEFAULT_TIMEOUT, **kwargs):
        self.url = url_of(target, listener)
        self.timeout = timeout
        self.conn = BlockingConnection(self.url, timeout=timeout, **kwargs)
        self._mgmt_sender: BlockingSender | None = None
        self._mgmt_receiver: Receiver | None = None
        self._senders: dict[str, BlockingSender] = {}

    # -- event processing
    @property
    def connection(self) -> Connection:
        return self.conn.conn

    @property
    def transport(self) -> Transport:
        return self.conn.conn.transport

    def process(self) -> None:
        """Let the container do pending I/O without blocking long."""
        container = self.conn.container
        saved = container.timeout
        container.timeout = 0.0
        try:
            container.process()
        finally:
            container.timeout = saved

    def wait(self, condition: Callable[[], Any], timeout: float | None = None, what: str | None = None,
             raise_on_timeout: bool = True) -> bool:
        """Process events until `condition()` is true, at most `timeout` seconds."""
        timeout = self.timeout if timeout is None else timeout
        try:
            self.conn.wait(condition, timeout=timeout, msg=what)
            return True
        except Timeout:
            if raise_on_timeout:
                raise
            return False

    def idle(self, seconds: float) -> None:
        """Keep processing I/O (heartbeats) for `seconds`, expecting nothing."""
        self.wait(lambda: False, seconds, None, raise_on_timeout=False)

    # -- links
    def _link_name(self, role: str, address: str | None) -> str:
        # proton names links CONTAINER-ADDRESS by default: two at once to one address would clash
        return f"{role}-{address or 'anonymous'}-{next(self._ids)}"

    def sender(self, address: str | None, name: str | None = None, options=None) -> BlockingSender:
        return self.conn.create_sender(address, name=name or self._link_name("snd", address), options=options)

    def receiver(self, address: str | None = None, credit: int = 0, dynamic: bool = False,
                 name: str | None = None, options=None) -> Receiver:
        """A receiver from `address` that holds `credit` (granted once; never topped up)."""
        handler = _ReceiverHandler(self.conn.container.yield_)
        blocking = self.conn.create_receiver(address, credit=0, dynamic=dynamic, handler=handler,
                                             name=name or self._link_name("rcv", address), options=options)
        r = Receiver(self, blocking, handler)
        if credit:
            r.flow(credit)
        return r

    def _sender_to(self, address: str | None) -> BlockingSender:
        """This client's one open link to `address`."""
        key = address or ""
        snd = self._senders.get(key)
        if snd is None or not (snd.link.state & Endpoint.LOCAL_ACTIVE):
            snd = self._senders[key] = self.sender(address)
        return snd

    def publish(self, address: str | None, messages: Iterable[Message | Any]) -> list[Delivery]:
        """Send each message (non-Message values become bodies) on one link to `address` and return its
        deliveries, unsettled: for publishes whose confirmation a test watches for (or must never see)."""
        snd = self._sender_to(address)
        return [snd.link.send(m if isinstance(m, Message) else Message(body=m)) for m in messages]

    def send(self, address: str | None, messages: Iterable[Message | Any], check: bool = True,
             timeout: float | None = None) -> list[Delivery]:
        """Send each message (non-Message values become bodies) on one link to `address`; wait until
        the broker has settled all of them. With `check`, a reject/release raises AssertionError."""
        snd = self._sender_to(address)
        deliveries = self.publish(address, messages)
        self.wait(lambda: all(d.settled for d in deliveries) or snd.link.state & Endpoint.REMOTE_CLOSED,
                  timeout, f"settlement of {len(deliveries)} messages to {address}")
        for d in deliveries:
            if not d.settled and snd.link.state & Endpoint.REMOTE_CLOSED:
                raise AssertionError(f"sender to {address} detached: {snd.link.remote_condition}")
            d.settle()
        if check:
            bad = [d for d in deliveries if d.remote_state != Delivery.ACCEPTED]
            if bad:
                d = bad[0]
                cond = d.remote.condition
                raise AssertionError(f"{len(bad)} of {len(deliveries)} messages to {address} not accepted;"
                                     f" first: {d.remote_state} {cond}")
        return deliveries

    def send_one(self, address: str | None, message: Message | Any) -> Delivery:
        """Send one message and return its settled delivery, whatever the outcome."""
        return self.send(address, [message], check=False)[0]

    def send_raw(self, address: str, payload: bytes, timeout: float | None = None) -> Delivery:
        """Send already-encoded message bytes as one delivery; wait for its settlement."""
        snd = self.sender(address)
        d = snd.link.delivery(str(next(self._ids)))
        snd.link.stream(payload)
        snd.link.advance()
        self.wait(lambda: d.settled, timeout, f"settlement of a raw message to {address}")
        d.settle()
        return d

    # -- management
    def mgmt(self, operation: str, type: str, name: str | None = None, body: Any = None,
             expect: int | Iterable[int] | None = (200, 201, 204), timeout: float | None = None,
             **props) -> MgmtReply:
        """One `$management` request; returns the reply. A status outside `expect` raises
        ManagementError (pass expect=None to get any reply)."""
        if self._mgmt_sender is None:
            self._mgmt_sender = self.sender(MANAGEMENT_ADDRESS)
            self._mgmt_receiver = self.receiver(None, dynamic=True, credit=0)
        rcv = self._mgmt_receiver
        app = {"operation": operation, "type": type}
        if name is not None:
            app["name"] = name
        app.update(props)
        request_id = f"req-{uuid.uuid4()}"
        request = Message(id=request_id, reply_to=rcv.address, properties=app, body=body)
        self._mgmt_sender.send(request, timeout=self.timeout if timeout is None else timeout)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            left = max(0.01, deadline - time.monotonic())
            r = rcv.receive(timeout=left)
            rcv.accept(r)
            if r.message is not None and r.message.correlation_id == request_id:
                break
        reply = r.message
        ap = reply.properties or {}
        status = int(ap.get("statusCode", 0))
        desc = str(ap.get("statusDescription", ""))
        if expect is not None:
            allowed = {expect} if isinstance(expect, int) else set(expect)
            if status not in allowed:
                raise ManagementError(status, desc, reply)
        return MgmtReply(status, desc, reply.body, reply)

    def queue_depth(self, name: str) -> int:
        return int(self.mgmt("READ", "queue", name).body["depth"])

    def queue_names(self) -> list[str]:
        return [q["name"] for q in self.mgmt("QUERY", "queue").body]

    def roundtrip(self) -> None:
        """A request answered on this connection: every frame sent before it has been processed."""
        self.mgmt("READ", "broker")

    # -- state
    @property
    def remote_max_frame_size(self) -> int:
        return self.transport.remote_max_frame_size

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            finally:
                self.conn = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.close()
        except Exception:
            if exc[0] is None:
                raise


def make_messages(n: int, prefix: str = "m", **fields) -> list[Message]:
    """`n` messages with bodies ``PREFIX-0`` ... and ids ``PREFIX-i``."""
    return [Message(id=f"{prefix}-{i}", body=f"{prefix}-{i}", **fields) for i in range(n)]


def bodies(received: Iterable[Received]) -> list[Any]:
    return [r.message.body for r in received]


def client_ssl_domain(ca_file: str, verify_hostname: bool = True) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(ca_file)
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME if verify_hostname else SSLDomain.VERIFY_PEER,
                                   ca_file)
    return domain


# ---------------------------------------------------------------------------------------------
# A bare transport over a socket

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"


def _wait(sock: socket.socket, events: int, timeout: float) -> bool:
    """Whether the socket is ready within timeout (poll, not select: a test may hold over 1024 sockets)."""
    poller = select.poll()
    poller.register(sock, events)
    return bool(poller.poll(timeout * 1000))


class RawAmqp:
    """A proton Connection + Transport pumped by hand over a blocking socket.

    Nothing happens unless the test calls `pump`, so the client can go silent at will, and
    `send_bytes` writes anything at all on the socket (after flushing what the transport had).
    """

    def __init__(self, host: str, port: int, *, sasl: bool = False, idle_timeout: float | None = None,
                 max_frame_size: int | None = None, container_id: str | None = None):
        self.sock = socket.create_connection((host, port), timeout=DEFAULT_TIMEOUT)
        self.sock.setblocking(False)
        self.transport = Transport()
        if max_frame_size:
            self.transport.max_frame_size = max_frame_size
        if idle_timeout:
            self.transport.idle_timeout = idle_timeout
        if sasl:
            self.transport.sasl().allowed_mechs("ANONYMOUS")
        self.conn = Connection()
        self.conn.container = container_id or f"raw-{uuid.uuid4()}"
        self.conn.hostname = host
        self.collector = Collector()
        self.conn.collect(self.collector)
        self.transport.bind(self.conn)
        self.eof = False
        self.received = bytearray()  # every byte read from the broker

    def open(self) -> None:
        self.conn.open()

    def _flush(self) -> None:
        while True:
            n = self.transport.pending()
            if n <= 0:
                return
            data = self.transport.peek(n)
            try:
                sent = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                _wait(self.sock, select.POLLOUT, 0.05)
                continue
            except OSError:
                self.transport.close_head()
                return
            self.transport.pop(sent)

    def _read(self, wait: float) -> None:
        if not _wait(self.sock, select.POLLIN, wait):
            return
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.eof = True
            self.transport.close_tail()
            return
        self.received += data
        view = memoryview(data)
        while len(view):
            cap = self.transport.capacity()
            if cap <= 0:
                break  # the transport has stopped reading (closed): drop the rest
            self.transport.push(bytes(view[:cap]))
            view = view[cap:]

    def pump(self, until: Callable[[], Any] | None = None, timeout: float = DEFAULT_TIMEOUT,
             tick: bool = True) -> bool:
        """Exchange bytes until `until()` is true or the socket is at EOF; at most `timeout` s.

        Returns whether `until()` became true. Without `until`, pumps for `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            if tick:
                self.transport.tick(time.monotonic())
            self._flush()
            while self.collector.peek():
                self.collector.pop()
            if until is not None and until():
                return True
            if self.eof:
                return bool(until and until())
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._read(min(left, 0.05))

    def wait_open(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        ok = self.pump(lambda: self.conn.state & Endpoint.REMOTE_ACTIVE, timeout)
        if not ok:
            raise AssertionError(f"connection not opened by the broker; condition {self.condition}")

    def send_part_of_a_message(self, name: str, address: str, sent: int) -> None:
        """Attach sender `name` to `address` and send the first `sent` bytes of a 1 MB message, then stop:
        a message the broker holds part of."""
        session = self.conn.session()
        session.open()
        snd = session.sender(name)
        snd.target.address = address
        snd.open()
        self.pump(lambda: snd.credit > 0, timeout=10)
        snd.delivery(f"d-{name}")
        snd.stream(Message(body=b"p" * 1_000_000).encode()[:sent])

    def send_bytes(self, data: bytes) -> None:
        """Write `data` on the socket as is (after what the transport already had to send)."""
        self._flush()
        self.sock.setblocking(True)
        try:
            self.sock.sendall(data)
        finally:
            self.sock.setblocking(False)

    def read_until_eof(self, timeout: float = DEFAULT_TIMEOUT) -> bool:
        """Read raw bytes (into `received`, without the transport) until EOF; True if EOF came."""
        deadline = time.monotonic() + timeout
        while not self.eof and time.monotonic() < deadline:
            r = _wait(self.sock, select.POLLIN, 0.05)
            if not r:
                continue
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:
                self.eof = True
            else:
                self.received += data
        return self.eof

    @property
    def condition(self):
        """The broker's close condition, else the transport's error condition."""
        return self.conn.remote_condition or self.transport.condition

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "RawAmqp":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def frame(body: bytes, channel: int = 0, frame_type: int = 0) -> bytes:
    """An AMQP frame: 8-byte header (size, doff=2, type, channel) + body."""
    return struct.pack(">IBBH", 8 + len(body), 2, frame_type, channel) + body
