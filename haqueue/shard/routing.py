"""Which process serves a client's link, in a shard process (design/sharding.md, step 3).

A link to a queue this process's shard owns, or to an exchange (every shard has them: wiring_broadcast.py), is
served here while this process is the shard's primary; any other link to a named address is relayed to its
owning shard's primary, a forwarding queue's name to the shard it forwards to (or, with `shard.redirect`,
refused with amqp:link:redirect naming the owning shard's direct address). A backup admits clients on
the node's client address (shared by the node's shard processes) and relays every link it gets there.
Links from the HA peer user are a relay's own: served here by a primary, refused by a backup, never
relayed again, and checked here with the rights of the client they were relayed for (the peer user
itself may only replicate and run admin operations).
"""
from __future__ import annotations

from ..broker.errors import LINK_REDIRECT, NOT_ALLOWED, BrokerError
from ..broker.proton_adapter import Link, LinkHandler
from ..broker.server import Broker
from ..config import ShardConfig
from ..ha.ha_broker import HaBroker
from .directory import ShardDirectory
from .forwarding_queues import forwarded_to
from .ownership import shard_of_name
from .relay import Relay
from .relayed_links import RELAYED_FOR, RelayedConsumer, RelayedPublisher
from .relayed_transactions import RelayedTransactions


class ShardRouting:
    def __init__(self, broker: Broker, ha: HaBroker, config: ShardConfig) -> None:
        self.broker = broker
        self.ha = ha
        self.config = config
        self.relay = Relay(broker.engine, ShardDirectory(config.publics), ha.config.username, ha.config.password,
                           config.relay_timeout)
        self.transactions = RelayedTransactions(broker.transactions)
        broker.transactions.here = f"{broker.name} (shard {config.index})"
        ha.client_listeners.add(config.client)
        broker.link_routes.append(self.route)
        broker.link_user = self.link_user

    def owner(self, address: str) -> int | None:
        """The shard serving `address` if not this process: None while this process serves it. A forwarding
        queue names its owner; any other node here is this shard's (every shard has the exchanges, a backup its
        shard's queues); an address found nowhere belongs to the shard its name hashes to."""
        node = self.broker.registry.lookup(address)
        shard = forwarded_to(node)
        if shard is None:
            shard = self.config.index if node is not None else shard_of_name(address, self.config.shards)
        return None if shard == self.config.index and self.ha.primary is not None else shard

    def link_user(self, link: Link) -> str | None:
        """A relay's link acts for the client user it names (none named: for no one); any other for its own user."""
        user = link.conn.user
        if user == self.ha.config.username:
            relayed_for = link.properties.get(RELAYED_FOR)
            if isinstance(relayed_for, str):
                return relayed_for or None
        return user

    def route(self, link: Link) -> LinkHandler | None:
        assert link.address is not None  # the broker routes only links to a named address
        shard = self.owner(link.address)
        if shard is None:
            return None
        if link.conn.user == self.ha.config.username:
            raise BrokerError(NOT_ALLOWED, f"{self.broker.name} does not serve {link.address!r} (shard {shard}'s): "
                                           f"a relayed link goes to the owning shard's primary")
        if self.config.redirect:  # shard.redirect: the client goes to the owner itself
            raise self.redirect(link.address, shard)
        owner = self.relay.owner(shard)
        relayed = RelayedConsumer if link.is_sender else RelayedPublisher
        return relayed(owner, link, self.transactions)

    def redirect(self, address: str, shard: int) -> BrokerError:
        """The refusal that sends a client to `shard`'s direct address, bound only by its primary."""
        host, port = self.config.publics[shard]
        return BrokerError(LINK_REDIRECT, f"{address!r} is served by shard {shard}'s primary at {host}:{port}",
                           {"network-host": host, "port": port, "address": address})
