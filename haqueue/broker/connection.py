"""One socket the engine serves and its layers, bottom up: TLS (tls_pump.py), the protocol headers and
SASL before AMQP (preamble.py), then proton's transport (proton_adapter.py). What the socket reads goes
up through them; `flush` writes what they have for it. A closing connection is dropped once its output
is written.
"""
from __future__ import annotations

import logging
from logging import WARNING
import select
import socket
import ssl
from typing import Any, Final, Protocol, TYPE_CHECKING

from .errors import BrokerError, FRAMING_ERROR
from .preamble import Preamble
from .proton_adapter import WRITE_CLOSED, WRITE_FAILED, WRITE_FULL, WRITTEN, Link, LinkHandler, ProtonConnection
from .sasl import SaslClient
from .tls_pump import TlsPump

if TYPE_CHECKING:
    from .engine import Engine
    from .listener import Listener

log = logging.getLogger("haqueue.engine")

EPOLL_IN: Final = select.EPOLLIN | select.EPOLLRDHUP
EPOLL_OUT: Final = select.EPOLLOUT


class ConnectionHandler(Protocol):
    """The owner of one of the broker's own outgoing connections."""

    def on_open(self, conn: "Connection") -> None: ...
    def on_closed(self, conn: "Connection", reason: str) -> None: ...


