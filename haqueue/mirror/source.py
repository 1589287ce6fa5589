"""MirrorSource: the source cluster's end of the mirror, live only on its primary (or on a broker of no cluster).
Each queue matching `mirror.queues` gets a QueueMirror when it is declared or when this broker is promoted; a
queue that matches no glob gets nothing, and costs nothing. A primary never demotes in place (it restarts as a
backup), so a mirror, once started, runs until its queue is deleted or the process ends, or until this cluster
becomes a standby (a newer source reversed onto it).

A broker that also accepts mirrors (`mirror.accept_from`) is a standby first: its source part mirrors only once its
cluster was promoted and reversed (`mirror reverse`: promotion.py), at the epoch its record holds (epoch.py), naming
the cluster it reverses onto. One without mirrors at the first epoch.
"""
from __future__ import annotations

import fnmatch
import logging
import re
import time
from typing import Any, Callable

from ..broker.connection import Connection
from ..broker.exchange import Binding
from ..broker.queue import Queue
from ..broker.registry import Node
from ..broker.server import Broker
from ..broker.tls import client_context
from ..config import MirrorConfig
from ..ha.ha_broker import HaBroker
from . import protocol
from .epoch import RECORD, EpochRecord
from .queue_mirror import QueueMirror, Ticks
from .standby_link import StandbyLink
from .wiring import WIRING_DELAY, WiringSender, snapshot

log = logging.getLogger("haqueue.mirror")


class MirrorSource:
    def __init__(self, broker: Broker, ha: HaBroker | None, config: MirrorConfig, record: EpochRecord) -> None:
        self.broker = broker
        self.ha = ha
        self.record = record
        self.standby_first = bool(config.accept_from)
        globs = config.queues
        self.pattern = re.compile("|".join(fnmatch.translate(glob) for glob in globs)) if globs else None
        self.max_backlog_bytes = config.max_backlog_bytes
        self.schedule: Callable[[Any], None] = broker.schedule
        self.call_later = broker.engine.call_later
        self.ticks = Ticks(broker.engine)
        tls = client_context(config.tls, "mirror.tls") if config.tls is not None else None
        self.standby = StandbyLink(broker.engine, config, tls, self.gone, self._wire)
        self.mirrors: dict[str, QueueMirror] = {}
        self.wiring = WiringSender()  # on the connection's `$mirror.wiring`, while there is one
        self.rewiring = False  # a snapshot is due in WIRING_DELAY
        if self.pattern is None:
            return  # mirrors nothing
        broker.registry.queue_hooks.append(self._declared)
        broker.registry.observers.append(self)
        record.listeners.append(self._epoch_changed)
        if ha is not None:
            ha.promotion_hooks.append(self._promoted)

    def epoch(self) -> int | None:
        """The mirror epoch this cluster mirrors at, None while it is a standby (it mirrors nothing)."""
        if not self.standby_first:
            return protocol.FIRST_EPOCH
        known = self.record.read()
        return known.epoch if known.reverses is not None else None

    def _epoch_changed(self) -> None:
        """Reversed: mirror at the new epoch, onto the cluster named; a standby again: mirror nothing."""
        epoch = self.epoch()
        if epoch is None:
            for mirror in list(self.mirrors.values()):
                mirror.stop()
            return
        known = self.record.read()
        self.standby.epoch, self.standby.reverses, self.standby.applied = epoch, known.reverses, known.applied
        self._start()

    def _declared(self, queue: Queue) -> None:
        if self.ha is not None and self.ha.primary is None or self.epoch() is None:
            return
        if self.pattern is None or queue.temporary or queue.name == RECORD or not self.pattern.fullmatch(queue.name):
            return
        if queue.exclusive:  # not mirrored (design/mirroring.md, Limits)
            log.warning("queue %s matches mirror.queues but is exclusive: not mirrored", queue.name)
            return
        if queue.name not in self.mirrors:
            self.mirrors[queue.name] = QueueMirror(self, queue)

    def _promoted(self) -> None:
        if self.standby_first:
            self._epoch_changed()  # from the record, read anew
        else:
            self._start()

    def _start(self) -> None:
        for queue in self.broker.registry.queues():
            self._declared(queue)

    # -- the registry's observer: a mirrored queue deleted (its mirror, no subscriber of it, hears of it here), and
    # the wiring into mirrored queues changed
    def declared(self, node: Node | Binding) -> None:
        if not isinstance(node, Queue):
            self._rewire()

    def deleted(self, node: Node | Binding) -> None:
        mirror = self.mirrors.get(node.name) if isinstance(node, Queue) else None
        if mirror is not None and mirror.queue is node:
            mirror.stop(gone=True)
        if not isinstance(node, Queue):
            self._rewire()

    def _wire(self, conn: Connection) -> None:
        """A connection took the mirror: the wiring goes on a link of its own, first whole."""
        self.wiring = WiringSender()
        self.wiring.link = conn.open_link(True, protocol.WIRING, f"{protocol.WIRING}/{self.standby.config.cluster}",
                                          self.wiring, properties=self.standby.link_properties())
        self.wiring.send(snapshot(self.broker.registry, self.mirrors.__contains__))

    def _rewire(self) -> None:
        if not self.rewiring and self.wiring.link is not None:
            self.rewiring = True
            self.call_later(WIRING_DELAY, self._rewired)

    def _rewired(self) -> None:
        self.rewiring = False
        if self.wiring.link is not None:
            self.wiring.send(snapshot(self.broker.registry, self.mirrors.__contains__))

    def gone(self, name: str) -> bool:
        """Was the queue of this name, which the standby holds a mirror of, deleted here (it matches the globs and
        is no queue here): the standby deletes its copy (StandbyLink)."""
        return (self.pattern is not None and self.pattern.fullmatch(name) is not None
                and self.broker.registry.lookup(name) is None)

    def stopped(self, mirror: QueueMirror) -> None:
        if self.mirrors.get(mirror.name) is mirror:
            del self.mirrors[mirror.name]

    def status(self) -> dict[str, Any]:
        now = time.time()
        active = self.ha is None or self.ha.primary is not None
        epoch = self.epoch()
        return {"role": "source", "epoch": epoch or protocol.FIRST_EPOCH, "active": active,
                "dormant": None if epoch is not None else "this cluster is a standby: it mirrors once promoted and "
                                                          "reversed (haqueue admin mirror reverse)",
                **self.standby.status(),
                "queues": [m.status(now) for _, m in sorted(self.mirrors.items())]}
