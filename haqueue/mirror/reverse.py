"""Fail-back's other end (design/mirroring.md, "Epochs and fencing"): once a promoted standby mirrors back (`haqueue
admin mirror reverse`, promotion.py), the cluster it was promoted over takes its queue links, and its own queues of
those names become the new source's mirrors.

What the old source held past what the new source had of it when promoted (epoch.Epoch.applied) was never mirrored:
it is kept aside in a diverged file (ha/quarantine.py: `haqueue diverged list` shows it, `haqueue diverged
republish` sends it to a broker), synced before it leaves the queue, never deleted silently. The rest leaves with
the queue: what the new source still holds it sends again, what its clients consumed is gone. Client links to the
queue are closed as it becomes a mirror (a link to the queue itself is refused at attach only: target.py).
"""
from __future__ import annotations

import logging
from ..broker.errors import NOT_ALLOWED
from ..broker.proton_adapter import Link
from ..broker.queue import Queue
from ..broker.server import Broker
from ..ha.quarantine import Quarantine

log = logging.getLogger("haqueue.mirror")


def become_mirror(broker: Broker, queue: Queue, source: str, applied: int, mirror_link: Link) -> None:
    """Make way for `queue`'s mirror of cluster `source` (reversing onto this one): what it holds past `applied` kept
    aside, its client links closed, the queue deleted (the caller declares the mirror)."""
    aside = [(e.seq, e.data) for e in queue.entries() if e.seq > applied]
    if aside:
        path = Quarantine(broker.config.data_dir).keep(queue.name, aside)
        log.warning("mirror reverse: queue %s becomes a mirror of cluster %s; its %d messages never mirrored there "
                    "(past seq %d) are kept in %s", queue.name, source, len(aside), applied, path)
    reason = (f"queue '{queue.name}' is now a mirror of cluster '{source}' (mirror reverse): read-only here until "
              f"this cluster is promoted again")
    for link in list(broker.engine.links.values()):
        if link.address == queue.name and link is not mirror_link:
            link.close(NOT_ALLOWED, reason)
    if broker.registry.lookup(queue.name) is queue:
        broker.registry.delete(queue.name, "queue")
    log.warning("mirror reverse: queue %s is now a mirror of cluster %s", queue.name, source)
