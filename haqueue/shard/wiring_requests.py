"""A shard primary's end of the wiring broadcast (wiring_broadcast.py): the requests another process sends to
`$shard.wiring`, applied here as management requests of the client they name.

Each request is a management request (operation, type, name, body) with two properties: the client user it acts
for (checked here again with that user's rights) and, for a queue or binding, the shard owning the queue. The
answer is the transfer's outcome: accepted, or rejected with the refusal's condition and description. In a shard
that does not own the queue, a queue's declare makes its forwarding queue, a binding first makes the forwarding
queue if it is missing (a queue auto-created, or declared while this shard was down), and a queue's delete
removes the forwarding queue if there is one.
"""
from __future__ import annotations

from typing import Any

from proton import Message

from ..broker.errors import INTERNAL, INVALID_FIELD, NOT_FOUND, RESOURCE_LOCKED, UNAUTHORIZED, NOT_IMPLEMENTED
from ..broker.management import decode_request
from ..broker.proton_adapter import ACCEPTED, REJECTED, Link, LinkHandler
from ..broker.server import Broker
from .forwarding_queues import forwarded_to, forwarding_args
from .relayed_links import RELAYED_FOR
from .wiring_versions import STAMP, exists, key_of, record

ADDRESS = "$shard.wiring"
OWNER = "x-shard-owner"  # a request's property: the shard owning the queue it concerns

# A refusal's status as the condition a rejection carries, and back (403: a permission, the usual one here).
CONDITIONS = {400: INVALID_FIELD, 403: UNAUTHORIZED, 404: NOT_FOUND, 409: RESOURCE_LOCKED, 501: NOT_IMPLEMENTED}


def status_of(reply: Message) -> tuple[int, str]:
    props: dict[Any, Any] = reply.properties or {}
    return int(props.get("statusCode", 500)), str(props.get("statusDescription", ""))


def _request(operation: str, type_: str, name: str | None, body: dict[str, Any]) -> Message:
    return Message(properties={"operation": operation, "type": type_, "name": name}, body=body)


def apply(broker: Broker, shard: int, request: Message, user: str | None) -> Message:
    """Apply a broadcast request in this shard (`shard`); the management answer. What it creates gets the
    request's stamp, what it deletes leaves a tombstone of that stamp (wiring_versions.py)."""
    props: dict[Any, Any] = request.properties or {}
    operation, type_, name = props.get("operation"), props.get("type"), props.get("name")
    body = request.body if isinstance(request.body, dict) else {}
    key = key_of(str(type_), name, body)
    registry = broker.registry
    if key is not None and operation == "CREATE" and not exists(registry, key):
        body = {**body, STAMP: float(props.get(STAMP) or 0)}  # not on a repeat: 200, its arguments unchanged
        request = Message(properties=props, body=body)
    reply = _apply(broker, shard, request, body, user)
    if key is not None and operation == "DELETE" and status_of(reply)[0] < 300:
        record(registry, key, float(props.get(STAMP) or 0))
    return reply


def _apply(broker: Broker, shard: int, request: Message, body: dict[str, Any], user: str | None) -> Message:
    props: dict[Any, Any] = request.properties or {}
    operation, type_, name, owner = props.get("operation"), props.get("type"), props.get("name"), props.get(OWNER)
    management = broker.management
    if owner is None or int(owner) == shard:
        return management.handle(request, user)
    owner = int(owner)
    if type_ == "queue" and operation == "CREATE":
        return management.handle(_request("CREATE", "queue", name, forwarding_args(owner, body)), user)
    if type_ == "queue" and operation == "DELETE" and forwarded_to(broker.registry.lookup(str(name))) is None:
        reply = Message(properties={"statusCode": 204, "statusDescription": "OK: no forwarding queue here"})
        return reply
    if type_ == "binding" and operation == "CREATE" and broker.registry.lookup(str(body.get("queue"))) is None:
        made = management.handle(_request("CREATE", "queue", str(body.get("queue")),
                                          forwarding_args(owner, {STAMP: body.get(STAMP, 0)})), user)
        if status_of(made)[0] >= 300:
            return made
    return management.handle(request, user)


class WiringRequests(LinkHandler):
    """A peer's link to `$shard.wiring`: each request applied here, answered by its outcome."""

    def __init__(self, broker: Broker, shard: int, link: Link) -> None:
        self.broker = broker
        self.shard = shard
        self.link = link

    def on_message(self, delivery: int, data: bytes, settled: bool) -> None:
        request = decode_request(self.link, delivery, data)
        if request is None:
            return
        props: dict[Any, Any] = request.properties or {}
        user = props.get(RELAYED_FOR) or None
        status, description = status_of(apply(self.broker, self.shard, request, user))
        if settled:
            self.link.settle(delivery, 0)
        elif status < 300:
            self.link.settle(delivery, ACCEPTED)
        else:
            self.link.settle(delivery, REJECTED, CONDITIONS.get(status, INTERNAL), description)
