"""The `$management` node: request/response management of queues, exchanges, bindings and the
broker itself (design/management.md). A cold path, so messages are decoded with proton's Message."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

from proton import Message

from .engine import ACCEPTED, REJECTED, Link, LinkHandler
from .errors import BrokerError, INVALID_FIELD, NOT_FOUND, RESOURCE_LOCKED

if TYPE_CHECKING:
    from .server import Broker

log = logging.getLogger("haqueue.management")

ADDRESS = "$management"

# (name, request body) -> (status code, answer body)
Operation = Callable[[str | None, dict[str, Any]], tuple[int, Any]]


class Management:
    """The operations by (type, operation); plug-ins (HA) add their own with `register`."""

    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        self.operations: dict[tuple[str, str], Operation] = {}
        registry = broker.registry
        self.register("queue", "CREATE", self._create_queue)
        self.register("queue", "DELETE", lambda name, body: (204, registry.delete(self._name(name), "queue") and None))
        self.register("queue", "READ", lambda name, body: (200, self._node(name, "queue").info()))
        self.register("queue", "QUERY", lambda name, body: (200, [q.info() for q in registry.queues()]))
        self.register("exchange", "CREATE", self._create_exchange)
        self.register("exchange", "DELETE",
                      lambda name, body: (204, registry.delete(self._name(name), "exchange") and None))
        self.register("exchange", "READ", lambda name, body: (200, self._node(name, "exchange").info()))
        self.register("exchange", "QUERY", lambda name, body: (200, [x.info() for x in registry.exchanges()]))
        self.register("binding", "CREATE", self._bind)
        self.register("binding", "DELETE", self._unbind)
        self.register("binding", "QUERY", self._query_bindings)
        self.register("broker", "READ", lambda name, body: (200, broker.status()))

    def register(self, type_: str, operation: str, handler: Operation) -> None:
        self.operations[(type_, operation)] = handler

    def endpoint(self, link: Link) -> "ManagementEndpoint":
        return ManagementEndpoint(self, link)

    def handle(self, request: Message) -> Message:
        props = request.properties or {}
        operation, type_, name = props.get("operation"), props.get("type"), props.get("name")
        body = request.body if isinstance(request.body, dict) else {}
        reply = Message(correlation_id=request.id if request.id is not None else request.correlation_id,
                        address=request.reply_to)
        handler = self.operations.get((str(type_), str(operation)))
        if handler is None:
            status, description, answer = 501, f"unknown operation {operation} on type {type_}", None
        else:
            try:
                status, answer = handler(name, {str(k): v for k, v in body.items()})
                description = "OK"
            except BrokerError as e:
                status, description, answer = e.status, e.description, None
            except (TypeError, ValueError, KeyError) as e:
                status, description, answer = 400, f"bad request: {e}", None
        reply.properties = {"statusCode": status, "statusDescription": description}
        reply.body = answer
        return reply

    # -- operations ----------------------------------------------------------------------
    @staticmethod
    def _name(name: str | None) -> str:
        if not name:
            raise BrokerError(INVALID_FIELD, "this operation needs a 'name'")
        return str(name)

    def _node(self, name: str | None, kind: str) -> Any:
        node = self.broker.registry.lookup(self._name(name))
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
        return self._created(*self.broker.registry.declare_queue(self._name(name), body), body)

    def _create_exchange(self, name: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        args = dict(body)
        type_ = str(args.pop("type", "direct"))
        return self._created(*self.broker.registry.declare_exchange(self._name(name), type_, args), args)

    @staticmethod
    def _binding_fields(body: dict[str, Any]) -> tuple[str, str, str, dict[str, Any]]:
        args = dict(body)
        try:
            exchange, queue = str(args.pop("exchange")), str(args.pop("queue"))
        except KeyError as e:
            raise BrokerError(INVALID_FIELD, f"a binding needs {e}") from None
        return exchange, queue, str(args.pop("key", "") or ""), args

    def _bind(self, name: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        exchange, queue, key, args = self._binding_fields(body)
        binding, created = self.broker.registry.bind(exchange, queue, key, args)
        return (201 if created else 200), binding.info()

    def _unbind(self, name: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        exchange, queue, key, _ = self._binding_fields(body)
        self.broker.registry.unbind(exchange, queue, key)
        return 204, None

    def _query_bindings(self, name: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        found = [b.info() for b in self.broker.registry.bindings()]
        for field in ("exchange", "queue"):
            if field in body:
                found = [b for b in found if b[field] == body[field]]
        return 200, found


class ManagementEndpoint(LinkHandler):
    """The link a client sends requests on; answers go to each request's reply-to address."""

    def __init__(self, management: Management, link: Link) -> None:
        self.management = management
        self.link = link

    def on_message(self, delivery: Any, data: bytes, settled: bool) -> None:
        request = Message()
        try:
            request.decode(data)
        except Exception as e:
            self.link.settle(delivery, REJECTED, "amqp:decode-error", f"cannot decode request: {e}")
            return
        if not request.reply_to:
            self.link.settle(delivery, REJECTED, INVALID_FIELD, "a management request needs reply-to")
            return
        reply = self.management.handle(request)
        try:
            self.management.broker.deliver(request.reply_to, reply.encode())
        except BrokerError as e:
            log.warning("management reply to %s not delivered: %s", request.reply_to, e.description)
        self.link.settle(delivery, 0 if settled else ACCEPTED)



