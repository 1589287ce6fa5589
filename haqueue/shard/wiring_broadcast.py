"""Wiring broadcast (design/sharding.md, step 4): exchanges, bindings and the names of queues live in every shard.

A client's management CREATE or DELETE of an exchange, a binding or a queue, at any process, is applied in
every shard: here if this process is its shard's primary, else by that shard's primary through `$shard.wiring`
(wiring_requests.py) over the relay's owner connection; the client is answered once all have answered, with the
first refusal (naming the shard and its reason) if there was one. A queue's declare and a binding's create go
first to the shard owning the queue (its refusal, a bad argument or no such queue, stops them there), then to
the others in parallel, where a queue is a forwarding queue; so does a queue's delete; the rest go to every shard
at once. Nothing is undone after a refusal: every shard validates alike, and the same request again converges (a
CREATE of what exists answers 200). A shard without a primary for shard.relay_timeout refuses (the relay gives up on
it); each request carries its time, so that such a shard takes the newer state, created or deleted, on its next
promotion (wiring_versions.py, wiring_sync.py).
"""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable

from proton import Message

from ..broker.connection import Connection
from ..broker.errors import INTERNAL, STATUS
from ..broker.management import Answer
from ..broker.proton_adapter import ACCEPTED, Link, LinkHandler
from ..broker.queue import Queue
from ..broker.server import Broker
from ..config import ShardConfig
from ..ha.ha_broker import HaBroker
from .forwarding_queues import forwarded_to
from .ownership import owning_shard, shard_of_name
from .peer_endpoints import serve_peers
from .relay import Relay
from .relayed_links import RELAYED_FOR
from .wiring_versions import STAMP
from .wiring_requests import ADDRESS, CONDITIONS, OWNER, WiringRequests, apply, status_of

log = logging.getLogger("haqueue.shard")

# (condition, description) of a refusal, or None: a shard's answer
Outcome = Callable[[tuple[str, str] | None], None]
BROADCAST = (("exchange", "CREATE"), ("exchange", "DELETE"), ("binding", "CREATE"), ("binding", "DELETE"),
             ("queue", "CREATE"), ("queue", "DELETE"))


class ShardWiringLink(LinkHandler):
    """This process's link to one shard primary's `$shard.wiring`: requests in order, each answered by its
    outcome; those unanswered when the primary is lost are sent again to the next one."""

    def __init__(self, broadcast: "WiringBroadcast", shard: int) -> None:
        self.broadcast = broadcast
        self.shard = shard
        self.owner = broadcast.relay.owner(shard)
        self.mirror: Link | None = None
        self.waiting: deque[tuple[bytes, Outcome]] = deque()
        self.sent: dict[int, tuple[bytes, Outcome]] = {}
        self.added = False

    def request(self, data: bytes, outcome: Outcome) -> None:
        self.waiting.append((data, outcome))
        if not self.added:
            self.added = True
            self.owner.add(self)
        self._pump()

    def _pump(self) -> None:
        mirror = self.mirror
        while mirror is not None and self.waiting and mirror.credit() > 0:
            data, outcome = self.waiting.popleft()
            sent = mirror.send(data)
            if sent is not None:
                self.sent[sent] = (data, outcome)

    # -- Relayed (relay.py) -------------------------------------------------------------------
    def attach(self, conn: Connection) -> None:
        self.mirror = conn.open_link(True, ADDRESS, self.broadcast.relay.link_name(ADDRESS), self)

    def owner_lost(self) -> None:
        self.mirror = None
        self.waiting.extendleft(reversed(list(self.sent.values())))
        self.sent.clear()

    def give_up(self, condition: str, description: str) -> None:
        self.mirror, self.added = None, False
        answers = [outcome for _, outcome in [*self.sent.values(), *self.waiting]]
        self.sent.clear()
        self.waiting.clear()
        for outcome in answers:
            outcome((condition, description))

    # -- the link to the shard's primary -----------------------------------------------------------
    def on_credit(self) -> None:
        self._pump()

    def on_outcome(self, delivery: int, outcome: int, failed: bool, undeliverable: bool) -> None:
        found = self.sent.pop(delivery, None)
        if found is not None:
            found[1](None if outcome == ACCEPTED else Link.outcome_error(delivery) or
                     ("amqp:internal-error", f"outcome {outcome}"))

    def on_detach(self) -> None:
        mirror = self.mirror
        if mirror is None or mirror.conn.client_error is not None:
            return  # closed with its connection: owner_lost follows
        self.owner.remove(self)
        condition, _, description = (mirror.remote_error() or "amqp:link:detach-forced: detached").partition(": ")
        self.give_up(condition, description)


