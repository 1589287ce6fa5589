"""The adapter to proton's C engine, and the only caller of its C API: the cffi module `cproton_ffi` that
python-qpid-proton ships, and for the per-message calls `_pn`, a small C module calling the same
library without cffi's release of the GIL around each call (design/performance.md). Links and
deliveries are known by their addresses (ints); cffi pointers are made from them on cold paths.

It holds `Link` (a link end: sending, settling, the credit window of a link the broker receives on),
`ProtonConnection` (a connection's pn_connection and pn_transport) and `ProtonEvents` (proton's
collector drained: deliveries and flows through `_pn.drain`, opens and closes here, each to the broker).
Everything above it speaks broker terms: a connection, a link, a message's bytes, a credit grant, a
settlement. proton's Python wrapper objects appear only on cold paths (reading link properties).

Traps this module handles (measured): proton reuses the addresses of settled deliveries and
freed links, so map entries are dropped on settlement and detach; every event is popped even
when its handler raises; `pn_transport_push` takes at most the current capacity.
"""
from __future__ import annotations

import logging
from logging import INFO
from typing import TYPE_CHECKING, Any, Callable, Final

import cproton_ffi
from cproton_ffi import ffi, lib
from mypy_extensions import mypyc_attr
from proton import Array, Data, Described, symbol, ulong

from . import _pn, amqp_values
from .errors import BrokerError, FRAMING_ERROR, INTERNAL, MESSAGE_SIZE_EXCEEDED, NOT_IMPLEMENTED, RESOURCE_LIMIT
from .receive_credit import RECEIVE_BYTES, RECEIVE_FIRST, RECEIVE_MIN

if TYPE_CHECKING:
    from .connection import Connection
    from .engine import Engine

log = logging.getLogger("haqueue.engine")

NULL: Final = ffi.NULL
# The outcomes, by their descriptor codes (AMQP 1.0 3.4), which proton's PN_ACCEPTED... are: literals, so
# that mypyc compares them as plain integers.
ACCEPTED: Final = 0x24
REJECTED: Final = 0x25
RELEASED: Final = 0x26
MODIFIED: Final = 0x27
assert (ACCEPTED, REJECTED, RELEASED, MODIFIED) == (lib.PN_ACCEPTED, lib.PN_REJECTED, lib.PN_RELEASED, lib.PN_MODIFIED)
DECLARED: Final = 0x33  # delivery states of transactions (AMQP 1.0 part 4), not named by proton
TRANSACTIONAL: Final = 0x34
# The events ProtonEvents handles itself with proton's objects (by its method of that name): _pn.drain
# stops at each, reports deliveries and flows, and pops every other event (the broker does nothing on
# them: the transport has output, local opens and closes, objects made and freed).
_KEPT_EVENTS: Final = {
    lib.PN_CONNECTION_REMOTE_OPEN: "_on_connection_remote_open",
    lib.PN_CONNECTION_REMOTE_CLOSE: "_on_connection_remote_close",
    lib.PN_SESSION_REMOTE_OPEN: "_on_session_remote_open",
    lib.PN_SESSION_REMOTE_CLOSE: "_on_session_remote_close",
    lib.PN_LINK_REMOTE_OPEN: "_on_link_remote_open",
    lib.PN_LINK_REMOTE_CLOSE: "_on_link_remote_close",
    lib.PN_LINK_REMOTE_DETACH: "_on_link_remote_close",
    lib.PN_TRANSPORT_ERROR: "_on_transport_error",
    lib.PN_TRANSPORT_TAIL_CLOSED: "_on_tail_closed",
}
_pn.bind(cproton_ffi.__file__, lib.PN_DELIVERY, lib.PN_LINK_FLOW, list(_KEPT_EVENTS))
# What ProtonConnection.write reports: all written; all written and the transport closed both ways (the
# connection is over); the socket is full; the socket failed.
WRITTEN: Final = _pn.WRITTEN
WRITE_CLOSED: Final = _pn.CLOSED
WRITE_FULL: Final = _pn.FULL
WRITE_FAILED: Final = _pn.FAILED
# The hot path's calls into _pn and the kinds of item its drain gives, bound once: mypyc compiles
# `_pn.credit(...)` as a lookup of the module's attribute at every call, and those lookups were 6 % of a
# relaying broker's samples (design/performance.md).
_credit: Final = _pn.credit
_send: Final = _pn.send
_settle: Final = _pn.settle
_drain: Final = _pn.drain
_drained: Final = _pn.drained
_read: Final = _pn.read
_feed: Final = _pn.feed
_write: Final = _pn.write
_pending: Final = _pn.pending
_TRANSFER: Final = _pn.TRANSFER
_OUTCOME: Final = _pn.OUTCOME
_FLOW: Final = _pn.FLOW
_EVENT: Final = _pn.EVENT
_LOST: Final = _pn.LOST
_OUTPUT_CHUNK: Final = 256 * 1024  # bytes of proton's output taken at a time where it is not written by _pn.write
_OUTPUT_BUFFER: Final = ffi.new("char[]", _OUTPUT_CHUNK)
_OUTPUT_VIEW: Final = ffi.buffer(_OUTPUT_BUFFER)


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



