"""The `$management` node: request/response management of queues, exchanges, bindings and the
broker itself (design/management.md). A cold path, so messages are decoded with proton's Message.

At scale: a QUERY answers one page of what it matches (query_pages.py); requests wait at their link, where a
client holds a small window of credit for them, and are answered in turns (management_turns.py)."""
from __future__ import annotations

import logging
import time
from collections import deque
from operator import attrgetter
from typing import Any, Callable, Protocol

from proton import Message

from .access import ADMIN, MANAGE, RECEIVE, SEE, SEND, Access
from .connection import Connection
from .errors import (BrokerError, CONNECTION_FORCED, DECODE, INVALID_FIELD, NOT_FOUND, NOT_IMPLEMENTED,
                     RESOURCE_LOCKED)
from .management_purge import PurgeInTurns, purge_whole
from .management_turns import Turns
from .proton_adapter import ACCEPTED, REJECTED, Link, LinkHandler
from .query_pages import Listing, Listings
from .queue import ACQUIRED, DEFERRED, Queue
from .registry import Registry

log = logging.getLogger("haqueue.management")

ADDRESS = "$management"

# The credit a client holds on a $management link: requests it may have waiting, one more granted as each is
# answered. It bounds what the broker buffers and decodes for one client (a publisher's window, up to 2,000).
WINDOW = 100
PEEK_DEFAULT, PEEK_MOST = 10, 100  # messages a PEEK answers by default, and at most
ENTRY_STATES = {ACQUIRED: "acquired", DEFERRED: "scheduled"}  # a peeked message's state, else "available"

# (name, request body) -> (status code, answer body)
Operation = Callable[[str | None, dict[str, Any]], tuple[int, Any]]
# (name, request body) -> the (action, address) pairs a request needs (access.py); for ADMIN the address
# names the operation in a refusal
Needs = Callable[[str | None, dict[str, Any]], list[tuple[str, str]]]
# (status code, description, answer body): how a deferred operation answers
Answer = Callable[[int, str, Any], None]
# (name, request body, user, answer) -> None: an operation that answers later, once other processes have (the
# shard plug-in's wiring broadcast); what it needs is checked first, as its local operation's needs say
Deferred = Callable[[str | None, dict[str, Any], str | None, Answer], None]


def _name(name: str | None) -> str:
    if not name:
        raise BrokerError(INVALID_FIELD, "this operation needs a 'name'")
    return str(name)


def _binding_fields(body: dict[str, Any]) -> tuple[str, str, str, dict[str, Any]]:
    args = dict(body)
    try:
        exchange, queue = str(args.pop("exchange")), str(args.pop("queue"))
    except KeyError as e:
        raise BrokerError(INVALID_FIELD, f"a binding needs {e}") from None
    return exchange, queue, str(args.pop("key", "") or ""), args


def _admin(type_: str, operation: str) -> Needs:
    return lambda name, body: [(ADMIN, f"{operation} {type_}")]


def _on_name(action: str) -> Needs:
    return lambda name, body: [(action, _name(name))]


def _create_queue_needs(name: str | None, body: dict[str, Any]) -> list[tuple[str, str]]:
    """A dead-letter address is sent to by the broker on the queue's behalf: its creator must be allowed to."""
    needs = [(MANAGE, _name(name))]
    if body.get("dead_letter_address"):
        needs.append((SEND, str(body["dead_letter_address"])))
    return needs


def _binding_needs(name: str | None, body: dict[str, Any]) -> list[tuple[str, str]]:
    """Binding a queue changes what it gets (manage on the queue) and gives it the exchange's messages
    (receive on the exchange, as subscribing to the exchange would)."""
    exchange, queue, _, _ = _binding_fields(body)
    return [(MANAGE, queue), (RECEIVE, exchange)]


class ManagementHost(Protocol):
    """What the management node needs of the broker (server.Broker)."""

    access: Access
    registry: Registry
    connections: set[Connection]

    def status(self) -> dict[str, Any]:
        """The broker's own status (the `broker` READ)."""

    def deliver(self, address: str, data: bytes) -> None:
        """Route a message the broker makes (a reply) to `address`."""

    def schedule(self, item: Any) -> None:
        """Call item.dispatch() at the end of this pass."""


