"""The shard plug-in of one shard's process: the relay and routing of client links, the wiring broadcast, the
forwarder, the wiring's convergence and exchange subscriptions across shards, sharing the relay's connections
to the other shards' primaries; and the cluster's layout for `admin cluster status` (design/sharding.md)."""
from __future__ import annotations

from ..broker.server import Broker
from ..config import ShardConfig
from ..ha.ha_broker import HaBroker
from .forwarder import Forwarder
from .routing import ShardRouting
from .status import serve_layout
from .subscriptions import Subscriptions
from .wiring_broadcast import WiringBroadcast
from .wiring_sync import WiringSync


def install(broker: Broker, ha: HaBroker, config: ShardConfig) -> None:
    routing = ShardRouting(broker, ha, config)
    WiringBroadcast(broker, ha, config, routing.relay)
    Forwarder(broker, ha, config, routing.relay)
    WiringSync(broker, ha, config, routing.relay)
    Subscriptions(broker, ha, config, routing.relay)
    serve_layout(broker, config)
