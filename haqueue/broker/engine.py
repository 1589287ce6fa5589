"""The engine: the event loop (loop.py) wired to the sockets (listener.py, connection.py) and to proton
(proton_adapter.py, the only caller of proton's C API). It holds the broker's connections and links and
runs the pass; each pass reads the ready sockets up through their layers, drains proton's collector,
lets the broker dispatch once, then writes every connection that has output. It also keeps the limits
on connections: how many, the handshake deadline, proton's heartbeats.
"""
from __future__ import annotations

import logging
import select
import socket
import ssl
import time
from typing import Final, Protocol

from ..config import LimitsConfig
from . import heap
from .connection import EPOLL_IN, EPOLL_OUT, Connection, ConnectionHandler
from .connection_limits import PEER_ROOM, ConnectionLimits, raise_descriptor_limit
from .errors import RESOURCE_LIMIT, BrokerError
from .listener import Listener
from .loop import Loop
from .pass_end import PassEnd
from .password_checks import Logins, PasswordChecks
from .proton_adapter import Link, LinkHandler, ProtonEvents
from .receive_credit import ReceiveShare
from .refusal_log import RefusalLog
from .sasl import SaslClient

log = logging.getLogger("haqueue.engine")

_READABLE: Final = select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR | select.EPOLLRDHUP

# What one pass reads: a socket at most READ_SIZE, all the sockets ready in it PASS_READ between them
# (each at least MIN_READ, in the order the loop reports them, which epoll rotates). A pass's messages
# (its working set of deliveries, entries and frames) stay about as many with twenty busy connections as
# with two: a budget per socket alone made each pass ten times larger there and every message dearer.
# A cluster's primary reads as before (the backups' acknowledgements are small), its replication
# batched per pass (design/performance.md).
READ_SIZE: Final = 256 * 1024
PASS_READ: Final = 512 * 1024
MIN_READ: Final = 16 * 1024


class EngineHandler(Protocol):
    """What the engine asks of the broker."""

    def connection_opened(self, conn: Connection) -> None: ...  # raise BrokerError to refuse
    def connection_closed(self, conn: Connection) -> None: ...
    def link_opened(self, link: Link) -> LinkHandler: ...  # raise BrokerError to refuse


