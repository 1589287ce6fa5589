"""The event loop and the only caller of proton's C API: the cffi module `cproton_ffi` that
python-qpid-proton ships, and for the per-message calls `_pn`, a small C module calling the same
library without cffi's release of the GIL around each call (design/performance.md). Links and
deliveries are known by their addresses (ints); cffi pointers are made from them on cold paths.

Everything above this module speaks broker terms: a connection, a link, a message's bytes, a
credit grant, a settlement. proton's Python wrapper objects appear only on cold paths (reading
link properties). The loop is an own epoll loop; each pass reads sockets, drains proton's
collector, lets the broker dispatch once, then writes every connection that has output.

Traps this module handles (measured): proton reuses the addresses of settled deliveries and
freed links, so map entries are dropped on settlement and detach; every event is popped even
when its handler raises; `pn_transport_push` takes at most the current capacity.
"""
from __future__ import annotations

import collections
import errno
import heapq
import itertools
import logging
from logging import INFO, WARNING
import select
import signal
import socket
import ssl
import time
from typing import Any, Callable, Protocol

import cproton_ffi
from cproton_ffi import ffi, lib
from mypy_extensions import mypyc_attr
from proton import Data

from ..config import LimitsConfig, ListenerConfig
from . import _pn, heap
from .connection_limits import ConnectionLimits
from .errors import BrokerError, FRAMING_ERROR, MESSAGE_SIZE_EXCEEDED, NOT_IMPLEMENTED, RESOURCE_LIMIT, UNAUTHORIZED
from .password_checks import Logins, PasswordChecks
from .refusal_log import RefusalLog
from .sasl import AMQP_HEADER, SASL_HEADER, SaslClient, SaslServer
from .tls import certificate_user

log = logging.getLogger("haqueue.engine")

NULL = ffi.NULL
ACCEPTED, REJECTED, RELEASED, MODIFIED = lib.PN_ACCEPTED, lib.PN_REJECTED, lib.PN_RELEASED, lib.PN_MODIFIED
DECLARED, TRANSACTIONAL = 0x33, 0x34  # delivery states of transactions (AMQP 1.0 part 4), not named by proton
_PN_DELIVERY = lib.PN_DELIVERY
_pn.bind(cproton_ffi.__file__, _PN_DELIVERY)
_PN_LINK_FLOW = lib.PN_LINK_FLOW
_READ_SIZE = 256 * 1024
# Credit a link the broker receives on holds (a publisher's, or a backup's from its primary): topped up
# when half is used, to as many messages of the sizes it sends as make _RECEIVE_BYTES, between
# _RECEIVE_MIN and _RECEIVE_WINDOW. A publisher of large messages thus holds them back in its own
# memory, not the socket's or the broker's: a window of 2,000 messages of 1 MB had the rhea producer
# spend 50 % more CPU per message than one of 20 (design/performance.md, "Large messages").
_RECEIVE_WINDOW = 2000
_RECEIVE_FIRST = 10  # a new publisher link's, until its messages' sizes are known
_RECEIVE_MIN = 2
_RECEIVE_BYTES = 16 * 1024 * 1024
_EPOLL_IN = select.EPOLLIN | select.EPOLLRDHUP
_EPOLL_OUT = select.EPOLLOUT


@mypyc_attr(allow_interpreted_subclasses=True)  # HA's and management's handlers are not compiled
class LinkHandler:
    """The broker's object behind one link (a publisher, consumer, browser, management or HA end).
    Each event is ignored unless a subclass cares for it."""

    def on_message(self, delivery: Any, data: bytes, settled: bool) -> None:
        """A whole message arrived on a link the broker receives on."""

    def on_outcome(self, delivery: Any, outcome: int, failed: bool, undeliverable: bool) -> None:
        """The peer settled (or gave an outcome for) a message the broker sent; the engine settles it after."""

    def on_txn_message(self, delivery: Any, data: bytes, settled: bool, txn_id: bytes) -> bool:
        """A message sent under transaction `txn_id`; False: this link takes none (the engine refuses it)."""
        return False

    def on_txn_outcome(self, delivery: Any, txn_id: bytes, outcome: int) -> None:
        """The peer gave an outcome for a message the broker sent, under transaction `txn_id`: it takes
        effect at commit. The engine leaves the delivery unsettled: the handler settles it."""

    def on_credit(self) -> None:
        """A link the broker sends on may send more: the peer granted credit, or the connection's output,
        once over limits.output_buffer, has drained (Link.output_full). On a link the broker receives on:
        the peer sent a flow (its answer to a drain)."""

    def on_detach(self) -> None:
        """The link is gone (detached, closed, or its connection lost)."""


class ConnectionHandler(Protocol):
    """The owner of one of the broker's own outgoing connections."""

    def on_open(self, conn: "Connection") -> None: ...
    def on_closed(self, conn: "Connection", reason: str) -> None: ...


class EngineHandler(Protocol):
    """What the engine asks of the broker."""

    def connection_opened(self, conn: "Connection") -> None: ...  # raise BrokerError to refuse
    def connection_closed(self, conn: "Connection") -> None: ...
    def link_opened(self, link: "Link") -> LinkHandler: ...  # raise BrokerError to refuse
    def after_pass(self) -> None: ...
    def before_flush(self) -> None: ...  # the pass's output is about to reach the sockets
    def pending(self) -> bool: ...  # work scheduled for the next pass


def _text(ptr: Any) -> str | None:
    return None if ptr == NULL else ffi.string(ptr).decode("utf-8")


def _data_object(ptr: Any) -> Any:
    """Decode a pn_data_t (link properties, filters) through proton's Data: cold path only."""
    data = Data(ptr)
    data.rewind()
    return data.get_object() if data.next() else None


_OUTCOMES = {"amqp:accepted:list": ACCEPTED, "amqp:rejected:list": REJECTED, "amqp:released:list": RELEASED,
             "amqp:modified:list": MODIFIED}


def _outcome_code(value: Any) -> int:
    """An outcome decoded from a transactional state (described by its code or its name); 0 if none."""
    descriptor = getattr(value, "descriptor", None)
    if isinstance(descriptor, int):
        return int(descriptor)
    return _OUTCOMES.get(str(descriptor), 0) if descriptor is not None else 0


def address(ptr: Any) -> int:
    """A proton object's address: how the hot path (`_pn`) and the engine's maps know it."""
    return int(ffi.cast("uintptr_t", ptr))


