"""Mirroring chosen queues to a standby cluster, asynchronously (design/mirroring.md): the source's end
(source.py, queue_mirror.py, standby_link.py) and the standby's (target.py, mirrored_queue.py), plugged into the
broker through its named hooks; the broker core knows nothing of them."""
from __future__ import annotations

import logging
import os
from typing import Any

from ..broker.server import Broker
from ..config import MirrorConfig
from ..ha.ha_broker import HaBroker
from . import protocol
from .epoch import EpochRecord, guard
from .promotion import PromotionRequests, ReverseRequests
from .source import MirrorSource
from .target import MirrorTarget


def install(broker: Broker, ha: HaBroker | None, config: MirrorConfig) -> None:
    if protocol.TEST_PROTOCOLS in os.environ:
        logging.getLogger("haqueue.mirror").warning("TEST HOOK %s=%s is set: this broker speaks only those mirror "
                                                    "protocols", protocol.TEST_PROTOCOLS,
                                                    os.environ[protocol.TEST_PROTOCOLS])
    record = EpochRecord(broker.registry)  # the cluster's mirror epoch: the standby's, and a reversed source's
    guard(broker.management)  # ... which no admin may delete or purge
    if ha is not None:
        ha.promotion_hooks.append(record.forget)  # kept by the cluster's former primary until now: read it anew
    source = MirrorSource(broker, ha, config, record) if config.to else None
    target = MirrorTarget(broker, ha, config, record) if config.accept_from else None
    if target is not None:
        PromotionRequests(target)
        ReverseRequests(target, record, source is not None)

    def status(name: Any, body: Any) -> tuple[int, dict[str, Any]]:
        return 200, {"broker": broker.name, "source": source.status() if source is not None else None,
                     "standby": target.status() if target is not None else None}
    broker.management.register("mirror", "READ", status)
