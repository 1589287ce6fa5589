"""The forwarder (design/sharding.md, step 4): on each shard's primary, every forwarding queue is consumed and
its messages published to the owning shard's primary (`$shard.forward/<queue>`, a publisher on the queue there),
each removed here only once the owner confirmed it: store and forward, at least once. The forwarding queue is
replicated in its shard, so a failover here resends from the new primary what was not yet confirmed; a failover
of the owner (the relay's connection lost) releases what was in flight, sent again to the next primary.
Duplicates are possible in both cases, as for any failover.
"""
from __future__ import annotations

import logging

from ..broker.connection import Connection
from ..broker.links import Publisher
from ..broker.errors import NOT_FOUND, BrokerError
from ..broker.proton_adapter import ACCEPTED, REJECTED, Link, LinkHandler
from ..broker.queue import Entry, Queue, Returned
from ..broker.selector import Selector
from ..broker.server import Broker
from ..config import ShardConfig
from ..ha.ha_broker import HaBroker
from .forwarding_queues import forwarded_to, validator
from .peer_endpoints import serve_peers
from .relay import Relay

log = logging.getLogger("haqueue.shard")

ADDRESS = "$shard.forward"
RETRY_INTERVAL = 1.0  # seconds before trying an owner again after it refused, or had no primary


class QueueForwarder(LinkHandler):
    """One forwarding queue's consumer (a queue Subscriber) and its link to the owner's primary (a Relayed)."""

    browse = False
    selector: Selector | None = None  # it takes every message

    def __init__(self, forwarder: "Forwarder", queue: Queue, shard: int) -> None:
        self.forwarder = forwarder
        self.queue = queue
        self.owner = forwarder.relay.owner(shard)
        self.cursor = 0
        self.returned: list[Returned] = []
        self.mirror: Link | None = None
        self.in_flight: dict[int, Entry] = {}  # mirror delivery -> the entry sent
        self.stopped = False
        queue.subscribe(self)
        self.owner.add(self)

    # -- the queue's subscriber ------------------------------------------------------------------
    def credit(self) -> int:
        return self.mirror.credit() if self.mirror is not None else 0

    def deliver(self, entry: Entry) -> None:
        assert self.mirror is not None  # credit() gave some
        sent = self.mirror.send(entry.data)
        if sent is not None:
            self.in_flight[sent] = entry

    def after_dispatch(self) -> None:
        pass

    def queue_deleted(self) -> None:
        self.stop()

    def stop(self) -> None:
        self.stopped = True
        self.in_flight.clear()
        self.queue.unsubscribe(self)
        self.owner.remove(self)
        mirror, self.mirror = self.mirror, None
        if mirror is not None:
            mirror.close()

    def _release_in_flight(self) -> None:
        for entry in self.in_flight.values():
            self.queue.release(entry)
        self.in_flight.clear()

    # -- Relayed (relay.py) -----------------------------------------------------------------------
    def attach(self, conn: Connection) -> None:
        self.mirror = conn.open_link(True, f"{ADDRESS}/{self.queue.name}",
                                     self.forwarder.relay.link_name(self.queue.name), self)

    def owner_lost(self) -> None:
        self.mirror = None
        self._release_in_flight()

    def give_up(self, condition: str, description: str) -> None:
        self.mirror = None
        self._release_in_flight()
        self._retry_later(f"{condition}: {description}")

    def _retry_later(self, reason: str) -> None:
        log.warning("forwarding queue %s: %s; trying again in %g s", self.queue.name, reason, RETRY_INTERVAL)
        self.forwarder.broker.engine.call_later(RETRY_INTERVAL, self._again)

    def _again(self) -> None:
        if not self.stopped and self.mirror is None and self not in self.owner.links:
            self.owner.add(self)

    # -- the link to the owner's primary ------------------------------------------------------------
    def on_credit(self) -> None:
        self.forwarder.broker.schedule(self.queue)

    def on_outcome(self, delivery: int, outcome: int, failed: bool, undeliverable: bool) -> None:
        entry = self.in_flight.pop(delivery, None)
        if entry is None:
            return
        if outcome == ACCEPTED:
            self.queue.dequeue(entry)
        elif outcome == REJECTED:  # the owner refused it (its queue full, reject-publish): as a consumer's rejection
            log.warning("forwarding queue %s: message seq %d rejected by its owner: %s", self.queue.name, entry.seq,
                        Link.outcome_error(delivery))
            self.queue.dequeue(entry)
            if self.forwarder.broker.dead_letter(self.queue, entry, "rejected by its owner"):
                self.queue.dead_lettered += 1
        else:
            self.queue.release(entry)

    def on_detach(self) -> None:
        mirror = self.mirror
        if mirror is None or self.stopped or mirror.conn.client_error is not None:
            return  # closed here, or with its connection (owner_lost follows)
        self.mirror = None
        self._release_in_flight()
        self.owner.remove(self)
        self._retry_later(f"the owner detached it: {mirror.remote_error()}")


class Forwarder:
    """Every forwarding queue's QueueForwarder, while this process is its shard's primary; and the owner's end,
    `$shard.forward/<queue>`: a publisher on the queue, confirming as any publish does (replicas, disk)."""

    def __init__(self, broker: Broker, ha: HaBroker, config: ShardConfig, relay: Relay) -> None:
        self.broker = broker
        self.ha = ha
        self.relay = relay
        broker.registry.validators.append(validator(config.index, config.shards))
        broker.registry.queue_hooks.append(self._declared)
        ha.promotion_hooks.append(self._promoted)
        serve_peers(ha, ADDRESS, self._forwarded)

    def _declared(self, queue: Queue) -> None:
        shard = forwarded_to(queue)
        if shard is not None and self.ha.primary is not None:
            QueueForwarder(self, queue, shard)

    def _promoted(self) -> None:
        for queue in self.broker.registry.queues():
            self._declared(queue)

    def _forwarded(self, link: Link) -> LinkHandler:
        name = str(link.address)[len(ADDRESS) + 1:]
        queue = self.broker.registry.lookup(name)
        if not isinstance(queue, Queue) or forwarded_to(queue) is not None:
            raise BrokerError(NOT_FOUND, f"{self.broker.name} has no queue {name!r} to forward to")
        return Publisher(self.broker, link, queue)