def _delivery(handle: int) -> Any:
    """The cffi pointer of a delivery known by its address, for the cold paths."""
    return ffi.cast("pn_delivery_t *", handle)


def _set_condition(cond: Any, name: str, description: str) -> None:
    lib.pn_condition_set_name(cond, name.encode())
    lib.pn_condition_set_description(cond, description.encode())


class Link:
    """One link end. `handler` is the broker's object; `address` the node it names (source for a
    link the broker sends on, target for one it receives on)."""

    __slots__ = ("ptr", "addr", "conn", "name", "is_sender", "address", "dynamic", "browse", "handler",
                 "_tag", "_received", "_received_bytes", "window", "settle_first", "_properties_ptr",
                 "closed", "coordinator", "held", "honoured_filters")

    def __init__(self, ptr: Any, conn: "Connection", outgoing_address: str | None = None) -> None:
        self.ptr = ptr
        self.addr = address(ptr)
        self.conn = conn
        self.name = _text(lib.pn_link_name(ptr)) or ""
        self.is_sender = bool(lib.pn_link_is_sender(ptr))
        self.handler: LinkHandler | None = None
        self._tag = 0
        self._received = 0  # receiving: messages taken since the credit was last topped up: credit owed
        self._received_bytes = 0  # ... and their bytes
        self.window = 0  # receiving: the credit the peer holds once topped up
        self.closed = False
        self.held = False  # receiving: credit is not topped up (flow control)
        # sending: the source filters the broker applies, echoed in its attach (the others are left out, so
        # the client knows they are not applied); the handler sets them at attach
        self.honoured_filters: dict[Any, Any] = {}
        self.address: str | None
        if outgoing_address is not None:  # a link the broker opens: nothing remote to read yet
            self.address, self.dynamic, self.browse, self.settle_first = outgoing_address, False, False, False
            self.coordinator = False
            self._properties_ptr = lib.pn_link_properties(ptr)
            return
        terminus = lib.pn_link_remote_source(ptr) if self.is_sender else lib.pn_link_remote_target(ptr)
        self.address = _text(lib.pn_terminus_get_address(terminus))
        self.dynamic = bool(lib.pn_terminus_is_dynamic(terminus))
        self.browse = self.is_sender and lib.pn_terminus_get_distribution_mode(terminus) == lib.PN_DIST_MODE_COPY
        self.coordinator = lib.pn_terminus_get_type(terminus) == lib.PN_COORDINATOR  # a transaction controller
        # A consumer that sends settled (at-most-once) wants its deliveries pre-settled.
        self.settle_first = lib.pn_link_remote_snd_settle_mode(ptr) == lib.PN_SND_SETTLED
        self._properties_ptr = lib.pn_link_remote_properties(ptr)

    @property
    def properties(self) -> dict[Any, Any]:
        value = _data_object(self._properties_ptr)
        return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}

    @property
    def source_filters(self) -> dict[Any, Any]:
        """The filters of the source the peer gave (a link the broker sends on): key -> described value."""
        if not self.is_sender:
            return {}
        value = _data_object(lib.pn_terminus_filter(lib.pn_link_remote_source(self.ptr)))
        return dict(value) if isinstance(value, dict) else {}

    @property
    def remote_container(self) -> str:
        return self.conn.remote_container

    # -- sending (the broker is the sender) --------------------------------------------------
    def credit(self) -> int:
        return _pn.credit(self.addr)

    def send(self, data: bytes | list[bytes], settled: bool = False, tag: bytes | None = None) -> int | None:
        """Send one message (or the pieces of one, one after the other); returns the delivery handle
        (None when sent pre-settled)."""
        if tag is None:
            self._tag += 1
            tag = self._tag.to_bytes(8, "little")
        delivery = _pn.send(self.addr, tag, data, settled)
        self.conn.engine.dirty.add(self.conn)
        return delivery or None

    @staticmethod
    def tag(delivery: int) -> bytes:
        return _pn.tag(delivery)

    @staticmethod
    def outcome_error(delivery: int) -> tuple[str, str] | None:
        """The (condition, description) the peer gave with its outcome of `delivery` (a rejection's
        reason), or None. A cold path: the shard relay passing an owner's rejection on."""
        cond = lib.pn_disposition_condition(lib.pn_delivery_remote(_delivery(delivery)))
        if not lib.pn_condition_is_set(cond):
            return None
        return _text(lib.pn_condition_get_name(cond)) or "", _text(lib.pn_condition_get_description(cond)) or ""

    def remote_error(self) -> str | None:
        cond = lib.pn_link_remote_condition(self.ptr)
        if not lib.pn_condition_is_set(cond):
            return None
        return f"{_text(lib.pn_condition_get_name(cond))}: {_text(lib.pn_condition_get_description(cond))}"

    def drained(self) -> None:
        """Answer a drain request: no more to send, the rest of the credit is spent."""
        if lib.pn_link_get_drain(self.ptr):
            lib.pn_link_drained(self.ptr)
            self.conn.engine.dirty.add(self.conn)

    def output_full(self) -> bool:
        """Is more than limits.output_buffer waiting to be written on this link's connection? If so the
        handler's on_credit is called once it has drained below that (a peer that reads its socket
        slowly gets nothing more meanwhile, and nothing stalls once it has read)."""
        conn = self.conn
        if conn.backlog() <= conn.engine.limits.output_buffer:
            return False
        conn.output_waiters.add(self)
        return True

    # -- settling ----------------------------------------------------------------------------
    def settle(self, delivery: int, outcome: int = ACCEPTED, condition: str | None = None,
               description: str = "", failed: bool = False) -> None:
        """Give an outcome (unless it is 0) and settle."""
        if outcome and (condition or failed):
            local = lib.pn_delivery_local(_delivery(delivery))
            if condition:
                _set_condition(lib.pn_disposition_condition(local), condition, description)
            if failed:
                lib.pn_disposition_set_failed(local, True)
        _pn.settle(delivery, outcome)
        self.conn.engine.dirty.add(self.conn)

    def settle_with_state(self, delivery: int, state: int, fields: list[Any]) -> None:
        """Settle with a state proton has no name for (a transaction's `declared`, a `transactional-state`):
        its fields are encoded through proton's Data. A cold path."""
        data = Data(lib.pn_disposition_data(lib.pn_delivery_local(_delivery(delivery))))
        data.clear()
        data.put_object(fields)
        _pn.settle(delivery, state)
        self.conn.engine.dirty.add(self.conn)

    # -- receiving ---------------------------------------------------------------------------
    def received(self, size: int) -> None:
        """A message of `size` bytes came: its credit is owed, and granted again once half the window is."""
        self._received += 1
        self._received_bytes += size
        if (self._received >= self.window >> 1 or self._received_bytes >= _RECEIVE_BYTES >> 1) and not self.held:
            self._top_up()

    def _top_up(self) -> None:
        """Bring the peer's credit up to the window, first sized to the messages taken since the last top-up.
        Credit granted cannot be taken back: when the window shrinks below what the peer holds, the peer
        gets none until it is under."""
        peer_holds = self.window - self._received
        if self._received_bytes:
            size = self._received_bytes // self._received
            self.window = max(_RECEIVE_MIN, min(_RECEIVE_WINDOW, _RECEIVE_BYTES // max(size, 1)))
        grant = self.window - peer_holds
        if grant > 0:
            lib.pn_link_flow(self.ptr, grant)
            self.conn.engine.dirty.add(self.conn)
        else:
            self.window = peer_holds
        self._received = self._received_bytes = 0

    def hold_credit(self) -> None:
        """Stop topping up the peer's credit: once it has sent what it holds, it can send no more."""
        self.held = True

    def resume_credit(self) -> None:
        """Top the credit up to the window again, now and from here on."""
        self.held = False
        if self._received:
            self._top_up()

    def flow(self, credit: int, drain: bool = False) -> None:
        """Grant `credit` more on a receiving link whose credit its handler manages (having called
        hold_credit, so the window above is off): the shard relay passing a client's credit on. With
        `drain`, the peer is asked to use all its credit or give it back; its answer comes as on_credit."""
        if drain:
            lib.pn_link_drain(self.ptr, credit)
        else:
            lib.pn_link_flow(self.ptr, credit)
        self.conn.engine.dirty.add(self.conn)

    def drain_asked(self) -> bool:
        """Sending: the peer's last flow asked for a drain (answered by `drained`)."""
        return bool(lib.pn_link_get_drain(self.ptr))

    def close(self, condition: str | None = None, description: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        if condition:
            _set_condition(lib.pn_link_condition(self.ptr), condition, description)
        lib.pn_link_close(self.ptr)
        self.conn.engine.dirty.add(self.conn)  # the detach goes out this pass, even from a timer
        self.conn.engine.forget_link(self)


class Connection:
    """One socket: an optional TLS layer, the broker's SASL layer, then proton's transport."""

    def __init__(self, engine: "Engine", sock: socket.socket, peer: str, listener: "Listener | None",
                 client: "ConnectionHandler | None" = None, sasl_client: SaslClient | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.engine = engine
        self.sock = sock
        self.fd = sock.fileno()
        self.listener = listener
        self.client = client  # set for the broker's own outgoing connections
        self.peer = peer
        self.host = peer.rpartition(":")[0]  # the source address, as the per-address limit counts it
        self.transport = lib.pn_transport()
        self.transport_addr = address(self.transport)
        self.written = 0  # bytes at the head of proton's output buffer already written (_pn.write)
        if client is None:
            assert listener is not None
            lib.pn_transport_set_server(self.transport)
            lib.pn_transport_set_max_frame(self.transport, listener.options.max_frame_size)
        idle_ms = int(engine.limits.idle_timeout * 1000)
        if idle_ms:
            lib.pn_transport_set_idle_timeout(self.transport, idle_ms)
        self.ptr = lib.pn_connection()
        lib.pn_connection_collect(self.ptr, engine.collector)
        lib.pn_transport_bind(self.transport, self.ptr)
        self.phase = "header"  # header -> sasl -> amqp
        self.header = b""
        self.sasl: SaslServer | SaslClient | None = sasl_client
        self.session: Any = None  # the one session of an outgoing connection
        self.user: str | None = None
        self.logged_in = False  # counted against limits.max_connections_per_user until closed
        self.handshake_deadline = 0  # ms (monotonic): closed unless the client opens by then; 0: opened
        self.tls: ssl.SSLObject | None = None
        self._tls_in: ssl.MemoryBIO | None = None
        self._tls_out: ssl.MemoryBIO | None = None
        self._tls_ready = False  # handshake done
        self._tls_waiting = bytearray()  # what our side wrote before the handshake was done
        self.certificate_user: str | None = None  # the user the peer's verified certificate names
        self.raw_out = bytearray()  # bytes for the socket that did not come from proton directly
        self.writing = False  # registered for EPOLLOUT
        self.closing = False
        self.closed = False
        self.refusal: tuple[str, str] | None = None  # (condition, description) to close with at open
        self.next_tick = 0
        self.sessions = 0
        self.links: dict[int, Link] = {}  # by address
        self.output_waiters: set[Link] = set()  # links held back by a full output (Link.output_full)
        self.remote_container = ""
        self.attachment: Any = None  # the broker's per-connection state
        self.client_error: str | None = None  # why an outgoing connection failed
        context = listener.tls_context if listener is not None else tls
        if context is not None:
            self._tls_in, self._tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
            self.tls = context.wrap_bio(self._tls_in, self._tls_out, server_side=client is None)
        if sasl_client is not None:
            self.phase = "sasl"
            if self.tls is not None:
                self._tls_step()  # the client speaks first: its hello
            self.write_plain(sasl_client.greeting())
            self.writing = True  # flush once the non-blocking connect completes
            engine.epoll.register(self.fd, _EPOLL_IN | _EPOLL_OUT)

    # -- input -------------------------------------------------------------------------------
    def received(self, data: bytes) -> None:
        if self.phase == "refused":
            return
        if self.tls is not None:
            data = self._decrypt(data)
            if not data:
                return
        if self.phase != "amqp":
            data = self._before_amqp(data)
        if data:
            self._push(data)

    def _decrypt(self, data: bytes) -> bytes:
        assert self.tls is not None and self._tls_in is not None
        self._tls_in.write(data)
        chunks = []
        try:
            while self._tls_ready or self._tls_step():
                chunk = self.tls.read(_READ_SIZE)
                if not chunk:
                    break
                chunks.append(chunk)
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError as e:
            self._tls_failed(e)
            return b""
        self._tls_pump()
        return b"".join(chunks)

    def _tls_step(self) -> bool:
        """Take the handshake as far as the bytes so far allow; once done (True), learn who a client
        certificate names and send what waited for it. Raises SSLError if it fails."""
        assert self.tls is not None
        try:
            self.tls.do_handshake()
        except ssl.SSLWantReadError:
            self._tls_pump()
            return False
        self._tls_ready = True
        if self.client is None:
            self.certificate_user = certificate_user(self.tls.getpeercert())
        if self._tls_waiting:
            self.tls.write(bytes(self._tls_waiting))
            self._tls_waiting.clear()
        self._tls_pump()
        return True

    def _tls_failed(self, error: ssl.SSLError) -> None:
        """Refuse the connection, after sending TLS's alert so that the peer learns why too."""
        what = "TLS error" if self._tls_ready else "TLS handshake failed"
        if self.client is not None:
            self.client_error = f"{what}: {error}"
            self.engine.refusal_log(WARNING, self.peer, f"{what}: {error}", "connection to %s: %s: %s", self.peer,
                                    what, error)
        else:
            self.engine.refusal_log(WARNING, self.peer, f"{what}: {error}", "connection %s refused: %s: %s",
                                    self.peer, what, error)
        self.phase = "refused"
        self._tls_pump()
        self.close_after_write()

    def handshake_stage(self) -> str:
        """Where a connection that has not opened yet stands, for the log."""
        if self.tls is not None and not self._tls_ready:
            return "the TLS handshake"
        return {"sasl": "the SASL exchange", "amqp": "the open frame"}.get(self.phase, "the protocol header")

    def _tls_pump(self) -> None:
        if self._tls_out is not None and self._tls_out.pending:
            self.raw_out += self._tls_out.read()
            self.engine.dirty.add(self)

    def write_plain(self, data: bytes) -> None:
        """Bytes of the pre-AMQP layers (headers, SASL frames), through TLS when it is on."""
        if self.tls is None:
            self.raw_out += data
        elif not self._tls_ready:
            self._tls_waiting += data
        else:
            self.tls.write(data)
            self._tls_pump()
        self.engine.dirty.add(self)

    def _before_amqp(self, data: bytes) -> bytes:
        if self.phase == "sasl":
            assert self.sasl is not None
            out, rest = self.sasl.feed(data)
            return self._sasl_progress(out, rest)
        self.header += data
        if len(self.header) < 8:
            return b""
        header, rest = self.header[:8], self.header[8:]
        assert self.listener is not None  # only a connection the broker accepted reads a protocol header
        options = self.listener.options
        if header == SASL_HEADER and self.user is None:
            self.sasl = SaslServer(self.listener.mechanisms(self.engine.anonymous), self._authenticate,
                                   self.certificate_user)
            self.phase = "sasl"
            self.write_plain(self.sasl.greeting())
            return self._before_amqp(rest) if rest else b""
        if header == AMQP_HEADER:
            if self.user is None:
                if options.sasl == "required" or not self.engine.anonymous:
                    self.engine.refusal_log(WARNING, self.peer, "no SASL", "connection %s refused: SASL is "
                                            "required on %s:%s", self.peer, options.host, options.port)
                    self.write_plain(SASL_HEADER)
                    self.close_after_write()
                    return b""
                self.user = "anonymous"
            self.phase = "amqp"
            return header + rest
        self.engine.refusal_log(WARNING, self.peer, f"header {header!r}", "connection %s refused: bad protocol header %r",
                                self.peer, header)
        self.write_plain(SASL_HEADER if options.sasl == "required" else AMQP_HEADER)
        self.close_after_write()
        return b""

    def _authenticate(self, mechanism: str, user: str, password: str, answer: Callable[[bool], None]) -> None:
        def later(ok: bool) -> None:
            answer(ok)
            self._sasl_answered()
        self.engine.password_checks.check(mechanism, user, password, answer, later)

    def _sasl_answered(self) -> None:
        """A password checked off the loop has its answer: the SASL exchange goes on."""
        if self.closed or not isinstance(self.sasl, SaslServer):
            return
        data = self._sasl_progress(*self.sasl.resume())
        if data:
            self._push(data)

    def _sasl_progress(self, out: bytes, rest: bytes) -> bytes:
        """Send what the SASL layer answered; once it is over, the bytes after it go on."""
        assert self.sasl is not None
        if out:
            self.write_plain(out)
        if self.client is not None:
            return self._after_client_sasl(rest)
        if not (self.sasl.done or self.sasl.failed):  # more frames to come, or a check under way
            return b""
        if self.sasl.user is None:
            reason = self.sasl.failed or "authentication failed"
            self.engine.refusal_log(WARNING, self.peer, reason, "connection %s refused: %s", self.peer, reason)
            # Let the client read the outcome and close first: closing at once makes proton
            # report a framing error instead of the authentication failure.
            self.phase = "refused"
            self.engine.call_later(1.0, self.abort)
            return b""
        self.user = self.sasl.user
        self.phase = "header"
        self.header = b""
        return self._before_amqp(rest) if rest else b""

    def _after_client_sasl(self, rest: bytes) -> bytes:
        assert isinstance(self.sasl, SaslClient)
        if self.sasl.failed:
            self.engine.refusal_log(WARNING, self.peer, self.sasl.failed, "connection to %s: %s", self.peer,
                                    self.sasl.failed)
            self.client_error = self.sasl.failed
            self.abort()
            return b""
        if not self.sasl.done:
            return b""
        self.phase = "amqp"  # proton's client transport now writes the AMQP header and open
        lib.pn_connection_open(self.ptr)
        self.session = lib.pn_session(self.ptr)
        lib.pn_session_open(self.session)
        self.engine.dirty.add(self)
        return rest

    def _push(self, data: bytes) -> None:
        view = memoryview(data)
        transport = self.transport
        while view:
            capacity = lib.pn_transport_capacity(transport)
            if capacity <= 0:
                break  # input side closed (error or close): proton has said what it will say
            n = min(capacity, len(view))
            lib.pn_transport_push(transport, ffi.from_buffer(view[:n]), n)
            view = view[n:]
        self.engine.dirty.add(self)

    def input_closed(self) -> None:
        if self.phase == "amqp":
            lib.pn_transport_close_tail(self.transport)
            self.engine.dirty.add(self)
        else:
            self.abort()

    # -- output ------------------------------------------------------------------------------
    def backlog(self) -> int:
        return max(lib.pn_transport_pending(self.transport) - self.written, 0) + len(self.raw_out)

    def flush(self) -> None:
        """Write what the layers have; register for EPOLLOUT when the socket is full."""
        if self.closed:
            return
        transport = self.transport
        engine = self.engine
        blocked = False
        if self.phase == "amqp" and self.tls is None and not self.raw_out:
            # from proton's buffer, no copy on the way; what it holds is popped once all written
            status, self.written = _pn.write(self.transport_addr, self.fd, self.written)
            if status < 0:
                self.abort()
                return
            blocked = status > 0
        elif self.phase == "amqp":  # through TLS, or after bytes that wait in raw_out
            while True:
                pending = lib.pn_transport_pending(transport)
                if pending <= 0:
                    break
                n = min(pending, _READ_SIZE)
                lib.pn_transport_peek(transport, engine.out_buffer, n)
                chunk = engine.out_view[:n]
                if self.tls is not None:
                    self.tls.write(chunk)
                    self._tls_pump()
                else:
                    self.raw_out += chunk
                lib.pn_transport_pop(transport, n)
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
            engine.epoll.modify(self.fd, _EPOLL_IN | (_EPOLL_OUT if blocked else 0))
        if not blocked and self._finished():
            self.abort()
            return
        if self.output_waiters and self.backlog() <= engine.limits.output_buffer:
            waiters, self.output_waiters = self.output_waiters, set()
            for link in waiters:
                if link.handler is not None and not link.closed:
                    try:
                        link.handler.on_credit()
                    except Exception:
                        log.exception("link credit handler failed")

    def _finished(self) -> bool:
        if self.closing and not self.raw_out:
            return self.phase != "amqp" or lib.pn_transport_pending(self.transport) <= 0
        return self.phase == "amqp" and bool(lib.pn_transport_closed(self.transport))

    def close_after_write(self) -> None:
        self.closing = True
        self.engine.dirty.add(self)

    def close(self, condition: str | None = None, description: str = "") -> None:
        """Close the AMQP connection (with an error if given), then the socket once written."""
        if self.closed:
            return
        if self.phase != "amqp":
            self.close_after_write()
            return
        if condition:
            _set_condition(lib.pn_connection_condition(self.ptr), condition, description)
        if not lib.pn_connection_state(self.ptr) & lib.PN_LOCAL_ACTIVE:
            lib.pn_connection_open(self.ptr)
        lib.pn_connection_close(self.ptr)
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
        lib.pn_transport_unbind(self.transport)
        lib.pn_decref(self.transport)
        # release frees the connection's sessions, links and deliveries; the decref gives back our own
        # reference (pn_connection_free does both), without which every connection's memory stayed.
        lib.pn_connection_release(self.ptr)
        lib.pn_decref(self.ptr)

    def set_properties(self, properties: dict[Any, Any]) -> None:
        """Connection properties sent in our open frame (call before the open goes out)."""
        Data(lib.pn_connection_properties(self.ptr)).put_object(properties)

    @property
    def remote_properties(self) -> dict[str, Any]:
        value = _data_object(lib.pn_connection_remote_properties(self.ptr))
        return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}

    def open_link(self, sender: bool, address: str, name: str, handler: LinkHandler,
                  properties: dict[Any, Any] | None = None, credit: int = 0,
                  source_filters: dict[Any, Any] | None = None, browse: bool = False) -> Link:
        """Attach a link from this (outgoing) connection: the broker sends to, or receives from, address
        (receiving: with the source's filters, and browsing: what the shard relay passes on for a client)."""
        ptr = (lib.pn_sender if sender else lib.pn_receiver)(self.session, name.encode())
        terminus = lib.pn_link_target(ptr) if sender else lib.pn_link_source(ptr)
        lib.pn_terminus_set_address(terminus, address.encode())
        if source_filters:
            Data(lib.pn_terminus_filter(terminus)).put_object(source_filters)
        if browse:
            lib.pn_terminus_set_distribution_mode(terminus, lib.PN_DIST_MODE_COPY)
        if properties:
            Data(lib.pn_link_properties(ptr)).put_object(properties)
        link = Link(ptr, self, address)
        link.handler = handler
        self.engine.links[link.addr] = link
        self.links[link.addr] = link
        lib.pn_link_open(ptr)
        if credit:
            link.window = credit
            lib.pn_link_flow(ptr, credit)
        self.engine.dirty.add(self)
        return link

    def tick(self, now_ms: int) -> None:
        if self.phase == "amqp" and not self.closed:
            # proton answers 0 when no heartbeat is due; look again in a second (the peer's idle
            # timeout is only known after its open).
            self.next_tick = lib.pn_transport_tick(self.transport, now_ms) or now_ms + 1000
            self.engine.dirty.add(self)


class Listener:
    def __init__(self, options: ListenerConfig, tls_context: ssl.SSLContext | None) -> None:
        self.options = options
        self.tls_context = tls_context
        self.sock = socket.socket(socket.AF_INET6 if ":" in options.host else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if options.reuse_port:  # the kernel spreads the address's connections over every process bound to it
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            self.sock.bind((options.host, options.port))
        except OSError as e:
            self.sock.close()
            raise OSError(e.errno, f"cannot listen on {options.host}:{options.port}: {e.strerror}") from None
        self.sock.listen(1024)
        self.sock.setblocking(False)

    def mechanisms(self, anonymous: bool) -> list[str]:
        """What this listener offers: PLAIN always, ANONYMOUS where the broker allows it and SASL is optional."""
        mechs = ["PLAIN"]
        if self.options.sasl == "optional" and anonymous:
            mechs.append("ANONYMOUS")
        return mechs


class Engine:
    """The event loop: sockets, proton transports, timers and signals."""

    def __init__(self, handler: EngineHandler, limits: LimitsConfig, container_id: str,
                 logins: Logins, anonymous: bool) -> None:
        self.handler = handler
        self.limits = limits
        self.container_id = container_id.encode()
        self.password_checks = PasswordChecks(logins, self.call_soon_threadsafe)
        self.refusal_log = RefusalLog(log)
        self.anonymous = anonymous
        self.connection_limits = ConnectionLimits(limits)
        self._closed_since_trim = 0  # connections gone since the heap's free memory was last given back
        self.collector = lib.pn_collector()
        self.epoll = select.epoll()
        self.listeners: dict[int, Listener] = {}
        self.connections: dict[int, Connection] = {}  # by fd
        self._by_ptr: dict[Any, Connection] = {}
        self.links: dict[int, Link] = {}  # by address
        self._collector = address(self.collector)
        self.dirty: set[Connection] = set()
        self.out_buffer = ffi.new("char[]", _READ_SIZE)
        self.out_view = ffi.buffer(self.out_buffer)
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_ids = itertools.count()
        self._running = False
        self._from_threads: collections.deque[Callable[[], None]] = collections.deque()
        self._wakeup_r, self._wakeup_w = socket.socketpair()
        self._wakeup_r.setblocking(False)
        self._wakeup_w.setblocking(False)
        self._handlers = {
            lib.PN_CONNECTION_REMOTE_OPEN: self._on_connection_remote_open,
            lib.PN_CONNECTION_REMOTE_CLOSE: self._on_connection_remote_close,
            lib.PN_SESSION_REMOTE_OPEN: self._on_session_remote_open,
            lib.PN_SESSION_REMOTE_CLOSE: self._on_session_remote_close,
            lib.PN_LINK_REMOTE_OPEN: self._on_link_remote_open,
            lib.PN_LINK_REMOTE_CLOSE: self._on_link_remote_close,
            lib.PN_LINK_REMOTE_DETACH: self._on_link_remote_close,
            lib.PN_TRANSPORT_ERROR: self._on_transport_error,
            lib.PN_TRANSPORT_TAIL_CLOSED: self._on_tail_closed,
        }

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
        lib.pn_connection_set_container(conn.ptr, self.container_id)
        lib.pn_connection_set_hostname(conn.ptr, host.encode())
        if idle_timeout:
            lib.pn_transport_set_idle_timeout(conn.transport, int(idle_timeout * 1000))
        self.connections[conn.fd] = conn
        self._by_ptr[conn.ptr] = conn
        self.dirty.add(conn)
        return conn

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_ids), callback))

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        """Run callback on the loop's thread (for coordinators with threads of their own, e.g. kazoo)."""
        self._from_threads.append(callback)
        try:
            self._wakeup_w.send(b"\0")
        except OSError:
            pass

    def every(self, interval: float, callback: Callable[[], None]) -> None:
        def repeat() -> None:
            callback()
            self.call_later(interval, repeat)
        self.call_later(interval, repeat)

    def stop(self) -> None:
        self._running = False
        try:
            self._wakeup_w.send(b"\0")
        except OSError:
            pass

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        self._running = True
        self.epoll.register(self._wakeup_r.fileno(), select.EPOLLIN)
        old_wakeup = signal.set_wakeup_fd(self._wakeup_w.fileno())
        self.every(0.1, self._tick_connections)
        self.every(heap.TRIM_INTERVAL, self._trim_heap)
        try:
            while self._running:
                self._one_pass()
        finally:
            signal.set_wakeup_fd(old_wakeup)

    def _one_pass(self) -> None:
        timeout = -1.0
        if self._timers:
            timeout = max(self._timers[0][0] - time.monotonic(), 0.0)
        if self.dirty or self.handler.pending():
            timeout = 0.0
        try:
            events = self.epoll.poll(timeout)
        except InterruptedError:
            events = []
        for fd, mask in events:
            conn = self.connections.get(fd)
            if conn is not None:
                if mask & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR | select.EPOLLRDHUP):
                    self._read(conn)
                if mask & _EPOLL_OUT:
                    self.dirty.add(conn)
            elif fd in self.listeners:
                self._accept(self.listeners[fd])
            else:
                try:
                    while self._wakeup_r.recv(4096):
                        pass
                except BlockingIOError:
                    pass
        while self._from_threads:
            callback = self._from_threads.popleft()
            try:
                callback()
            except Exception:
                log.exception("callback from another thread failed")
        self._drain()
        try:
            self.handler.after_pass()
        except Exception:
            log.exception("dispatch failed")
        self._drain()
        if self._timers and self._timers[0][0] <= time.monotonic():
            self._run_timers()
        while self.dirty:
            self._before_flush()
            dirty, self.dirty = self.dirty, set()
            for conn in dirty:
                conn.flush()
            self._drain()

    def _before_flush(self) -> None:
        """The last step before output leaves (a confirmation, a settlement): the handler's
        `before_flush`, once per round of flushing, so what it writes reaches the OS first."""
        try:
            self.handler.before_flush()
        except Exception:
            log.exception("before_flush failed")

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, callback = heapq.heappop(self._timers)
            try:
                callback()
            except Exception:
                log.exception("timer callback failed")
        self._drain()

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

    def _handshake_expired(self, conn: Connection) -> None:
        """limits.handshake_timeout: a client that has not opened by now is dropped, however slowly it
        was still sending (a slow-loris holds a socket and a transport for nothing)."""
        log.info("connection %s closed: no AMQP open within %g s (limits.handshake_timeout); it was still in %s",
                 conn.peer, self.limits.handshake_timeout, conn.handshake_stage())
        conn.abort()

    def _accept(self, listener: Listener) -> None:
        while True:
            try:
                sock, _ = listener.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    log.error("cannot accept a connection: %s", e)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                peer = "%s:%s" % sock.getpeername()[:2]
            except OSError:
                sock.close()
                continue
            conn = Connection(self, sock, peer, listener)
            refusal = self.connection_limits.accepted(conn.host, len(self.connections))
            if refusal is not None:
                conn.refusal = (RESOURCE_LIMIT, refusal)
            self.connections[conn.fd] = conn
            self._by_ptr[conn.ptr] = conn
            self.epoll.register(conn.fd, _EPOLL_IN)
            now_ms = int(time.monotonic() * 1000)
            conn.handshake_deadline = now_ms + int(self.limits.handshake_timeout * 1000)
            conn.tick(now_ms)

    def _read(self, conn: Connection) -> None:
        if conn.phase == "amqp" and conn.tls is None:  # the socket straight into proton's buffer
            if _pn.read(conn.transport_addr, conn.fd, _READ_SIZE) < 0:
                conn.input_closed()
            self.dirty.add(conn)
            return
        try:
            data = conn.sock.recv(_READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            conn.input_closed()
            return
        try:
            conn.received(data)
        except Exception:  # what a peer sends must never stop the loop: drop that peer alone
            log.exception("connection %s dropped: its input could not be handled", conn.peer)
            conn.abort()

    def forget_connection(self, conn: Connection) -> None:
        self.connections.pop(conn.fd, None)
        self._by_ptr.pop(conn.ptr, None)
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
        link.closed = True
        handler, link.handler = link.handler, None  # its handler keeps the link, not the other way: no cycle
        if handler is not None:
            try:
                handler.on_detach()
            except Exception:
                log.exception("link detach handler failed")

    # -- proton events -----------------------------------------------------------------------
    def _drain(self) -> None:
        """Handle proton's events in order: runs of delivery events through _pn (the hot path), any
        other event here. Every event is popped, whatever its handler does."""
        collector = self.collector
        peek, pop, event_type = lib.pn_collector_peek, lib.pn_collector_pop, lib.pn_event_type
        links = self.links
        while True:
            try:
                items = _pn.drain(self._collector, self.limits.max_message_size)
            except Exception:
                log.exception("error reading proton's delivery events")
                continue
            for item in items:
                link = links.get(item[1])
                if link is None:
                    continue
                try:
                    kind = item[0]
                    if kind == _pn.TRANSFER:
                        self._on_message(link, item[2], item[3], item[4])
                    elif kind == _pn.OUTCOME:
                        self._on_outcome(link, item[2], item[3], item[4], item[5])
                    else:
                        self._on_raw_transfer(link, item[2])
                except Exception:
                    log.exception("error handling a delivery on link '%s'", link.name)
            event = peek(collector)
            if event == NULL:
                return
            kind = event_type(event)
            if kind == _PN_DELIVERY:
                continue  # a handler's action queued more: _pn's turn again
            try:
                if kind == _PN_LINK_FLOW:
                    link = links.get(address(lib.pn_event_link(event)))
                    if link is not None and link.handler is not None:
                        link.handler.on_credit()
                else:
                    handler = self._handlers.get(kind)
                    if handler is not None:
                        handler(event)
            except Exception:
                log.exception("error handling proton event %s", ffi.string(lib.pn_event_type_name(kind)))
            pop(collector)

    def _on_message(self, link: Link, delivery: int, data: bytes, settled: bool) -> None:
        """A whole message from a publisher (read and advanced past by _pn.drain)."""
        link.received(len(data))
        link.handler.on_message(delivery, data, settled)  # type: ignore[union-attr]

    def _on_raw_transfer(self, link: Link, handle: int) -> None:
        """A delivery _pn.drain left to be handled here: aborted, over limits.max_message_size (whole or
        not yet), a whole transactional one, or one that was behind such a message on its link."""
        delivery = _delivery(handle)
        if lib.pn_delivery_aborted(delivery):
            lib.pn_delivery_settle(delivery)  # what proton held of it goes with it
            return
        if not lib.pn_delivery_readable(delivery):
            return
        ptr = link.ptr
        pending = lib.pn_delivery_pending(delivery)
        # Clients' messages only: what a primary sends its backups (batches, events) is the broker's own.
        limit = self.limits.max_message_size if link.conn.client is None else 0
        if limit and pending > limit:
            if lib.pn_delivery_partial(delivery):
                link.close(MESSAGE_SIZE_EXCEEDED, f"message larger than limits.max_message_size {limit} bytes")
                return
            lib.pn_link_advance(ptr)  # its bytes are dropped with the settlement
            link.settle(handle, REJECTED, MESSAGE_SIZE_EXCEEDED,
                        f"message of {pending} bytes is over limits.max_message_size {limit}")
            return
        if lib.pn_delivery_partial(delivery):
            return  # the broker's own, over the clients' limit: read once whole
        buffer = bytearray(pending)  # a cold path: the copy into bytes below does not matter
        if pending:
            lib.pn_link_recv(ptr, ffi.from_buffer(buffer), pending)
        data = bytes(buffer)
        lib.pn_link_advance(ptr)
        settled = bool(lib.pn_delivery_settled(delivery))
        if lib.pn_delivery_remote_state(delivery) == TRANSACTIONAL:
            self._on_txn_message(link, handle, data, settled)
        else:
            self._on_message(link, handle, data, settled)

    def _on_txn_message(self, link: Link, handle: int, data: bytes, settled: bool) -> None:
        """A transfer whose state names a transaction (AMQP 1.0 part 4): [txn-id]."""
        fields = _data_object(lib.pn_disposition_data(lib.pn_delivery_remote(_delivery(handle))))
        txn_id = bytes(fields[0]) if isinstance(fields, list) and fields and fields[0] is not None else b""
        link.received(len(data))
        handler = link.handler
        if handler is None or not handler.on_txn_message(handle, data, settled, txn_id):
            link.settle(handle, REJECTED, NOT_IMPLEMENTED, "this link takes no transactional transfers")

    def _on_outcome(self, link: Link, delivery: int, state: int, failed: bool, undeliverable: bool) -> None:
        """A consumer settled or gave an outcome for a message the broker sent."""
        if state == TRANSACTIONAL:
            self._on_txn_outcome(link, delivery)
            return
        link.handler.on_outcome(delivery, state, failed, undeliverable)  # type: ignore[union-attr]
        _pn.settle(delivery, 0)
        self.dirty.add(link.conn)

    def _on_txn_outcome(self, link: Link, delivery: int) -> None:
        """An outcome under a transaction: [txn-id, outcome] (left unsettled: the transaction settles it)."""
        fields = _data_object(lib.pn_disposition_data(lib.pn_delivery_remote(_delivery(delivery))))
        if not isinstance(fields, list) or len(fields) < 2 or fields[0] is None:
            return  # a transactional state with no outcome yet: nothing to do until it has one
        link.handler.on_txn_outcome(delivery, bytes(fields[0]), _outcome_code(fields[1]))  # type: ignore[union-attr]

    def _conn_of(self, event: Any) -> Connection | None:
        return self._by_ptr.get(lib.pn_event_connection(event))

    def _on_connection_remote_open(self, event: Any) -> None:
        conn = self._conn_of(event)
        if conn is None:
            return
        conn.remote_container = _text(lib.pn_connection_remote_container(conn.ptr)) or ""
        if conn.client is not None:
            conn.client.on_open(conn)
            return
        conn.handshake_deadline = 0
        lib.pn_connection_set_container(conn.ptr, self.container_id)
        if conn.refusal is None and conn.user is not None:
            refusal = self.connection_limits.logged_in(conn.user)
            if refusal is not None:
                conn.refusal = (RESOURCE_LIMIT, refusal)
            conn.logged_in = refusal is None
        if conn.refusal is None:
            try:
                self.handler.connection_opened(conn)
            except BrokerError as e:
                conn.refusal = (e.condition, e.description)
        if conn.refusal is not None:
            self.refusal_log(INFO, conn.peer, conn.refusal[1], "connection %s (%s, user %s) refused: %s", conn.peer,
                             conn.remote_container, conn.user, conn.refusal[1])
            conn.close(*conn.refusal)
            return
        lib.pn_connection_open(conn.ptr)
        self.dirty.add(conn)

    def _on_connection_remote_close(self, event: Any) -> None:
        conn = self._conn_of(event)
        if conn is None:
            return
        cond = lib.pn_connection_remote_condition(conn.ptr)
        if lib.pn_condition_is_set(cond):
            conn.client_error = f"{_text(lib.pn_condition_get_name(cond))}: " \
                                f"{_text(lib.pn_condition_get_description(cond))}"
        for link in list(conn.links.values()):
            self.forget_link(link)
        lib.pn_connection_close(conn.ptr)
        conn.closing = True
        self.dirty.add(conn)

    def _on_session_remote_open(self, event: Any) -> None:
        session = lib.pn_event_session(event)
        conn = self._conn_of(event)
        if conn is None:
            return
        conn.sessions += 1
        lib.pn_session_open(session)
        if conn.sessions > self.limits.max_sessions_per_connection:
            _set_condition(lib.pn_session_condition(session), RESOURCE_LIMIT,
                           f"too many sessions (limit {self.limits.max_sessions_per_connection})")
            lib.pn_session_close(session)
        self.dirty.add(conn)

    def _on_session_remote_close(self, event: Any) -> None:
        session = lib.pn_event_session(event)
        conn = self._conn_of(event)
        if conn is None:
            return
        conn.sessions -= 1
        for link in [l for l in conn.links.values() if lib.pn_link_session(l.ptr) == session]:
            self.forget_link(link)
        lib.pn_session_close(session)
        self.dirty.add(conn)

    def _on_link_remote_open(self, event: Any) -> None:
        ptr = lib.pn_event_link(event)
        conn = self._conn_of(event)
        if conn is None or address(ptr) in self.links:  # our own outgoing link, answered
            return
        link = Link(ptr, conn)
        self.dirty.add(conn)
        remote_source, remote_target = lib.pn_link_remote_source(ptr), lib.pn_link_remote_target(ptr)
        lib.pn_terminus_copy(lib.pn_link_source(ptr), remote_source)
        lib.pn_terminus_copy(lib.pn_link_target(ptr), remote_target)
        try:
            if len(conn.links) >= self.limits.max_links_per_connection:
                raise BrokerError(RESOURCE_LIMIT, f"too many links on this connection "
                                                  f"(limit {self.limits.max_links_per_connection})")
            link.handler = self.handler.link_opened(link)
        except BrokerError as e:
            log.debug("link '%s' to %s refused: %s", link.name, link.address, e.description)
            # Refusing an attach: answer it with a null terminus, then detach with the error.
            lib.pn_terminus_set_type(lib.pn_link_source(ptr) if link.is_sender else lib.pn_link_target(ptr),
                                     lib.PN_UNSPECIFIED)
            lib.pn_link_open(ptr)
            _set_condition(lib.pn_link_condition(ptr), e.condition, e.description)
            lib.pn_link_close(ptr)
            return
        if link.dynamic and link.address:
            terminus = lib.pn_link_source(ptr) if link.is_sender else lib.pn_link_target(ptr)
            lib.pn_terminus_set_address(terminus, link.address.encode())
        if link.is_sender:
            lib.pn_link_set_snd_settle_mode(ptr, lib.pn_link_remote_snd_settle_mode(ptr))
            # the copied source echoed every filter: only those the handler applies stay
            filters = Data(lib.pn_terminus_filter(lib.pn_link_source(ptr)))
            filters.clear()
            if link.honoured_filters:
                filters.put_object(link.honoured_filters)
        else:
            lib.pn_link_set_rcv_settle_mode(ptr, lib.PN_RCV_FIRST)
            if self.limits.max_message_size:
                lib.pn_link_set_max_message_size(ptr, self.limits.max_message_size)
        self.links[link.addr] = link
        conn.links[link.addr] = link
        lib.pn_link_open(ptr)
        if not link.is_sender:
            link.window = link._received = _RECEIVE_FIRST  # the whole window is owed: granted unless held
            if not link.held:
                link.resume_credit()
        elif lib.pn_link_credit(ptr):
            link.handler.on_credit()

    def _on_link_remote_close(self, event: Any) -> None:
        ptr = lib.pn_event_link(event)
        link = self.links.get(address(ptr))
        if link is not None:
            self.forget_link(link)
        if lib.pn_event_type(event) == lib.PN_LINK_REMOTE_DETACH:
            lib.pn_link_detach(ptr)
        else:
            lib.pn_link_close(ptr)
        conn = self._conn_of(event)
        if conn is not None:
            self.dirty.add(conn)

    def _on_transport_error(self, event: Any) -> None:
        conn = self._conn_of(event)
        cond = lib.pn_transport_condition(lib.pn_event_transport(event))
        name = _text(lib.pn_condition_get_name(cond))
        description = _text(lib.pn_condition_get_description(cond))
        log.warning("connection %s: %s: %s", conn.peer if conn else "?", name, description)

    def _on_tail_closed(self, event: Any) -> None:
        """proton stopped reading. After the peer's close, or with an error of its own, it closes the connection
        itself; but a frame it cannot decode (a body that is no AMQP encoding, an unknown performative) only
        stops its input, and the connection would hang open: close it."""
        conn = self._conn_of(event)
        if conn is None or conn.closing or conn.client is not None:
            return
        if lib.pn_condition_is_set(lib.pn_transport_condition(conn.transport)) or \
                lib.pn_connection_state(conn.ptr) & lib.PN_REMOTE_CLOSED:
            return
        log.warning("connection %s: closed: it sent a frame that could not be read", conn.peer)
        conn.close(FRAMING_ERROR, "a frame that could not be read")

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
