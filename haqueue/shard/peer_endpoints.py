"""The shard plug-in's own `$` addresses, served to its peer processes only (the relay's connections log in as
the HA peer user), and only by a primary: what they carry is applied to the shard's live state."""
from __future__ import annotations

from typing import Callable

from ..broker.errors import NOT_ALLOWED, UNAUTHORIZED, BrokerError
from ..broker.proton_adapter import Link, LinkHandler
from ..ha.ha_broker import HaBroker


def serve_peers(ha: HaBroker, address: str, factory: Callable[[Link], LinkHandler], sends: bool = False) -> None:
    """Serve peers' links to `address` (or `address/...`), on a primary, with `factory`: links on which this
    process receives, or with `sends` those on which it sends."""
    def endpoint(link: Link) -> LinkHandler:
        if not ha.is_peer(link.conn):
            raise BrokerError(UNAUTHORIZED, f"{link.address} is for the shard's peers (user {link.conn.user} is not)")
        if ha.primary is None:
            raise BrokerError(NOT_ALLOWED, f"{ha.broker.name} is not its shard's primary")
        if link.is_sender != sends:
            raise BrokerError(NOT_ALLOWED, f"{link.address} only {'sends' if sends else 'receives'}")
        return factory(link)
    ha.broker.endpoints[address] = endpoint
