"""Mirroring chosen queues to a standby cluster, asynchronously (design/mirroring.md): the source's end
(source.py, queue_mirror.py, standby_link.py) and the standby's (target.py, mirrored_queue.py), plugged into the
broker through its named hooks; the broker core knows nothing of them."""
from __future__ import annotations

from typing import Any

from ..broker.server import Broker
from ..config import MirrorConfig
from ..ha.ha_broker import HaBroker
from .promotion import PromotionRequests
from .source import MirrorSource
from .target import MirrorTarget


def install(broker: Broker, ha: HaBroker | None, config: MirrorConfig) -> None:
    source = MirrorSource(broker, ha, config) if config.to else None
    target = MirrorTarget(broker, ha, config) if config.accept_from else None
    if target is not None:
        PromotionRequests(target)

    def status(name: Any, body: Any) -> tuple[int, dict[str, Any]]:
        return 200, {"broker": broker.name, "source": source.status() if source is not None else None,
                     "standby": target.status() if target is not None else None}
    broker.management.register("mirror", "READ", status)