class _Run:
    """One client request on its way through the shards, phase after phase."""

    def __init__(self, broadcast: "WiringBroadcast", request: Message, user: str | None, owner: int | None,
                 phases: list[list[int]], answer: Answer) -> None:
        self.broadcast = broadcast
        self.request = request
        self.user = user
        self.phases = [phase for phase in phases if phase]  # one shard in all: no others to ask
        self.answer = answer
        self.data = bytes(request.encode())  # proton gives a bytearray; links send bytes
        self.owner = owner  # the shard owning the queue the request concerns, if it does
        self.local: Message | None = None  # this process's own answer, if it applied the request as the owner
        self.waiting = 0
        self.refusal: tuple[int, str] | None = None

    def next_phase(self) -> None:
        if self.refusal is not None or not self.phases:
            self._finish()
            return
        shards = self.phases.pop(0)
        self.waiting = len(shards)
        for shard in shards:
            if self.broadcast.serves(shard):
                reply = apply(self.broadcast.broker, shard, self.request, self.user)
                if self.owner in (None, shard):  # not a forwarding queue's answer
                    self.local = reply
                status, description = status_of(reply)
                self._answered(shard, (CONDITIONS.get(status, INTERNAL), description) if status >= 300 else None,
                               status)
            else:
                self.broadcast.link(shard).request(self.data, self._answer_of(shard))

    def _answer_of(self, shard: int) -> Outcome:
        return lambda refusal: self._answered(shard, refusal)

    def _answered(self, shard: int, refusal: tuple[str, str] | None, status: int = 0) -> None:
        if refusal is not None and self.refusal is None:
            condition, description = refusal
            self.refusal = (status or STATUS.get(condition, 500), f"shard {shard} refused: {description}")
        self.waiting -= 1
        if not self.waiting:
            self.next_phase()

    def _finish(self) -> None:
        if self.refusal is not None:
            self.answer(self.refusal[0], self.refusal[1], None)
        elif self.local is not None:
            status, description = status_of(self.local)
            self.answer(status, description, self.local.body)
        else:
            props: dict[Any, Any] = self.request.properties or {}
            self.answer(204 if props.get("operation") == "DELETE" else 201, "OK", None)


class WiringBroadcast:
    def __init__(self, broker: Broker, ha: HaBroker, config: ShardConfig, relay: Relay) -> None:
        self.broker = broker
        self.ha = ha
        self.config = config
        self.relay = relay
        self._links: dict[int, ShardWiringLink] = {}
        for type_, operation in BROADCAST:
            broker.management.deferred[(type_, operation)] = self._deferred(type_, operation)
        serve_peers(ha, ADDRESS, lambda link: WiringRequests(broker, config.index, link))

    def serves(self, shard: int) -> bool:
        return shard == self.config.index and self.ha.primary is not None

    def link(self, shard: int) -> ShardWiringLink:
        if shard not in self._links:
            self._links[shard] = ShardWiringLink(self, shard)
        return self._links[shard]

    def queue_owner(self, name: str) -> int:
        """The shard owning queue `name`, as far as this process knows: a forwarding queue says, a queue of its
        own shard is this one's (a backup has its shard's queues), else the hash of the name."""
        node = self.broker.registry.lookup(name)
        forward = forwarded_to(node)
        if forward is not None:
            return forward
        if isinstance(node, Queue) and not node.temporary:
            return self.config.index
        return shard_of_name(name, self.config.shards)

    def _deferred(self, type_: str, operation: str) -> Callable[[str | None, dict[str, Any], str | None, Answer], None]:
        def broadcast(name: str | None, body: dict[str, Any], user: str | None, answer: Answer) -> None:
            owner: int | None = None
            if type_ == "queue":
                owner = owning_shard(str(name), body, self.config.shards) if operation == "CREATE" \
                    else self.queue_owner(str(name))
            elif type_ == "binding":
                queue = self.broker.registry.lookup(str(body.get("queue")))
                if isinstance(queue, Queue) and queue.temporary:  # this process's own (subscriptions.py mirrors it)
                    reply = self.broker.management.handle(Message(properties={"operation": operation, "type": type_},
                                                                  body=body), user)
                    answer(*status_of(reply), reply.body)
                    return
                owner = self.queue_owner(str(body.get("queue")))
            shards = list(range(self.config.shards))
            # the queue's owner first: a queue, or a binding, is made nowhere unless there, and a queue deleted
            # nowhere unless there (its forwarding queues are removed on convergence after it, never before)
            phases = [shards]
            if owner is not None and (operation == "CREATE" or type_ == "queue"):
                phases = [[owner], [s for s in shards if s != owner]]
            request = Message(properties={"operation": operation, "type": type_, "name": name,
                                          RELAYED_FOR: user or "", OWNER: owner, STAMP: time.time()}, body=body)
            _Run(self, request, user, owner, phases, answer).next_phase()
        return broadcast