class Connection:
    """One socket: an optional TLS layer, the broker's SASL layer, then proton's transport."""

    def __init__(self, engine: "Engine", sock: socket.socket, peer: str, listener: "Listener | None",
                 client: ConnectionHandler | None = None, sasl_client: SaslClient | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.engine = engine
        self.sock = sock
        self.fd = sock.fileno()
        self.listener = listener
        self.client = client  # set for the broker's own outgoing connections
        self.peer = peer
        self.host = peer.rpartition(":")[0]  # the source address, as the per-address limit counts it
        max_frame_size: int | None = None  # a client's: proton's default
        if client is None:
            assert listener is not None
            max_frame_size = listener.options.max_frame_size
        self.proton = ProtonConnection(engine.events.collector, max_frame_size, int(engine.limits.idle_timeout * 1000),
                                       engine.limits.max_message_size if client is None else 0)
        self.phase = "header"  # header -> sasl -> amqp
        self.preamble: Preamble | None = Preamble(self, sasl_client)  # None once the connection is gone
        self.user: str | None = None
        self.logged_in = False  # admitted at open by ConnectionLimits.opened, counted (unless exempt) until closed
        self.handshake_deadline = 0  # ms (monotonic): closed unless the client opens by then; 0: opened
        self.first_byte_due = False  # accepted, nothing received yet: the deadline is silence's (Engine._accept)
        self.tls: TlsPump | None = None
        self.raw_out = bytearray()  # bytes for the socket that did not come from proton directly
        self.writing = False  # registered for EPOLLOUT
        self.closing = False
        self.closed = False
        self.refusal: BrokerError | None = None  # what to close with at open
        self.next_tick = 0
        self.sessions = 0
        self.links: dict[int, Link] = {}  # by address
        self.output_waiters: set[Link] = set()  # links held back by a full output (Link.output_full)
        self.remote_container = ""
        self.attachment: Any = None  # the broker's per-connection state
        self.client_error: str | None = None  # why an outgoing connection failed
        context = listener.tls_context if listener is not None else tls
        if context is not None:
            self.tls = TlsPump(context, client is None, self._emit)
        if sasl_client is not None:
            self.phase = "sasl"
            if self.tls is not None:
                self.tls.step()  # the client speaks first: its hello
            self.write_plain(sasl_client.greeting())
            self.writing = True  # flush once the non-blocking connect completes
            engine.epoll.register(self.fd, EPOLL_IN | EPOLL_OUT)

    # -- input -------------------------------------------------------------------------------
    def read(self, budget: int) -> int:
        """Read what the socket has (the loop saw it readable), about `budget` bytes at most, up through the
        layers; what is left is read in the next pass. Returns the bytes read."""
        if self.phase == "amqp" and self.tls is None:  # the socket straight into proton's buffer
            n = self.proton.read(self.fd, budget)
            if n == -2:
                self._unreadable()
                n = 0
            elif n < 0:
                self.input_closed()
            self.engine.dirty.add(self)
            return max(n, 0)
        try:
            data = self.sock.recv(budget)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:
            data = b""
        if not data:
            self.input_closed()
            return 0
        phase = self.phase
        try:
            self.received(data)
        except Exception:  # what a peer sends must never stop the loop: drop that peer alone
            log.exception("connection %s dropped: its input could not be handled", self.peer)
            self.abort()
        if self.handshake_deadline and (self.first_byte_due or self.phase != phase):
            self.engine.handshake_progress(self)
        return len(data)

    def received(self, data: bytes) -> None:
        if self.phase == "refused":
            return
        if self.tls is not None:
            try:
                data = self.tls.decrypt(data)
            except ssl.SSLError as e:
                self._tls_failed(e)
                return
            if not data:
                return
        if self.phase != "amqp":
            if self.preamble is None:  # gone with the connection
                return
            data = self.preamble.feed(data)
        if data:
            self.push(data)

    def _tls_failed(self, error: ssl.SSLError) -> None:
        """Refuse the connection, after sending TLS's alert so that the peer learns why too."""
        assert self.tls is not None
        what = "TLS error" if self.tls.ready else "TLS handshake failed"
        if self.client is not None:
            self.client_error = f"{what}: {error}"
            self.engine.refusal_log(WARNING, self.peer, f"{what}: {error}", "connection to %s: %s: %s", self.peer,
                                    what, error)
        else:
            self.engine.refusal_log(WARNING, self.peer, f"{what}: {error}", "connection %s refused: %s: %s",
                                    self.peer, what, error)
        self.phase = "refused"
        self.tls.pump()
        self.close_after_write()

    def handshake_stage(self) -> str:
        """Where a connection that has not opened yet stands, for the log."""
        if self.tls is not None and not self.tls.ready:
            return "the TLS handshake"
        return {"sasl": "the SASL exchange", "amqp": "the open frame"}.get(self.phase, "the protocol header")

    def push(self, data: bytes) -> None:
        """Bytes of AMQP for proton."""
        if not self.proton.push(data):
            self._unreadable()
        self.engine.dirty.add(self)

    def _unreadable(self) -> None:
        """Input the reader cannot follow (ProtonConnection.failure): closed with a framing error saying so."""
        if not self.closing:
            why = self.proton.failure()
            log.warning("connection %s closed: %s", self.peer, why)
            self.close(FRAMING_ERROR, why)

    def input_closed(self) -> None:
        if self.phase == "amqp":
            self.proton.close_tail()
            self.engine.dirty.add(self)
        else:
            self.abort()

    # -- output ------------------------------------------------------------------------------
    def _emit(self, data: bytes) -> None:
        """Bytes TLS made for the socket."""
        self.raw_out += data
        self.engine.dirty.add(self)

    def write_plain(self, data: bytes) -> None:
        """Bytes of the pre-AMQP layers (headers, SASL frames), through TLS when it is on."""
        if self.tls is None:
            self.raw_out += data
        else:
            self.tls.write(data)
        self.engine.dirty.add(self)

    def backlog(self) -> int:
        return max(self.proton.pending(), 0) + len(self.proton.left) - self.proton.left_at + len(self.raw_out)

    def flush(self) -> None:
        """Write what the layers have; register for EPOLLOUT when the socket is full."""
        if self.closed:
            return
        engine = self.engine
        blocked = False
        plain = self.phase == "amqp" and self.tls is None and not self.raw_out
        over = False  # plain: the transport is closed and all of it written
        if plain:
            status = self.proton.write(self.fd)  # proton's frames, many to a send
            if status == WRITE_FAILED:
                self.abort()
                return
            blocked = status == WRITE_FULL
            over = status == WRITE_CLOSED or (self.closing and status == WRITTEN)
        elif self.phase == "amqp":  # through TLS, or after bytes that wait in raw_out
            proton = self.proton
            while True:
                chunk = proton.peek_output()
                if not chunk:
                    break
                if self.tls is not None:
                    self.tls.write(chunk)
                else:
                    self.raw_out += chunk
                proton.pop_output(len(chunk))
        if self.raw_out and not blocked:
            try:
                sent = self.sock.send(self.raw_out)
            except BlockingIOError:
                sent = 0
            except OSError:
                self.abort()
                return
            del self.raw_out[:sent]
            blocked = bool(self.raw_out)
        if blocked != self.writing:
            self.writing = blocked
            engine.epoll.modify(self.fd, EPOLL_IN | (EPOLL_OUT if blocked else 0))
        if not blocked and (over if plain else self._finished()):
            self.abort()
            return
        if self.output_waiters and self.backlog() <= engine.output_buffer:
            waiters, self.output_waiters = self.output_waiters, set()
            for link in waiters:
                if link.handler is not None and not link.closed:
                    try:
                        link.handler.on_credit()
                    except Exception:
                        log.exception("link credit handler failed")

    def _finished(self) -> bool:
        if self.closing and not self.raw_out:
            return self.phase != "amqp" or self.proton.pending() <= 0
        return self.phase == "amqp" and self.proton.transport_closed()

    # -- closing -----------------------------------------------------------------------------
    def close_after_write(self) -> None:
        self.closing = True
        self.engine.dirty.add(self)

    def close(self, condition: str | None = None, description: str = "", info: dict[str, Any] | None = None) -> None:
        """Close the AMQP connection (with an error, and its info map, if given), then the socket once written."""
        if self.closed:
            return
        if self.phase != "amqp":
            self.close_after_write()
            return
        self.proton.close(condition, description, info)
        self.closing = True
        self.engine.dirty.add(self)

    def abort(self) -> None:
        """Drop the socket now and tell the broker the connection is gone."""
        if self.closed:
            return
        self.closed = True
        self.engine.forget_connection(self)
        for link in list(self.links.values()):
            self.engine.forget_link(link)
        try:
            self.sock.close()
        except OSError:
            pass
        self.proton.release()
        # The preamble (whose SASL server calls back into it) and the TLS pump point back at this connection:
        # breaking those cycles frees it now, not at one of the cyclic collections the broker makes rare
        # (server.py's gc threshold; the soak test's RSS stayed high until then).
        if self.preamble is not None:
            self.preamble.sasl = None
        self.preamble = None
        self.tls = None

    # -- AMQP --------------------------------------------------------------------------------
    def set_properties(self, properties: dict[Any, Any]) -> None:
        """Connection properties sent in our open frame (call before the open goes out)."""
        self.proton.set_properties(properties)

    @property
    def remote_properties(self) -> dict[str, Any]:
        return self.proton.remote_properties

    def open_link(self, sender: bool, address: str, name: str, handler: LinkHandler,
                  properties: dict[Any, Any] | None = None, credit: int = 0,
                  source_filters: dict[Any, Any] | None = None, browse: bool = False,
                  coordinator: bool = False) -> Link:
        """Attach a link from this (outgoing) connection: the broker sends to, or receives from, address
        (receiving: with the source's filters, and browsing: what the shard relay passes on for a client;
        sending to a `coordinator`: a transaction controller)."""
        link = Link.attach(self, self.proton.link_session(), sender, address, name, properties, source_filters, browse,
                           coordinator)
        link.handler = handler
        self.engine.links[link.addr] = link
        self.links[link.addr] = link
        link.open(credit)
        self.engine.dirty.add(self)
        return link

    def tick(self, now_ms: int) -> None:
        if self.phase == "amqp" and not self.closed:
            # proton answers 0 when no heartbeat is due; look again in a second (the peer's idle
            # timeout is only known after its open).
            self.next_tick = self.proton.tick(now_ms) or now_ms + 1000
            self.engine.dirty.add(self)