def _text(ptr: Any) -> str | None:
    return None if ptr == NULL else ffi.string(ptr).decode("utf-8")


_OUTCOMES: Final = {"amqp:accepted:list": ACCEPTED, "amqp:rejected:list": REJECTED, "amqp:released:list": RELEASED,
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


def _remote_state_fields(handle: int) -> Any:
    """The fields of the state the peer gave a delivery (a transaction's `declared` or `transactional-state`)."""
    return amqp_values.read(lib.pn_disposition_data(lib.pn_delivery_remote(_delivery(handle))))


def _set_condition(cond: Any, name: str, description: str, info: dict[str, Any] | None = None) -> None:
    """`info`: the condition's info map; its keys are sent as symbols (a redirect's network-host, port...)."""
    lib.pn_condition_set_name(cond, name.encode())
    lib.pn_condition_set_description(cond, description.encode())
    if info:
        Data(lib.pn_condition_info(cond)).put_object({symbol(k): v for k, v in info.items()})



def _put_symbols(data: Data, names: list[str]) -> None:
    """A `symbol multiple` field (capabilities): an array of symbols, or nothing."""
    data.clear()
    if names:
        data.put_array(False, Data.SYMBOL)
        data.enter()
        for name in names:
            data.put_symbol(symbol(name))
        data.exit()


class Link:
    """One link end. `handler` is the broker's object; `address` the node it names (source for a
    link the broker sends on, target for one it receives on)."""

    __slots__ = ("ptr", "addr", "conn", "name", "is_sender", "address", "dynamic", "browse", "handler",
                 "_tag", "_sent", "_granted", "_received", "_received_bytes", "window", "settle_first",
                 "_properties_ptr", "closed", "coordinator", "held", "honoured_filters", "remote_closed")

    def __init__(self, ptr: Any, conn: "Connection", outgoing_address: str | None = None) -> None:
        self.ptr = ptr
        self.addr = address(ptr)
        self.conn = conn
        self.name = _text(lib.pn_link_name(ptr)) or ""
        self.is_sender = bool(lib.pn_link_is_sender(ptr))
        self.handler: LinkHandler | None = None
        self._tag = 0
        self._sent = 0  # sending: messages sent; with the credit left, what the peer has granted in all
        self._granted = 0  # ... as the last flow found it
        self._received = 0  # receiving: messages taken since the credit was last topped up: credit owed
        self._received_bytes = 0  # ... and their bytes
        self.window = 0  # receiving: the credit the peer holds once topped up
        self.closed = False
        self.remote_closed = False  # the peer's detach said closed=true (not merely detached): set before on_detach
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

    @staticmethod
    def attach(conn: "Connection", session: Any, sender: bool, address: str, name: str,
               properties: dict[Any, Any] | None, source_filters: dict[Any, Any] | None = None,
               browse: bool = False, coordinator: bool = False) -> "Link":
        """A link the broker attaches from the session of one of its outgoing connections; `open` sends it.
        Receiving: with the source's filters, and browsing (what the shard relay passes on for a client).
        Sending to a `coordinator` (no address): a transaction controller (the shard relay's, at an owner)."""
        ptr = (lib.pn_sender if sender else lib.pn_receiver)(session, name.encode())
        terminus = lib.pn_link_target(ptr) if sender else lib.pn_link_source(ptr)
        if coordinator:
            lib.pn_terminus_set_type(terminus, lib.PN_COORDINATOR)
            Data(lib.pn_terminus_capabilities(terminus)).put_object(symbol("amqp:local-transactions"))
        else:
            lib.pn_terminus_set_address(terminus, address.encode())
        if source_filters:
            Data(lib.pn_terminus_filter(terminus)).put_object(source_filters)
        if browse:
            lib.pn_terminus_set_distribution_mode(terminus, lib.PN_DIST_MODE_COPY)
        if properties:
            amqp_values.write(lib.pn_link_properties(ptr), properties)
        return Link(ptr, conn, address)

    def open(self, credit: int) -> None:
        """Send the attach of a link the broker opens, with `credit` for the peer if it receives."""
        lib.pn_link_open(self.ptr)
        if credit:
            self.window = credit
            lib.pn_link_flow(self.ptr, credit)

    @property
    def properties(self) -> dict[Any, Any]:
        value = amqp_values.read(self._properties_ptr)
        return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}

    @property
    def source_filters(self) -> dict[Any, Any]:
        """The filters of the source the peer gave (a link the broker sends on): key -> described value."""
        if not self.is_sender:
            return {}
        value = amqp_values.read(lib.pn_terminus_filter(lib.pn_link_remote_source(self.ptr)))
        return dict(value) if isinstance(value, dict) else {}

    # -- the source terminus the peer gave a link the broker sends on (cold paths: at attach) ---------------
    @property
    def source_unspecified(self) -> bool:
        """The peer sent no source at all (Qpid JMS looks its durable subscription up so, to unsubscribe)."""
        return self.is_sender and lib.pn_terminus_get_type(lib.pn_link_remote_source(self.ptr)) == lib.PN_UNSPECIFIED

    @property
    def source_durability(self) -> int:
        """The source's terminus durability (AMQP 1.0 3.5.3): 0 none, 1 configuration, 2 unsettled-state."""
        return int(lib.pn_terminus_get_durability(lib.pn_link_remote_source(self.ptr)))

    @property
    def source_expires_never(self) -> bool:
        """The source's expiry-policy is `never` (AMQP 1.0 3.5.6): it outlives the link, session and connection."""
        return lib.pn_terminus_get_expiry_policy(lib.pn_link_remote_source(self.ptr)) == lib.PN_EXPIRE_NEVER

    @property
    def source_capabilities(self) -> list[str]:
        """The source's capabilities (one symbol or an array of them), as strings."""
        value = amqp_values.read(lib.pn_terminus_capabilities(lib.pn_link_remote_source(self.ptr)))
        values = value.elements if isinstance(value, Array) else value if isinstance(value, list) else \
            [] if value is None else [value]
        return [str(v) for v in values]

    def describe_source(self, address: str, durable: bool, capabilities: list[str]) -> None:
        """The source the broker's attach gives back, where it is not the peer's own: a subscription looked up
        by a link with no source, or a durability the broker does not honour. Cold path: at attach."""
        terminus = lib.pn_link_source(self.ptr)
        lib.pn_terminus_set_type(terminus, lib.PN_SOURCE)
        lib.pn_terminus_set_address(terminus, address.encode())
        lib.pn_terminus_set_durability(terminus, lib.PN_DELIVERIES if durable else lib.PN_NONDURABLE)
        lib.pn_terminus_set_expiry_policy(terminus, lib.PN_EXPIRE_NEVER if durable else lib.PN_EXPIRE_WITH_LINK)
        _put_symbols(Data(lib.pn_terminus_capabilities(terminus)), capabilities)

    @property
    def remote_container(self) -> str:
        return self.conn.remote_container

    # -- sending (the broker is the sender) --------------------------------------------------
    def credit(self) -> int:
        return _credit(self.addr)

    def send(self, data: bytes | list[bytes], settled: bool = False, tag: bytes | None = None) -> int | None:
        """Send one message (or the pieces of one, one after the other); returns the delivery handle
        (None when sent pre-settled)."""
        if tag is None:
            self._tag += 1
            tag = self._tag.to_bytes(8, "little")
        delivery = _send(self.addr, tag, data, settled)
        self._sent += 1
        self.conn.engine.dirty.add(self.conn)
        return delivery or None

    def granted_more(self, drain: bool) -> bool:
        """A flow on this link the broker sends on: did the peer grant more credit (or ask for a drain)?
        proton reports a flow after each message sent as well, for the credit it used: messages sent plus
        the credit left grow only by the peer's grants."""
        granted = self._sent + _credit(self.addr)
        more = granted > self._granted
        self._granted = granted
        return more or drain

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

    @staticmethod
    def state_fields(delivery: int) -> list[Any]:
        """The fields of the state the peer gave `delivery` (a `declared`: [txn-id]). A cold path."""
        fields = _remote_state_fields(delivery)
        return fields if isinstance(fields, list) else []

    def remote_error(self) -> str | None:
        cond = lib.pn_link_remote_condition(self.ptr)
        if not lib.pn_condition_is_set(cond):
            return None
        return f"{_text(lib.pn_condition_get_name(cond))}: {_text(lib.pn_condition_get_description(cond))}"

    def drained(self) -> None:
        """Answer a drain request: no more to send, the rest of the credit is spent."""
        if _drained(self.addr):
            self._granted = self._sent  # the credit left is gone
            self.conn.engine.dirty.add(self.conn)

    def output_full(self) -> bool:
        """Is more than limits.output_buffer waiting to be written on this link's connection? If so the
        handler's on_credit is called once it has drained below that (a peer that reads its socket
        slowly gets nothing more meanwhile, and nothing stalls once it has read)."""
        conn = self.conn
        if conn.backlog() <= conn.engine.output_buffer:
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
        _settle(delivery, outcome)
        self.conn.engine.dirty.add(self.conn)

    def settle_with_state(self, delivery: int, state: int, fields: list[Any]) -> None:
        """Settle with a state proton has no name for (a transaction's `declared`, a `transactional-state`):
        its fields are encoded through proton's Data. A cold path."""
        data = Data(lib.pn_disposition_data(lib.pn_delivery_local(_delivery(delivery))))
        data.clear()
        data.put_object(fields)
        _settle(delivery, state)
        self.conn.engine.dirty.add(self.conn)

    def in_transaction(self, delivery: int, txn_id: bytes, outcome: int = 0) -> None:
        """Put `delivery` under transaction `txn_id` without settling it: a transfer just sent (its frame,
        written at the end of the pass, carries the state), or with `outcome` one given in it. A cold path:
        the shard relay passing a client's transactional work to the owner."""
        data = Data(lib.pn_disposition_data(lib.pn_delivery_local(_delivery(delivery))))
        data.clear()
        data.put_object([txn_id, Described(ulong(outcome), [])] if outcome else [txn_id])
        lib.pn_delivery_update(_delivery(delivery), TRANSACTIONAL)
        self.conn.engine.dirty.add(self.conn)

    # -- receiving ---------------------------------------------------------------------------
    def received(self, size: int) -> None:
        """A message of `size` bytes came: its credit is owed, and granted again once half the window is."""
        self._received += 1
        self._received_bytes += size
        if (self._received >= self.window >> 1 or self._received_bytes >= RECEIVE_BYTES >> 1) and not self.held:
            self._top_up()

    def _top_up(self) -> None:
        """Bring the peer's credit up to the window, first sized to the messages taken since the last top-up.
        Credit granted cannot be taken back: when the window shrinks below what the peer holds, the peer
        gets none until it is under."""
        peer_holds = self.window - self._received
        if self._received_bytes:
            size = self._received_bytes // self._received
            share = self.conn.engine.receive_share.window(self.addr)
            self.window = max(RECEIVE_MIN, min(share, RECEIVE_BYTES // max(size, 1)))
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
        self.conn.engine.forget_link(self)
        self.conn.engine.dirty.add(self.conn)  # the detach goes out this pass, even from a timer



# proton matches each attach it receives to a link by walking every link of its session by name, on both
# ends: a backup's 10,000 queue links on one session cost the primary seconds of that walk at a failover.
LINKS_PER_SESSION: Final = 256


class ProtonConnection:
    """One connection's proton objects: its pn_connection, the pn_transport bound to it and, for one
    the broker opens, the sessions of its links. Its bytes in and out pass through here."""

    def __init__(self, collector: Any, max_frame_size: int | None, idle_ms: int, max_message_size: int = 0) -> None:
        """`max_frame_size` for a connection the broker accepted (it is the server), None for its own;
        `max_message_size`: the largest message its reader keeps (0: any)."""
        self.transport = lib.pn_transport()
        # every byte of input goes to proton through it: it keeps large messages' bodies out of proton (_pn.c)
        self.reader = _pn.reader(max_message_size)
        self.transport_addr = address(self.transport)
        self.left = b""  # output taken from proton that the socket has not all taken yet (_pn.write) ...
        self.left_at = 0  # ... and how much of it it has
        if max_frame_size is not None:
            lib.pn_transport_set_server(self.transport)
            lib.pn_transport_set_max_frame(self.transport, max_frame_size)
        if idle_ms:
            lib.pn_transport_set_idle_timeout(self.transport, idle_ms)
        self.ptr = lib.pn_connection()
        lib.pn_connection_collect(self.ptr, collector)
        lib.pn_transport_bind(self.transport, self.ptr)
        self.session: Any = None  # the session an outgoing connection's next link goes on
        self.session_links = 0  # links opened on it

    def identify(self, container_id: bytes, hostname: str, idle_timeout: float) -> None:
        """An outgoing connection's container id, the host it opens to and its idle timeout (if any)."""
        lib.pn_connection_set_container(self.ptr, container_id)
        lib.pn_connection_set_hostname(self.ptr, hostname.encode())
        if idle_timeout:
            lib.pn_transport_set_idle_timeout(self.transport, int(idle_timeout * 1000))

    def open_client(self) -> None:
        """Open an outgoing connection (its SASL exchange is over)."""
        lib.pn_connection_open(self.ptr)

    def link_session(self) -> Any:
        """The session for an outgoing connection's next link: a new one every LINKS_PER_SESSION links."""
        if self.session is None or self.session_links >= LINKS_PER_SESSION:
            self.session = lib.pn_session(self.ptr)
            lib.pn_session_open(self.session)
            self.session_links = 0
        self.session_links += 1
        return self.session

    # -- input -------------------------------------------------------------------------------
    def push(self, data: bytes) -> bool:
        """Input read elsewhere (decrypted by TLS, or after the preamble), through the reader to proton. False:
        the reader failed the connection (`failure` says why)."""
        return bool(_feed(self.transport_addr, self.reader, data))

    def read(self, fd: int, budget: int) -> int:
        """Read the socket through the reader into proton's input buffer (a plain connection past SASL): the
        bytes read; -1: closed; -2: the reader failed the connection (`failure` says why)."""
        return _read(self.transport_addr, fd, budget, self.reader)

    def failure(self) -> str:
        """Why the reader failed the connection: input it cannot follow in the middle of a large message (its
        input is dropped from there)."""
        return _pn.reader_error(self.reader) or "input the broker could not read"

    def close_tail(self) -> None:
        lib.pn_transport_close_tail(self.transport)

    # -- output ------------------------------------------------------------------------------
    def pending(self) -> int:
        """The bytes of output proton has (it encodes what is due first); < 0 once its output is closed. Asked
        in each dispatch (Link.output_full): through _pn, not cffi."""
        return _pending(self.transport_addr)

    def write(self, fd: int) -> int:
        """Write proton's output to the socket, many frames a call. WRITTEN, WRITE_CLOSED, WRITE_FULL or
        WRITE_FAILED."""
        status, self.left, self.left_at = _write(self.transport_addr, fd, self.left, self.left_at)
        return status

    def peek_output(self) -> bytes:
        """The next piece of proton's output (empty if none), left in its buffer until `pop_output`."""
        pending = lib.pn_transport_pending(self.transport)
        if pending <= 0:
            return b""
        n = min(pending, _OUTPUT_CHUNK)
        lib.pn_transport_peek(self.transport, _OUTPUT_BUFFER, n)
        return _OUTPUT_VIEW[:n]

    def pop_output(self, n: int) -> None:
        lib.pn_transport_pop(self.transport, n)

    def transport_closed(self) -> bool:
        return bool(lib.pn_transport_closed(self.transport))

    def tick(self, now_ms: int) -> int:
        """Let proton send a heartbeat or notice the peer's silence; when to tick again (0: not known)."""
        return lib.pn_transport_tick(self.transport, now_ms)

    # -- the connection ----------------------------------------------------------------------
    def close(self, condition: str | None, description: str, info: dict[str, Any] | None = None) -> None:
        """Close the AMQP connection (with an error and its info map if given), opening it first if it was not."""
        if condition:
            _set_condition(lib.pn_connection_condition(self.ptr), condition, description, info)
        if not lib.pn_connection_state(self.ptr) & lib.PN_LOCAL_ACTIVE:
            lib.pn_connection_open(self.ptr)
        lib.pn_connection_close(self.ptr)

    def release(self) -> None:
        """Free the transport and the connection (the socket is gone), and the bodies the reader holds: now,
        as proton's buffers are, not when this object is collected (perhaps only by a rare cyclic collection)."""
        _pn.reader_close(self.reader)
        lib.pn_transport_unbind(self.transport)
        lib.pn_decref(self.transport)
        # release frees the connection's sessions, links and deliveries; the decref gives back our own
        # reference (pn_connection_free does both), without which every connection's memory stayed.
        lib.pn_connection_release(self.ptr)
        lib.pn_decref(self.ptr)

    def set_properties(self, properties: dict[Any, Any]) -> None:
        amqp_values.write(lib.pn_connection_properties(self.ptr), properties)

    @property
    def remote_properties(self) -> dict[str, Any]:
        value = amqp_values.read(lib.pn_connection_remote_properties(self.ptr))
        return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


class ProtonEvents:
    """proton's collector, and what its events mean: each goes to its link's handler or to the broker
    (`engine.handler`), with proton answered (an attach, a close, a refusal)."""

    def __init__(self, engine: "Engine") -> None:
        self.engine = engine
        self.collector = lib.pn_collector()
        self._collector = address(self.collector)
        self.by_ptr: dict[Any, Connection] = {}  # the engine's connections, by their pn_connection_t*
        self._handlers: dict[int, Callable[[Any], None]] = {
            kind: getattr(self, name) for kind, name in _KEPT_EVENTS.items()}

    def drain(self) -> None:
        """Handle proton's events in order: runs of them through _pn.drain (deliveries and flows: the hot
        path), each it stops at here. Every event is popped, whatever its handler does."""
        links = self.engine.links
        while True:
            try:
                items = _drain(self._collector, self.engine.limits.max_message_size)
            except Exception:
                log.exception("error reading proton's events")
                continue
            if not items:
                return
            for item in items:
                kind = item[0]
                if kind == _EVENT:  # the last of the run
                    self._on_kept_event(item[1])
                    continue
                link = links.get(item[1])
                if link is None:
                    continue
                try:
                    if kind == _TRANSFER:
                        self._on_message(link, item[2], item[3], item[4])
                    elif kind == _OUTCOME:
                        self._on_outcome(link, item[2], item[3], item[4], item[5])
                    elif kind == _FLOW:
                        self._on_flow(link, item[2])
                    elif kind == _LOST:
                        self._on_lost(link, item[3])
                    else:
                        self._on_raw_transfer(link, item[2], item[3])
                except Exception:
                    log.exception("error handling a delivery or flow on link '%s'", link.name)

    def _on_kept_event(self, kind: int) -> None:
        """The event at the collector's head, one of _KEPT_EVENTS: handled, then popped."""
        collector = self.collector
        handler = self._handlers.get(kind)
        try:
            if handler is not None:
                handler(lib.pn_collector_peek(collector))
        except Exception:
            log.exception("error handling proton event %s", ffi.string(lib.pn_event_type_name(kind)))
        lib.pn_collector_pop(collector)

    def _on_flow(self, link: Link, drain: bool) -> None:
        """A flow: on a link the broker sends on, news only when the peer granted more (or asks for a
        drain); on one it receives on, the peer's answer to a drain (or the broker's own grant)."""
        handler = link.handler
        if handler is not None and (not link.is_sender or link.granted_more(drain)):
            handler.on_credit()

    def _on_message(self, link: Link, delivery: int, data: bytes, settled: bool) -> None:
        """A whole message from a publisher (read and advanced past by _pn.drain)."""
        link.received(len(data))
        link.handler.on_message(delivery, data, settled)  # type: ignore[union-attr]

    def _on_lost(self, link: Link, why: str) -> None:
        """A message _pn.drain could not read (its link is past it): the link is closed saying why, so
        that the peer learns its message was not taken."""
        log.error("link '%s': a message could not be read: %s", link.name, why)
        link.close(INTERNAL, f"a message could not be read: {why}")

    def _on_raw_transfer(self, link: Link, handle: int, taken: bytes | int | None) -> None:
        """A delivery _pn.drain left to be handled here: aborted, over limits.max_message_size (whole or
        not yet), a whole transactional one, or one that was behind such a message on its link. `taken`:
        the message's bytes when _pn's reader had them already, the size of one it dropped over the limit."""
        delivery = _delivery(handle)
        if lib.pn_delivery_aborted(delivery):
            lib.pn_delivery_settle(delivery)  # what proton held of it goes with it
            return
        if not lib.pn_delivery_readable(delivery):
            return
        ptr = link.ptr
        pending = lib.pn_delivery_pending(delivery) if taken is None else \
            taken if isinstance(taken, int) else len(taken)
        # Clients' messages only: what a primary sends its backups (batches, events) is the broker's own.
        limit = self.engine.limits.max_message_size if link.conn.client is None else 0
        # (a body the reader dropped was over the limit it was given when the connection was made)
        if isinstance(taken, int) or (limit and pending > limit):
            if taken is None and lib.pn_delivery_partial(delivery):
                link.close(MESSAGE_SIZE_EXCEEDED, f"message larger than limits.max_message_size {limit} bytes")
                return
            lib.pn_link_advance(ptr)  # its bytes are dropped with the settlement
            link.settle(handle, REJECTED, MESSAGE_SIZE_EXCEEDED,
                        f"message of {pending} bytes is over limits.max_message_size {limit}")
            return
        if isinstance(taken, bytes):
            data = taken
        else:
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
        fields = _remote_state_fields(handle)
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
        _settle(delivery, 0)
        self.engine.dirty.add(link.conn)

    def _on_txn_outcome(self, link: Link, delivery: int) -> None:
        """An outcome under a transaction: [txn-id, outcome] (left unsettled: the transaction settles it)."""
        fields = _remote_state_fields(delivery)
        if not isinstance(fields, list) or len(fields) < 2 or fields[0] is None:
            return  # a transactional state with no outcome yet: nothing to do until it has one
        link.handler.on_txn_outcome(delivery, bytes(fields[0]), _outcome_code(fields[1]))  # type: ignore[union-attr]

    def _conn_of(self, event: Any) -> Connection | None:
        return self.by_ptr.get(lib.pn_event_connection(event))

    def _on_connection_remote_open(self, event: Any) -> None:
        conn = self._conn_of(event)
        if conn is None:
            return
        conn.remote_container = _text(lib.pn_connection_remote_container(conn.proton.ptr)) or ""
        if conn.client is not None:
            conn.client.on_open(conn)
            return
        conn.handshake_deadline = 0
        lib.pn_connection_set_container(conn.proton.ptr, self.engine.container_id)
        if conn.user is not None:  # the refusal so far is the engine's at accept, which an exempt user is spared
            limited = self.engine.connection_limits.opened(conn.host, conn.user,
                                                           None if conn.refusal is None else conn.refusal.description)
            conn.refusal = None if limited is None else BrokerError(RESOURCE_LIMIT, limited)
            conn.logged_in = limited is None
        if conn.refusal is None:
            try:
                self.engine.handler.connection_opened(conn)
            except BrokerError as e:
                conn.refusal = e
        refusal = conn.refusal
        if refusal is not None:
            self.engine.refusal_log(INFO, conn.peer, refusal.description, "connection %s (%s, user %s) refused: %s",
                                    conn.peer, conn.remote_container, conn.user, refusal.description)
            conn.close(refusal.condition, refusal.description, refusal.info)
            return
        _put_symbols(Data(lib.pn_connection_offered_capabilities(conn.proton.ptr)), self.engine.offered_capabilities)
        lib.pn_connection_open(conn.proton.ptr)
        self.engine.dirty.add(conn)

    def _on_connection_remote_close(self, event: Any) -> None:
        conn = self._conn_of(event)
        if conn is None:
            return
        cond = lib.pn_connection_remote_condition(conn.proton.ptr)
        if lib.pn_condition_is_set(cond):
            conn.client_error = f"{_text(lib.pn_condition_get_name(cond))}: " \
                                f"{_text(lib.pn_condition_get_description(cond))}"
        for link in list(conn.links.values()):
            self.engine.forget_link(link)
        lib.pn_connection_close(conn.proton.ptr)
        conn.closing = True
        self.engine.dirty.add(conn)

    def _on_session_remote_open(self, event: Any) -> None:
        session = lib.pn_event_session(event)
        conn = self._conn_of(event)
        if conn is None or conn.closing:  # a refused connection's pipelined begin goes unanswered, with it
            return
        conn.sessions += 1
        lib.pn_session_open(session)
        limit = self.engine.limits.max_sessions_per_connection
        if conn.sessions > limit and not self.engine.connection_limits.exempt(conn.user):
            _set_condition(lib.pn_session_condition(session), RESOURCE_LIMIT,
                           f"too many sessions (limits.max_sessions_per_connection {limit})")
            lib.pn_session_close(session)
        self.engine.dirty.add(conn)

    def _on_session_remote_close(self, event: Any) -> None:
        session = lib.pn_event_session(event)
        conn = self._conn_of(event)
        if conn is None:
            return
        conn.sessions -= 1
        for link in [l for l in conn.links.values() if lib.pn_link_session(l.ptr) == session]:
            self.engine.forget_link(link)
        lib.pn_session_close(session)
        self.engine.dirty.add(conn)

    def _on_link_remote_open(self, event: Any) -> None:
        ptr = lib.pn_event_link(event)
        conn = self._conn_of(event)
        if conn is None or address(ptr) in self.engine.links:  # our own outgoing link, answered
            return
        if conn.closing:  # refused (or closing): its pipelined attach must not reach the broker
            return
        link = Link(ptr, conn)
        self.engine.dirty.add(conn)
        remote_source, remote_target = lib.pn_link_remote_source(ptr), lib.pn_link_remote_target(ptr)
        lib.pn_terminus_copy(lib.pn_link_source(ptr), remote_source)
        lib.pn_terminus_copy(lib.pn_link_target(ptr), remote_target)
        try:
            limit = self.engine.limits.max_links_per_connection
            if len(conn.links) >= limit and not self.engine.connection_limits.exempt(conn.user):
                raise BrokerError(RESOURCE_LIMIT, f"too many links on this connection "
                                                  f"(limits.max_links_per_connection {limit})")
            link.handler = self.engine.handler.link_opened(link)
        except BrokerError as e:
            log.debug("link '%s' to %s refused: %s", link.name, link.address, e.description)
            # Refusing an attach: answer it with a null terminus, then detach with the error.
            lib.pn_terminus_set_type(lib.pn_link_source(ptr) if link.is_sender else lib.pn_link_target(ptr),
                                     lib.PN_UNSPECIFIED)
            lib.pn_link_open(ptr)
            _set_condition(lib.pn_link_condition(ptr), e.condition, e.description, e.info)
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
            if self.engine.limits.max_message_size:
                lib.pn_link_set_max_message_size(ptr, self.engine.limits.max_message_size)
        self.engine.links[link.addr] = link
        conn.links[link.addr] = link
        lib.pn_link_open(ptr)
        if not link.is_sender:
            link.window = link._received = RECEIVE_FIRST  # the whole window is owed: granted unless held
            if not link.held:
                link.resume_credit()
        elif lib.pn_link_credit(ptr):
            link.handler.on_credit()

    def _on_link_remote_close(self, event: Any) -> None:
        ptr = lib.pn_event_link(event)
        link = self.engine.links.get(address(ptr))
        closed = lib.pn_event_type(event) == lib.PN_LINK_REMOTE_CLOSE
        if link is not None:
            link.remote_closed = closed
            self.engine.forget_link(link)
        (lib.pn_link_close if closed else lib.pn_link_detach)(ptr)
        conn = self._conn_of(event)
        if conn is not None:
            self.engine.dirty.add(conn)

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
        if lib.pn_condition_is_set(lib.pn_transport_condition(conn.proton.transport)) or \
                lib.pn_connection_state(conn.proton.ptr) & lib.PN_REMOTE_CLOSED:
            return
        log.warning("connection %s: closed: it sent a frame that could not be read", conn.peer)
        conn.close(FRAMING_ERROR, "a frame that could not be read")
