"""How a shard converges on the others' wiring (design/sharding.md, step 4): a process just promoted asks every
other shard's primary for its wiring (`$shard.snapshot`, one message: exchanges, bindings, queues with their
owners) and declares what it lacks: the exchanges, a forwarding queue for each queue another shard owns, and the
bindings between them. So a shard that had no primary while wiring was broadcast (the broadcast was refused
naming it) has it once it has one again. Nothing is deleted: a delete it missed stays to be done again.
A backup needs none of this: it gets its shard's wiring from its primary (HA's wiring link).
"""
from __future__ import annotations

import logging
from typing import Any

from proton import Message

from ..broker.connection import Connection
from ..broker.errors import BrokerError
from ..broker.exchange import Exchange
from ..broker.proton_adapter import Link, LinkHandler
from ..broker.queue import Queue
from ..broker.server import Broker
from ..config import ShardConfig
from ..ha.ha_broker import HaBroker
from .forwarding_queues import forwarded_to, forwarding_args
from .peer_endpoints import serve_peers
from .relay import Relay

log = logging.getLogger("haqueue.shard")

ADDRESS = "$shard.snapshot"


def snapshot(broker: Broker, shard: int) -> dict[str, Any]:
    """This shard's wiring, its clients' (no temporary queues, nor their bindings)."""
    registry = broker.registry
    queues = [q for q in registry.queues() if not q.temporary]
    owners = {q.name: forwarded_to(q) for q in queues}
    return {"shard": shard, "exchanges": [x.info() for x in registry.exchanges()],
            "queues": [{"name": q.name, "args": dict(q.args), "owner": shard if owners[q.name] is None
                        else owners[q.name]} for q in queues],
            "bindings": [b.info() for b in registry.bindings() if b.queue.name in owners]}


class SnapshotSender(LinkHandler):
    """A peer's link from `$shard.snapshot`: one message, this shard's wiring, sent once the peer gives credit."""

    def __init__(self, broker: Broker, shard: int, link: Link) -> None:
        self.broker, self.shard, self.link = broker, shard, link
        self.sent = False
        self.on_credit()

    def on_credit(self) -> None:
        if not self.sent and self.link.credit() > 0:
            self.sent = True
            self.link.send(bytes(Message(body=snapshot(self.broker, self.shard)).encode()), settled=True)


class SnapshotPull(LinkHandler):
    """Asks one shard's primary for its wiring (a Relayed, relay.py) and declares here what is missing."""

    def __init__(self, sync: "WiringSync", shard: int) -> None:
        self.sync = sync
        self.owner = sync.relay.owner(shard)
        self.link: Link | None = None
        self.owner.add(self)

    def attach(self, conn: Connection) -> None:
        self.link = conn.open_link(False, ADDRESS, self.sync.relay.link_name(ADDRESS), self, credit=1)

    def owner_lost(self) -> None:
        self.link = None  # asked again once the next primary answers

    def give_up(self, condition: str, description: str) -> None:
        log.warning("shard %d's wiring not known here: %s", self.owner.shard, description)

    def on_message(self, delivery: int, data: bytes, settled: bool) -> None:
        message = Message()
        message.decode(data)
        if isinstance(message.body, dict) and self.sync.ha.primary is not None:
            self.sync.converge(message.body)
        self.owner.remove(self)
        link, self.link = self.link, None
        if link is not None:
            link.close()


class WiringSync:
    def __init__(self, broker: Broker, ha: HaBroker, config: ShardConfig, relay: Relay) -> None:
        self.broker = broker
        self.ha = ha
        self.config = config
        self.relay = relay
        ha.promotion_hooks.append(self._promoted)
        serve_peers(ha, ADDRESS, lambda link: SnapshotSender(broker, config.index, link), sends=True)

    def _promoted(self) -> None:
        for shard in range(self.config.shards):
            if shard != self.config.index:
                SnapshotPull(self, shard)

    def converge(self, wiring: dict[str, Any]) -> None:
        """Declare what another shard's wiring has and this one lacks."""
        registry = self.broker.registry
        made = 0
        for x in wiring["exchanges"]:
            made += self._declare(lambda: registry.declare_exchange(x["name"], x["type"], dict(x["args"]))[1])
        for q in wiring["queues"]:
            owner = int(q["owner"])
            if owner != self.config.index:
                made += self._declare(lambda: registry.declare_queue(q["name"], forwarding_args(owner, q["args"]))[1])
        for b in wiring["bindings"]:
            exchange, queue = registry.lookup(b["exchange"]), registry.lookup(b["queue"])
            if isinstance(exchange, Exchange) and isinstance(queue, Queue):
                made += self._declare(lambda: registry.bind(b["exchange"], b["queue"], b["key"], dict(b["args"]))[1])
        if made:
            log.info("took %d exchanges, forwarding queues and bindings from shard %s's wiring", made, wiring["shard"])

    @staticmethod
    def _declare(declare: Any) -> int:
        try:
            return 1 if declare() else 0
        except BrokerError as e:  # a conflict (a queue here where the other has an exchange): left as it is
            log.warning("wiring not converged: %s", e.description)
            return 0