class Management:
    """The operations by (type, operation), each with what it needs; plug-ins (HA) add their own with
    `register`, where an operation needs `admin` unless it says otherwise. A QUERY lists by `queries.listings`, a page
    at a time (`queries`)."""

    def __init__(self, broker: ManagementHost) -> None:
        self.broker = broker
        self.access = broker.access
        self.operations: dict[tuple[str, str], tuple[Operation, Needs]] = {}
        # Operations answered later (a plug-in's, a purge's), in place of the local ones for requests from a client
        # (`answer`); `handle` still applies the local one (what a plug-in itself asks for).
        self.deferred: dict[tuple[str, str], Deferred] = {}
        self.turns = Turns(broker.schedule)
        registry = broker.registry
        self.queries = Listings(registry, self.access)
        self.register("queue", "CREATE", self._create_queue, _create_queue_needs)
        self.register("queue", "DELETE", lambda name, body: (204, registry.delete(_name(name), "queue") and None),
                      _on_name(MANAGE))
        self.register("queue", "READ", lambda name, body: (200, self._node(name, "queue").info()), _on_name(SEE))
        self.register("exchange", "CREATE", self._create_exchange, _on_name(MANAGE))
        self.register("exchange", "DELETE",
                      lambda name, body: (204, registry.delete(_name(name), "exchange") and None), _on_name(MANAGE))
        self.register("exchange", "READ", lambda name, body: (200, self._node(name, "exchange").info()),
                      _on_name(SEE))
        self.register("binding", "CREATE", self._bind, _binding_needs)
        self.register("binding", "DELETE", self._unbind, _binding_needs)
        self.register("queue", "PURGE", lambda name, body: (200, {"purged": purge_whole(self._node(name, "queue"))}),
                      _on_name(MANAGE))
        self.deferred[("queue", "PURGE")] = self._purge
        self.register("queue", "PEEK", self._peek, _on_name(RECEIVE))
        # Connections are an admin's to see and close; they change without the registry knowing, so a QUERY of
        # them lists them afresh each time.
        self.queries.listings["connection"] = Listing(lambda body: broker.connections, attrgetter("peer"),
                                                      _connection_names, _connection_info, admin_only=True)
        self.register("connection", "READ", lambda name, body: (200, _connection_info(self._connection(name), True)))
        self.register("connection", "DELETE", self._close_connection)
        self.register("broker", "READ", lambda name, body: (200, broker.status()))

    def register(self, type_: str, operation: str, handler: Operation, needs: Needs | None = None) -> None:
        self.operations[(type_, operation)] = (handler, needs or _admin(type_, operation))

    def check_reply_to(self, user: str | None, address: str) -> None:
        """Answers go to a temporary queue (a dynamic receiver's: unguessable), or where the caller may send:
        else a request could put answers into any queue."""
        node = self.broker.registry.lookup(address)
        if not (isinstance(node, Queue) and node.temporary):
            self.access.check(user, SEND, address)

    def endpoint(self, link: Link) -> "ManagementEndpoint":
        return ManagementEndpoint(self, link)

    # -- answering -----------------------------------------------------------------------
    def answer(self, request: Message, user: str | None, respond: Callable[[Message], None]) -> None:
        """Answer a client's request through `respond`: at once, or once a deferred operation has its answer."""
        props: dict[Any, Any] = request.properties or {}
        key = (str(props.get("type")), str(props.get("operation")))
        deferred = self.deferred.get(key)
        if deferred is None or key not in self.operations:
            respond(self.handle(request, user))
            return
        name, args = props.get("name"), _args(request)

        def reply(status: int, description: str, answer: Any) -> None:
            respond(_reply(request, status, description, answer))
        try:
            self._check(self.operations[key][1], name, args, user)
            deferred(name, args, user, reply)
        except Exception as e:  # noqa: BLE001 - whatever fails is answered, never raised into the pass
            reply(*failure(e), None)

    def handle(self, request: Message, user: str | None) -> Message:
        """Apply a request here and answer it; whatever fails is answered (a bug with 500), never raised."""
        try:
            status, answer, page = self._apply(request, user)
        except Exception as e:  # noqa: BLE001
            return _reply(request, *failure(e), None)
        return _reply(request, status, "OK", answer, page)

    def _apply(self, request: Message, user: str | None) -> tuple[int, Any, dict[str, Any]]:
        """(status, answer body, a QUERY's page properties)."""
        props: dict[Any, Any] = request.properties or {}
        operation, type_, name = props.get("operation"), str(props.get("type")), props.get("name")
        args = _args(request)
        if operation == "QUERY" and type_ in self.queries.listings:
            return self.queries.query(type_, props, args, user)
        found = self.operations.get((type_, str(operation)))
        if found is None:
            raise BrokerError(NOT_IMPLEMENTED, f"unknown operation {operation} on type {type_}")
        handler, needs = found
        self._check(needs, name, args, user)
        status, answer = handler(name, args)
        return status, answer, {}

    def _check(self, needs: Needs, name: str | None, args: dict[str, Any], user: str | None) -> None:
        for action, address in needs(name, args):
            self.access.check(user, action, address)

    # -- operations ----------------------------------------------------------------------
    def _purge(self, name: str | None, body: dict[str, Any], user: str | None, answer: Answer) -> None:
        """A client's PURGE, answered once done: a batch of paged messages a pass (management_purge.py)."""
        self.broker.schedule(PurgeInTurns(self._node(name, "queue"), self.broker.schedule, answer, failure))

    def _node(self, name: str | None, kind: str) -> Any:
        node = self.broker.registry.lookup(_name(name))
        if node is None or node.kind != kind:
            raise BrokerError(NOT_FOUND, f"no {kind} named '{name}'")
        return node

    @staticmethod
    def _created(node: Any, created: bool, args: dict[str, Any]) -> tuple[int, Any]:
        """201 for a new node, 200 for an existing one declared alike, 409 for one with other arguments."""
        if not created and any(node.args.get(k) != v for k, v in args.items()):
            raise BrokerError(RESOURCE_LOCKED, f"{node.kind} '{node.name}' exists with other arguments {node.args}")
        return (201 if created else 200), node.info()

    def _create_queue(self, name: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        return self._created(*self.broker.registry.declare_queue(_name(name), body), body)

    def _create_exchange(self, name: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        args = dict(body)
        type_ = str(args.pop("type", "direct"))
        return self._created(*self.broker.registry.declare_exchange(_name(name), type_, args), args)

    def _peek(self, name: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        """The first `count` messages (default PEEK_DEFAULT, at most PEEK_MOST) as they are held, taken by a
        consumer or not, without taking them: a browser's first look, answered at once."""
        count = body.get("count", PEEK_DEFAULT)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= PEEK_MOST:
            raise BrokerError(INVALID_FIELD, f"'count' must be a whole number 0..{PEEK_MOST}, got {count!r}")
        queue = self._node(name, "queue")
        return 200, [{"seq": e.seq, "state": ENTRY_STATES.get(e.state, "available"), "message": e.data}
                     for e in queue.first(count)]

    def _connection(self, name: str | None) -> Connection:
        """A connection by its name in a QUERY: its peer address."""
        conn = next((c for c in self.broker.connections if c.peer == name), None)
        if conn is None:
            raise BrokerError(NOT_FOUND, f"no connection from '{name}'")
        return conn

    def _close_connection(self, name: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        self._connection(name).close(CONNECTION_FORCED, str(body.get("reason") or "closed by an administrator"))
        return 204, None

    def _bind(self, name: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        exchange, queue, key, args = _binding_fields(body)
        binding, created = self.broker.registry.bind(exchange, queue, key, args)
        return (201 if created else 200), binding.info()

    def _unbind(self, name: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        exchange, queue, key, _ = _binding_fields(body)
        self.broker.registry.unbind(exchange, queue, key)
        return 204, None


def _connection_names(conn: Connection) -> tuple[str, ...]:
    """What a QUERY's filter matches: its peer address, container id and user."""
    return conn.peer, conn.remote_container, conn.user or ""


def _connection_info(conn: Connection, links: bool = False) -> dict[str, Any]:
    """A connection's attributes; with `links`, each of its links (a READ: a QUERY's page would grow too large)."""
    remote = conn.remote_properties or {}
    listener = conn.listener.options if conn.listener is not None else None
    info: dict[str, Any] = {"name": conn.peer, "user": conn.user, "container": conn.remote_container,
                            "listener": f"{listener.host}:{listener.port}" if listener is not None else None,
                            "tls": conn.tls is not None, "links": len(conn.links),
                            "product": str(remote.get("product", "")), "version": str(remote.get("version", ""))}
    if links:
        info["links"] = [{"name": link.name, "address": link.address or "",
                          "role": "consumer" if link.is_sender else "publisher"} for link in conn.links.values()]
    return info


def when_clear(call_later: Callable[[float, Callable[[], None]], Any], blocking: Callable[[], str | None],
               deadline: float, then: Callable[[str | None], None], poll: float = 0.05) -> None:
    """For a deferred request that waits for something to go first (HA's promote: the primary followed; the
    mirror's: a source): `then` gets what still blocks it, None once nothing does, or whatever does at `deadline`
    (monotonic)."""
    blocker = blocking()
    if blocker is not None and time.monotonic() < deadline:
        call_later(poll, lambda: when_clear(call_later, blocking, deadline, then, poll))
        return
    then(blocker)


def failure(e: Exception) -> tuple[int, str]:
    """How a request that raised is answered: a refusal as it says, a malformed request 400, a bug 500."""
    if isinstance(e, BrokerError):
        return e.status, e.description
    if isinstance(e, (TypeError, ValueError, KeyError)):
        return 400, f"bad request: {e}"
    log.exception("management request failed")
    return 500, f"internal error: {e!r}"


def _args(request: Message) -> dict[str, Any]:
    body = request.body if isinstance(request.body, dict) else {}
    return {str(k): v for k, v in body.items()}


def _reply(request: Message, status: int, description: str, answer: Any,
           properties: dict[str, Any] | None = None) -> Message:
    return Message(answer, correlation_id=request.id if request.id is not None else request.correlation_id,
                   address=request.reply_to,
                   properties={"statusCode": status, "statusDescription": description, **(properties or {})})


def _encoded(reply: Message) -> bytes:
    """The answer's bytes; if proton cannot encode it (DataException: over its 65,535 nodes), a 500 saying so."""
    try:
        return reply.encode()
    except Exception as e:  # noqa: BLE001 - proton raises its own errors
        log.warning("management answer to %s could not be encoded: %r", reply.address, e)
        failed = Message(correlation_id=reply.correlation_id, address=reply.address,
                         properties={"statusCode": 500,
                                     "statusDescription": f"the answer could not be encoded: {e!r}"})
        return failed.encode()


def decode_request(link: Link, delivery: Any, data: bytes) -> Message | None:
    """A request's message, or None once its delivery is rejected as undecodable."""
    request = Message()
    try:
        request.decode(data)
    except Exception as e:  # noqa: BLE001 - proton raises its own errors for bad bytes
        link.settle(delivery, REJECTED, DECODE, f"cannot decode request: {e}")
        return None
    return request


class ManagementEndpoint(LinkHandler):
    """The link a client sends requests on; answers go to each request's reply-to address. Requests wait here
    for their turn (Turns); the client holds WINDOW credit, one more granted as each is answered (or
    rejected), so a burst costs the broker at most WINDOW requests buffered, never a long pass."""

    def __init__(self, management: Management, link: Link) -> None:
        self.management = management
        self.link = link
        self.waiting: deque[tuple[Any, bytes, bool]] = deque()  # (delivery, its bytes, settled)
        link.hold_credit()  # not a publisher's window: this one's
        link.flow(WINDOW)

    def on_message(self, delivery: Any, data: bytes, settled: bool) -> None:
        self.waiting.append((delivery, data, settled))
        if len(self.waiting) == 1:
            self.management.turns.add(self)

    def on_detach(self) -> None:
        self.waiting.clear()  # their deliveries went with the link

    def answer_next(self) -> None:
        """Answer the oldest waiting request, or reject it."""
        delivery, data, settled = self.waiting.popleft()
        request = decode_request(self.link, delivery, data)
        if request is None or not self._answerable(request, delivery):
            self._refill()
            return
        self.management.answer(request, self.link.conn.user, self._respond)
        self.link.settle(delivery, 0 if settled else ACCEPTED)

    def _answerable(self, request: Message, delivery: Any) -> bool:
        """Whether the request's answer may go where it asks; if not, its delivery is rejected saying why."""
        if not request.reply_to:
            self.link.settle(delivery, REJECTED, INVALID_FIELD, "a management request needs reply-to")
            return False
        try:
            self.management.check_reply_to(self.link.conn.user, str(request.reply_to))
        except BrokerError as e:
            self.link.settle(delivery, REJECTED, e.condition, e.description)
            return False
        return True

    def _respond(self, reply: Message) -> None:
        try:
            self.management.broker.deliver(str(reply.address), _encoded(reply))
        except BrokerError as e:
            log.warning("management reply to %s not delivered: %s", reply.address, e.description)
        self._refill()

    def _refill(self) -> None:
        """A request was answered (a deferred one maybe after the link has gone): the client may send one more."""
        if not self.link.closed:
            self.link.flow(1)
