"""A client's own subscription to an exchange, across shards (design/sharding.md, step 4).

A client consuming from an exchange gets a temporary queue bound to it in the shard that serves its link
(broker/server.py); publishes routed in the other shards would never reach it. So each binding of a temporary
queue on a primary is mirrored in every other shard for as long as it lives: a link to that shard primary's
`$shard.subscribe` names the exchange, the queue and the key, and while it is attached that primary holds a
temporary forwarding queue of the name, bound alike, which its forwarder empties into the subscriber's queue.
The link's life is the subscription's: the binding or its queue deleted here closes it, this primary's loss drops
it, and either way the other side deletes its forwarding queue; a failover there attaches it again to the next
primary. Like the subscription itself, none of it is replicated.
"""
from __future__ import annotations

import logging
from typing import Any

from ..broker.connection import Connection
from ..broker.errors import NOT_FOUND, BrokerError
from ..broker.exchange import Binding, Exchange
from ..broker.proton_adapter import Link, LinkHandler
from ..broker.queue import Queue
from ..broker.server import Broker
from ..config import ShardConfig
from ..ha.ha_broker import HaBroker
from .forwarding_queues import forwarded_to, forwarding_args
from .peer_endpoints import serve_peers
from .relay import Relay

log = logging.getLogger("haqueue.shard")

ADDRESS = "$shard.subscribe"


class SubscriptionLink(LinkHandler):
    """One temporary binding here, mirrored at one other shard's primary (a Relayed, relay.py)."""

    def __init__(self, subscriptions: "Subscriptions", shard: int, binding: Binding) -> None:
        self.subscriptions = subscriptions
        self.owner = subscriptions.relay.owner(shard)
        self.properties = {"exchange": binding.exchange.name, "queue": binding.queue.name, "key": binding.key,
                           "owner": subscriptions.config.index}
        self.link: Link | None = None
        self.owner.add(self)

    def attach(self, conn: Connection) -> None:
        self.link = conn.open_link(True, ADDRESS, self.subscriptions.relay.link_name(ADDRESS), self, self.properties)

    def owner_lost(self) -> None:
        self.link = None  # attached again to the next primary

    def give_up(self, condition: str, description: str) -> None:
        self.link = None
        log.warning("subscription %s to %s not mirrored in shard %d: %s", self.properties["queue"],
                    self.properties["exchange"], self.owner.shard, description)

    def close(self) -> None:
        self.owner.remove(self)
        link, self.link = self.link, None
        if link is not None:
            link.close()

    def on_detach(self) -> None:
        link = self.link
        if link is not None and link.conn.client_error is None:  # refused there (no such exchange)
            log.warning("subscription %s to %s not mirrored in shard %d: %s", self.properties["queue"],
                        self.properties["exchange"], self.owner.shard, link.remote_error())
            self.close()


class SubscriptionMirror(LinkHandler):
    """The other side: a peer's temporary binding, held here as a forwarding queue while its link is attached."""

    def __init__(self, broker: Broker, link: Link) -> None:
        self.broker = broker
        props = link.properties
        exchange = broker.registry.lookup(str(props.get("exchange")))
        if not isinstance(exchange, Exchange):
            raise BrokerError(NOT_FOUND, f"no exchange named {props.get('exchange')!r}")
        self.queue: Queue = broker.registry.declare_queue(
            str(props["queue"]), forwarding_args(int(props["owner"]), {"auto-delete": True}), temporary=True)[0]
        broker.registry.bind(exchange.name, self.queue.name, str(props.get("key") or ""), {})

    def on_detach(self) -> None:
        if not self.queue.deleted:
            self.broker.registry.delete(self.queue.name)


class Subscriptions:
    def __init__(self, broker: Broker, ha: HaBroker, config: ShardConfig, relay: Relay) -> None:
        self.broker = broker
        self.ha = ha
        self.config = config
        self.relay = relay
        self._mirrored: dict[tuple[str, str, str], list[SubscriptionLink]] = {}  # a temporary binding's mirrors
        broker.registry.observers.append(self)
        serve_peers(ha, ADDRESS, lambda link: SubscriptionMirror(broker, link))

    # -- a registry observer -----------------------------------------------------------------------
    def declared(self, node: Any) -> None:
        """A client's temporary binding on a primary (not a peer's, mirrored here): mirrored in every other shard."""
        if isinstance(node, Binding) and node.queue.temporary and forwarded_to(node.queue) is None \
                and self.ha.primary is not None:
            self._mirrored[_key(node)] = [SubscriptionLink(self, shard, node) for shard in range(self.config.shards)
                                          if shard != self.config.index]

    def deleted(self, node: Any) -> None:
        if isinstance(node, Binding):
            for link in self._mirrored.pop(_key(node), []):
                link.close()


def _key(binding: Binding) -> tuple[str, str, str]:
    return binding.exchange.name, binding.queue.name, binding.key
