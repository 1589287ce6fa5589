"""The `$management` node: request/response management of queues, exchanges, bindings and the
broker itself (design/management.md). A cold path, so messages are decoded with proton's Message."""
from __future__ import annotations

import logging
from typing import Any, Callable, Protocol

from proton import Message

from .access import ADMIN, MANAGE, RECEIVE, SEE, SEND, Access
from .errors import BrokerError, DECODE, INVALID_FIELD, NOT_FOUND, RESOURCE_LOCKED
from .proton_adapter import ACCEPTED, REJECTED, Link, LinkHandler
from .queue import Queue
from .registry import Registry

log = logging.getLogger("haqueue.management")

ADDRESS = "$management"

# (name, request body) -> (status code, answer body)
Operation = Callable[[str | None, dict[str, Any]], tuple[int, Any]]
# (name, request body) -> the (action, address) pairs a request needs (access.py); for ADMIN the address
# names the operation in a refusal
Needs = Callable[[str | None, dict[str, Any]], list[tuple[str, str]]]
# an answer's item -> the names it concerns: a QUERY lists the items whose names the caller may SEE one of
Shows = Callable[[dict[str, Any]], list[str]]
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


def _anyone(name: str | None, body: dict[str, Any]) -> list[tuple[str, str]]:
    return []  # a QUERY: its answer is cut to what the caller may see


class ManagementHost(Protocol):
    """What the management node needs of the broker (server.Broker)."""

    access: Access
    registry: Registry

    def status(self) -> dict[str, Any]:
        """The broker's own status (the `broker` READ)."""

    def deliver(self, address: str, data: bytes) -> None:
        """Route a message the broker makes (a reply) to `address`."""


class Management:
    """The operations by (type, operation), each with what it needs; plug-ins (HA) add their own with
    `register`, where an operation needs `admin` unless it says otherwise."""

    def __init__(self, broker: ManagementHost) -> None:
        self.broker = broker
        self.access = broker.access
        self.operations: dict[tuple[str, str], tuple[Operation, Needs, Shows | None]] = {}
        # Operations a plug-in answers later, in place of the local ones for requests from a client (`answer`);
        # `handle` still applies the local one (what the plug-in itself asks for).
        self.deferred: dict[tuple[str, str], Deferred] = {}
        registry = broker.registry
        names: Shows = lambda item: [item["name"]]
        self.register("queue", "CREATE", self._create_queue, _create_queue_needs)
        self.register("queue", "DELETE", lambda name, body: (204, registry.delete(_name(name), "queue") and None),
                      _on_name(MANAGE))
        self.register("queue", "READ", lambda name, body: (200, self._node(name, "queue").info()), _on_name(SEE))
        self.register("queue", "QUERY", lambda name, body: (200, [q.info() for q in registry.queues()]),
                      _anyone, names)
        self.register("exchange", "CREATE", self._create_exchange, _on_name(MANAGE))
        self.register("exchange", "DELETE",
                      lambda name, body: (204, registry.delete(_name(name), "exchange") and None), _on_name(MANAGE))
        self.register("exchange", "READ", lambda name, body: (200, self._node(name, "exchange").info()),
                      _on_name(SEE))
        self.register("exchange", "QUERY", lambda name, body: (200, [x.info() for x in registry.exchanges()]),
                      _anyone, names)
        self.register("binding", "CREATE", self._bind, _binding_needs)
        self.register("binding", "DELETE", self._unbind, _binding_needs)
        self.register("binding", "QUERY", self._query_bindings, _anyone,
                      lambda binding: [binding["queue"], binding["exchange"]])
        self.register("broker", "READ", lambda name, body: (200, broker.status()))

    def register(self, type_: str, operation: str, handler: Operation, needs: Needs | None = None,
                 shows: Shows | None = None) -> None:
        self.operations[(type_, operation)] = (handler, needs or _admin(type_, operation), shows)

    def check_reply_to(self, user: str | None, address: str) -> None:
        """Answers go to a temporary queue (a dynamic receiver's: unguessable), or where the caller may send:
        else a request could put answers into any queue."""
        node = self.broker.registry.lookup(address)
        if not (isinstance(node, Queue) and node.temporary):
            self.access.check(user, SEND, address)

    def endpoint(self, link: Link) -> "ManagementEndpoint":
        return ManagementEndpoint(self, link)

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
        except BrokerError as e:
            reply(e.status, e.description, None)
        except (TypeError, ValueError, KeyError) as e:
            reply(400, f"bad request: {e}", None)

    def handle(self, request: Message, user: str | None) -> Message:
        """Apply a request here and answer it."""
        props: dict[Any, Any] = request.properties or {}
        operation, type_, name = props.get("operation"), props.get("type"), props.get("name")
        found = self.operations.get((str(type_), str(operation)))
        if found is None:
            return _reply(request, 501, f"unknown operation {operation} on type {type_}", None)
        handler, needs, shows = found
        try:
            args = _args(request)
            self._check(needs, name, args, user)
            status, answer = handler(name, args)
            if shows is not None:
                answer = [item for item in answer
                          if any(self.access.may(user, SEE, n) for n in shows(item))]
            return _reply(request, status, "OK", answer)
        except BrokerError as e:
            return _reply(request, e.status, e.description, None)
        except (TypeError, ValueError, KeyError) as e:
            return _reply(request, 400, f"bad request: {e}", None)

    def _check(self, needs: Needs, name: str | None, args: dict[str, Any], user: str | None) -> None:
        for action, address in needs(name, args):
            self.access.check(user, action, address)

    # -- operations ----------------------------------------------------------------------
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

    def _bind(self, name: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        exchange, queue, key, args = _binding_fields(body)
        binding, created = self.broker.registry.bind(exchange, queue, key, args)
        return (201 if created else 200), binding.info()

    def _unbind(self, name: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        exchange, queue, key, _ = _binding_fields(body)
        self.broker.registry.unbind(exchange, queue, key)
        return 204, None

    def _query_bindings(self, name: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        found = [b.info() for b in self.broker.registry.bindings()]
        for field in ("exchange", "queue"):
            if field in body:
                found = [b for b in found if b[field] == body[field]]
        return 200, found


def _args(request: Message) -> dict[str, Any]:
    body = request.body if isinstance(request.body, dict) else {}
    return {str(k): v for k, v in body.items()}


def _reply(request: Message, status: int, description: str, answer: Any) -> Message:
    return Message(answer, correlation_id=request.id if request.id is not None else request.correlation_id,
                   address=request.reply_to, properties={"statusCode": status, "statusDescription": description})


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
    """The link a client sends requests on; answers go to each request's reply-to address."""

    def __init__(self, management: Management, link: Link) -> None:
        self.management = management
        self.link = link

    def on_message(self, delivery: Any, data: bytes, settled: bool) -> None:
        request = decode_request(self.link, delivery, data)
        if request is None:
            return
        if not request.reply_to:
            self.link.settle(delivery, REJECTED, INVALID_FIELD, "a management request needs reply-to")
            return
        user = self.link.conn.user
        try:
            self.management.check_reply_to(user, str(request.reply_to))
        except BrokerError as e:
            self.link.settle(delivery, REJECTED, e.condition, e.description)
            return
        self.management.answer(request, user, self._respond)
        self.link.settle(delivery, 0 if settled else ACCEPTED)

    def _respond(self, reply: Message) -> None:
        try:
            self.management.broker.deliver(str(reply.address), reply.encode())
        except BrokerError as e:
            log.warning("management reply to %s not delivered: %s", reply.address, e.description)



