"""MirrorSource: the source cluster's end of the mirror, live only on its primary (or on a broker of no cluster).
Each queue matching `mirror.queues` gets a QueueMirror when it is declared or when this broker is promoted; a
queue that matches no glob gets nothing, and costs nothing. A primary never demotes in place (it restarts as a
backup), so a mirror, once started, runs until its queue is deleted or the process ends.
"""
from __future__ import annotations

import fnmatch
import logging
import re
import time
from typing import Any, Callable

from ..broker.exchange import Binding
from ..broker.queue import Queue
from ..broker.registry import Node
from ..broker.server import Broker
from ..broker.tls import client_context
from ..config import MirrorConfig
from ..ha.ha_broker import HaBroker
from . import protocol
from .epoch import RECORD
from .queue_mirror import QueueMirror
from .standby_link import StandbyLink

log = logging.getLogger("haqueue.mirror")


class MirrorSource:
    def __init__(self, broker: Broker, ha: HaBroker | None, config: MirrorConfig) -> None:
        self.broker = broker
        self.ha = ha
        self.pattern = re.compile("|".join(fnmatch.translate(glob) for glob in config.queues)) if config.queues else None
        self.max_backlog_bytes = config.max_backlog_bytes
        self.schedule: Callable[[Any], None] = broker.schedule
        tls = client_context(config.tls, "mirror.tls") if config.tls is not None else None
        self.standby = StandbyLink(broker.engine, config, tls)
        self.mirrors: dict[str, QueueMirror] = {}
        if self.pattern is None:
            return  # mirrors nothing
        broker.registry.queue_hooks.append(self._declared)
        broker.registry.observers.append(self)
        if ha is not None:
            ha.promotion_hooks.append(self._promoted)

    def _declared(self, queue: Queue) -> None:
        if self.ha is not None and self.ha.primary is None:
            return
        if self.pattern is None or queue.temporary or queue.name == RECORD or not self.pattern.fullmatch(queue.name):
            return
        if queue.exclusive:  # the mirror browses: an exclusive queue would refuse its consumers
            log.warning("queue %s matches mirror.queues but is exclusive: not mirrored", queue.name)
            return
        if queue.name not in self.mirrors:
            self.mirrors[queue.name] = QueueMirror(self, queue)

    def _promoted(self) -> None:
        for queue in self.broker.registry.queues():
            self._declared(queue)

    # -- the registry's observer: a mirrored queue deleted (its mirror may be between links, not browsing it) ----
    def declared(self, node: Node | Binding) -> None:
        pass

    def deleted(self, node: Node | Binding) -> None:
        mirror = self.mirrors.get(node.name) if isinstance(node, Queue) else None
        if mirror is not None and mirror.queue is node:
            mirror.stop()

    def stopped(self, mirror: QueueMirror) -> None:
        if self.mirrors.get(mirror.name) is mirror:
            del self.mirrors[mirror.name]

    def status(self) -> dict[str, Any]:
        now = time.time()
        active = self.ha is None or self.ha.primary is not None
        return {"role": "source", "epoch": protocol.FIRST_EPOCH, "active": active, **self.standby.status(),
                "queues": [m.status(now) for _, m in sorted(self.mirrors.items())]}