class Engine(Loop):
    """The event loop with its sockets and proton's transports."""

    def __init__(self, handler: EngineHandler, pass_end: PassEnd, limits: LimitsConfig, container_id: str,
                 logins: Logins, anonymous: bool) -> None:
        super().__init__()
        self.handler = handler
        self.pass_end = pass_end
        self.limits = limits
        self.output_buffer = limits.output_buffer  # asked at every delivery (Link.output_full): a native int here
        self.container_id = container_id.encode()
        self.password_checks = PasswordChecks(logins, self.call_soon_threadsafe)
        self.refusal_log = RefusalLog(log)
        self.anonymous = anonymous
        self.connection_limits = ConnectionLimits(limits, raise_descriptor_limit())
        self._closed_since_trim = 0  # connections gone since the heap's free memory was last given back
        self.events = ProtonEvents(self)
        self.listeners: dict[int, Listener] = {}
        self.connections: dict[int, Connection] = {}  # by fd
        self.links: dict[int, Link] = {}  # by address
        self.dirty: set[Connection] = set()
        self.receive_share = ReceiveShare()  # the credit of the links receiving at once
        # What the broker's open offers its clients (a plug-in's: SHARED-SUBS, messaging/subscriptions.py)
        self.offered_capabilities: list[str] = []

    # -- set-up ------------------------------------------------------------------------------
    def listen(self, listener: Listener) -> None:
        self.listeners[listener.sock.fileno()] = listener
        self.epoll.register(listener.sock.fileno(), select.EPOLLIN)

    def connect(self, host: str, port: int, handler: ConnectionHandler, user: str | None = None,
                password: str | None = None, idle_timeout: float = 0.0,
                tls: ssl.SSLContext | None = None) -> Connection:
        """An outgoing connection (HA peers), over TLS with `tls`. handler.on_open once the peer has opened;
        on_closed when it goes."""
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.connect_ex((host, port))
        conn = Connection(self, sock, f"{host}:{port}", None, client=handler, sasl_client=SaslClient(user, password),
                          tls=tls)
        conn.proton.identify(self.container_id, host, idle_timeout)
        self.connections[conn.fd] = conn
        self.events.by_ptr[conn.proton.ptr] = conn
        self.dirty.add(conn)
        return conn

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        self.every(0.1, self._tick_connections)
        self.every(heap.TRIM_INTERVAL, self._trim_heap)
        self.serve(self._one_pass)

    def _one_pass(self) -> None:
        left = PASS_READ
        for fd, mask in self.wait(bool(self.dirty) or self.pass_end.pending()):
            conn = self.connections.get(fd)
            if conn is not None:
                if mask & _READABLE:
                    left -= conn.read(min(READ_SIZE, max(left, MIN_READ)))
                if mask & EPOLL_OUT:
                    self.dirty.add(conn)
            elif fd in self.listeners:
                self._accept(self.listeners[fd])
        self.run_thread_callbacks()
        self.events.drain()
        try:
            self.pass_end.after_pass()
        except Exception:
            log.exception("dispatch failed")
        self.events.drain()
        if self.timers_due():
            self.run_timers()
            self.events.drain()
        while self.dirty:
            self._before_flush()
            dirty, self.dirty = self.dirty, set()
            for conn in dirty:
                conn.flush()
            self.events.drain()

    def _before_flush(self) -> None:
        """The last step before output leaves (a confirmation, a settlement): the flush hooks, once per round of
        flushing, so what they write reaches the OS first."""
        try:
            self.pass_end.before_flush()
        except Exception:
            log.exception("before_flush failed")

    def _tick_connections(self) -> None:
        now_ms = int(time.monotonic() * 1000)
        for conn in list(self.connections.values()):
            if conn.handshake_deadline and conn.handshake_deadline <= now_ms:
                self._handshake_expired(conn)
            elif conn.next_tick <= now_ms:
                conn.tick(now_ms)

    def _trim_heap(self) -> None:
        if self._closed_since_trim >= heap.TRIM_AFTER:
            self._closed_since_trim = 0
            heap.release_free_memory()

    def handshake_progress(self, conn: Connection) -> None:
        """The client's first byte, or a step of its handshake done (a whole protocol header, the SASL exchange):
        from now it has limits.handshake_timeout for the next. A client slow because it is handshaking thousands
        of connections at once (a reconnect storm from one process) keeps going; one dribbling a step's bytes
        is still cut at handshake_timeout, so a handshake is bounded by four of them (header, SASL, header, open)."""
        conn.first_byte_due = False
        conn.handshake_deadline = int(time.monotonic() * 1000) + int(self.limits.handshake_timeout * 1000)

    def _handshake_expired(self, conn: Connection) -> None:
        """limits.handshake_timeout: a client that has not finished a step of its handshake by now is dropped,
        however slowly it was still sending (a slow-loris holds a socket and a transport for nothing); a socket
        that sent nothing at all, once silent for limits.idle_timeout."""
        if conn.first_byte_due:
            log.info("connection %s closed: nothing received within %g s (limits.idle_timeout)", conn.peer,
                     self._silence_ms() / 1000)
        else:
            log.info("connection %s closed: no progress within %g s (limits.handshake_timeout); it was still in %s",
                     conn.peer, self.limits.handshake_timeout, conn.handshake_stage())
        conn.abort()

    def _silence_ms(self) -> int:
        """How long an accepted socket may stay silent before its first byte: idle_timeout, as an open
        connection may (never less than handshake_timeout). The handshake's own clock starts at that byte, so
        clients that open many sockets before writing to any (a proton Container's connects, a reconnect storm)
        are not dropped for their own slowness while the broker waits idle."""
        silence = max(self.limits.idle_timeout, self.limits.handshake_timeout)
        return int(silence * 1000)

    # -- connections and links -----------------------------------------------------------------
    def _accept(self, listener: Listener) -> None:
        for sock, peer in listener.accept():
            if len(self.connections) >= self.connection_limits.max_sockets:
                self._turn_away(sock, peer)
                continue
            conn = Connection(self, sock, peer, listener)
            refusal = self.connection_limits.accepted(conn.host)
            if refusal is not None:
                conn.refusal = BrokerError(RESOURCE_LIMIT, refusal)
            self.connections[conn.fd] = conn
            self.events.by_ptr[conn.proton.ptr] = conn
            self.epoll.register(conn.fd, EPOLL_IN)
            now_ms = int(time.monotonic() * 1000)
            conn.first_byte_due = True
            conn.handshake_deadline = now_ms + self._silence_ms()
            conn.tick(now_ms)

    def _turn_away(self, sock: socket.socket, peer: str) -> None:
        """Every socket the broker takes is open (ConnectionLimits.max_sockets): this one is closed at once, before
        it costs a transport, so that the descriptors left stay the broker's own (design/security.md)."""
        sock.close()
        self.refusal_log(logging.WARNING, peer, "no room", "connection %s refused: %d connections open, the most this "
                         "broker takes (%s, and %d for peers and handshakes)", peer, len(self.connections),
                         self.connection_limits.clients_limit(), PEER_ROOM)

    def forget_connection(self, conn: Connection) -> None:
        self.connections.pop(conn.fd, None)
        self.events.by_ptr.pop(conn.proton.ptr, None)
        self.dirty.discard(conn)
        if conn.listener is not None:
            self.connection_limits.closed(conn.host, conn.user if conn.logged_in else None)
        self._closed_since_trim += 1
        try:
            self.epoll.unregister(conn.fd)
        except (OSError, ValueError):
            pass
        try:
            if conn.client is not None:
                conn.client.on_closed(conn, conn.client_error or "connection closed")
            elif conn.attachment is not None:
                self.handler.connection_closed(conn)
        except Exception:
            log.exception("connection close handler failed")

    def forget_link(self, link: Link) -> None:
        if self.links.pop(link.addr, None) is None:
            return
        link.conn.links.pop(link.addr, None)
        self.receive_share.forget(link.addr)
        link.closed = True
        handler, link.handler = link.handler, None  # its handler keeps the link, not the other way: no cycle
        if handler is not None:
            try:
                handler.on_detach()
            except Exception:
                log.exception("link detach handler failed")

    def shutdown(self) -> None:
        """Close every connection (telling clients the broker is going away) and write what is left."""
        for conn in list(self.connections.values()):
            conn.close("amqp:connection:forced", "broker shutting down")
        deadline = time.monotonic() + 2.0
        while self.connections and time.monotonic() < deadline:
            self._before_flush()
            for conn in list(self.connections.values()):
                conn.flush()
                if conn.closing and conn.backlog() == 0:
                    conn.abort()
            if self.connections:
                self.epoll.poll(0.05)
        for conn in list(self.connections.values()):
            conn.abort()
        for listener in self.listeners.values():
            listener.sock.close()
