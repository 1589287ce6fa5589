"""How a shard converges on the others' wiring (design/sharding.md, step 4): a process just promoted asks every
other shard's primary for its wiring (`$shard.snapshot`, one message: exchanges, bindings, queues with their
owners, and its tombstones) and takes what is newer there (wiring_versions.py): it removes what the other deleted
after this shard made it, and declares what it lacks unless it deleted that later itself: the exchanges, a
forwarding queue for each queue another shard owns, and the bindings between them. So a shard that had no primary
while wiring was broadcast (the broadcast was refused naming it) has the others' creates and deletes once it has
one again, and a shard that missed a delete never gives the object back to the others.
A backup needs none of this: it gets its shard's wiring from its primary (HA's wiring link).
"""
from __future__ import annotations

import logging
import time
from typing import Any

from ..broker import amqp_values
from ..broker.connection import Connection
from ..broker.errors import BrokerError
from ..broker.exchange import Binding, Exchange
from ..broker.proton_adapter import Link, LinkHandler
from ..broker.queue import Queue
from ..broker.registry import Registry
from ..broker.server import Broker
from ..config import ShardConfig
from ..ha.ha_broker import HaBroker
from .forwarding_queues import forwarded_to, forwarding_args
from .peer_endpoints import serve_peers
from .relay import RETRY_INTERVAL, Relay
from .wiring_versions import TOMBSTONES, Key, guard, prune, record, stamp_of, tombstones

log = logging.getLogger("haqueue.shard")

ADDRESS = "$shard.snapshot"


def snapshot(broker: Broker, shard: int) -> dict[str, Any]:
    """This shard's wiring, its clients' (no temporary queues, nor their bindings), and its tombstones."""
    registry = broker.registry
    queues = [q for q in registry.queues() if not q.temporary and not q.name.startswith(TOMBSTONES + "/")]
    owners = {q.name: forwarded_to(q) for q in queues}
    return {"shard": shard, "exchanges": [x.info() for x in registry.exchanges()],
            "queues": [{"name": q.name, "args": dict(q.args), "owner": shard if owners[q.name] is None
                        else owners[q.name]} for q in queues],
            "bindings": [b.info() for b in registry.bindings() if b.queue.name in owners],
            "deleted": [[list(key), stamp] for key, stamp in tombstones(registry).items()]}


class SnapshotSender(LinkHandler):
    """A peer's link from `$shard.snapshot`: one message, this shard's wiring, sent once the peer gives credit."""

    def __init__(self, broker: Broker, shard: int, link: Link) -> None:
        self.broker, self.shard, self.link = broker, shard, link
        self.sent = False
        self.on_credit()

    def on_credit(self) -> None:
        if not self.sent and self.link.credit() > 0:
            self.sent = True
            self.link.send(amqp_values.encode_body(snapshot(self.broker, self.shard)), settled=True)


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
        """No primary there for shard.relay_timeout: asked again, since a shard left without its wiring would
        keep what the others deleted until its next promotion."""
        shard = self.owner.shard
        log.warning("shard %d's wiring not known here yet: %s; asking again", shard, description)
        self.sync.broker.engine.call_later(RETRY_INTERVAL, lambda: self.sync.pull(shard))

    def on_message(self, delivery: int, data: bytes, settled: bool) -> None:
        body = amqp_values.decode_body(data)
        if isinstance(body, dict) and self.sync.ha.primary is not None:
            self.sync.converge(body)
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
        guard(broker)

    def _promoted(self) -> None:
        prune(self.broker.registry, time.time())
        for shard in range(self.config.shards):
            if shard != self.config.index:
                self.pull(shard)

    def pull(self, shard: int) -> None:
        """Ask `shard`'s primary for its wiring (over the relay's connection to it)."""
        SnapshotPull(self, shard)

    def converge(self, wiring: dict[str, Any]) -> None:
        made, removed = converge(self.broker.registry, self.config.index, wiring)
        if made or removed:
            log.info("took %d exchanges, forwarding queues and bindings from shard %s's wiring, removed %d it had "
                     "deleted", made, wiring["shard"], removed)


def converge(registry: Registry, index: int, wiring: dict[str, Any]) -> tuple[int, int]:
    """Take what is newer in another shard's wiring, in shard `index`: remove what it deleted after this shard made
    it, then declare what it has and this shard lacks, unless deleted here later (wiring_versions.py). What was
    made and what removed, counted."""
    removed = _remove_deleted(registry, wiring)
    deleted = tombstones(registry)  # kept when made again: an object newer than its tombstone stays
    newer = lambda key, args: stamp_of(args) > deleted.get(key, -1.0)  # noqa: E731
    made = 0
    for x in wiring["exchanges"]:
        if newer(("exchange", x["name"]), x["args"]):
            made += _declare(lambda: registry.declare_exchange(
                x["name"], x["type"], dict(x["args"]))[1])
    for q in wiring["queues"]:
        owner = int(q["owner"])
        if owner != index and newer(("queue", q["name"]), q["args"]):
            made += _declare(lambda: registry.declare_queue(
                q["name"], forwarding_args(owner, q["args"]))[1])
    for b in wiring["bindings"]:
        key = ("binding", b["exchange"], b["queue"], b["key"])
        exchange, queue = registry.lookup(b["exchange"]), registry.lookup(b["queue"])
        if isinstance(exchange, Exchange) and isinstance(queue, Queue) and newer(key, b["args"]):
            made += _declare(lambda: registry.bind(b["exchange"], b["queue"], b["key"], dict(b["args"]))[1])
    return made, removed


def _remove_deleted(registry: Registry, wiring: dict[str, Any]) -> int:
    """Remove what the other shard deleted after this one made it (an exchange or queue with its bindings, as a
    delete does), and keep its tombstones."""
    removed = 0
    for key, stamp in ((tuple(key), float(stamp)) for key, stamp in wiring.get("deleted", [])):
        here = _local(registry, key)
        if here is not None and (stamp_of(here.args) >= stamp or forwarded_to(here) is None and key[0] == "queue"):
            continue  # made again here since; or this shard's own queue, which its owner deletes first
        if here is not None:
            registry.unbind(*key[1:]) if key[0] == "binding" else registry.delete(key[1])
            removed += 1
        record(registry, key, stamp)
    return removed


def _local(registry: Registry, key: Key) -> Queue | Exchange | Binding | None:
    node = registry.lookup(key[1])
    if key[0] == "binding":
        return node.bindings.get((key[2], key[3])) if isinstance(node, Exchange) else None
    return node if node is not None and node.kind == key[0] else None


def _declare(declare: Any) -> int:
    try:
        return 1 if declare() else 0
    except BrokerError as e:  # a conflict (a queue here where the other has an exchange): left as it is
        log.warning("wiring not converged: %s", e.description)
        return 0
