"""MirrorTarget: a standby cluster's end of the mirror (design/mirroring.md), on its primary (or on a broker of no
cluster). It serves `$mirror.state` and `$mirror.queue/<name>` to the users named in `mirror.accept_from`, creates
each mirrored queue marked with the source's name (protocol.SOURCE_ARG, replicated and journalled with the rest
of the standby's wiring), and keeps those queues read-only for clients: a client may browse one, not publish to
it nor consume from it, until the standby is promoted (promotion.py). From then on a source at an epoch no newer
than the promotion's is fenced off (epoch.py).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from ..broker.completion import Completion
from ..broker.connection import Connection
from ..broker.errors import NOT_ALLOWED, UNAUTHORIZED, BrokerError
from ..broker.exchange import Binding
from ..broker.proton_adapter import Link, LinkHandler
from ..broker.queue import Queue
from ..broker.registry import Node
from ..broker.server import Broker
from ..config import MirrorConfig
from ..ha.features import MIRROR, SUPPORTED
from ..ha.ha_broker import HaBroker
from ..ha.protocol import encode_map, flatten
from . import protocol
from .epoch import RECORD, EpochRecord
from .mirrored_queue import MirroredQueue, MirrorReceiver
from . import wiring
from .reverse import become_mirror
from .standby_link import HEARTBEAT, RETRY_INTERVAL

log = logging.getLogger("haqueue.mirror")

# A source still running connects again within this after its connection here ended (it tries every RETRY_INTERVAL,
# and gives a connection HEARTBEAT to open): until then it may be serving still.
SOURCE_GONE = RETRY_INTERVAL + HEARTBEAT


def source_of(queue: Queue) -> str | None:
    """The source cluster a queue here mirrors, None for a queue of this cluster's own."""
    source = queue.args.get(protocol.SOURCE_ARG)
    return str(source) if source is not None else None


class MirrorTarget:
    def __init__(self, broker: Broker, ha: HaBroker | None, config: MirrorConfig, record: EpochRecord) -> None:
        self.broker = broker
        self.ha = ha
        self.accept_from = frozenset(config.accept_from)
        self.cluster = config.cluster  # this cluster's name (given with mirror.to): a reverse onto it names it
        self.mirrored: dict[str, MirroredQueue] = {}  # by queue name, made when first needed
        self.record = record
        self.sources: dict[str, set[Connection]] = {}  # source cluster -> its connections here (that read the state)
        self.left: dict[str, float] = {}  # source cluster -> when (monotonic) its last connection here ended
        # A source's connection holds a link per mirrored queue: no client limit applies to it, as to HA's peers.
        broker.engine.connection_limits.exempt_users.update(self.accept_from)
        broker.endpoints[protocol.STATE] = self._state_endpoint
        broker.endpoints[protocol.QUEUE] = self._queue_endpoint
        broker.endpoints[protocol.WIRING] = self._wiring_endpoint
        # source cluster -> its last wiring snapshot (wiring.py), and whether it reverses onto this cluster
        self.wiring: dict[str, tuple[dict[str, Any], bool]] = {}
        broker.link_routes.append(self._read_only)
        broker.registry.queue_hooks.append(self._close)
        broker.registry.observers.append(self)  # a mirror queue deleted by an admin while mirrored
        if ha is not None:  # a backup's index (read for its status) is not kept as it replicates: made anew
            ha.promotion_hooks.append(self.mirrored.clear)

    # -- clients ------------------------------------------------------------------------------------
    def _read_only(self, link: Link) -> LinkHandler | None:
        """A client's link to a mirror queue itself: a browser only."""
        queue = self.broker.registry.lookup(link.address or "")
        if not isinstance(queue, Queue) or link.browse:
            return None
        refusal = self._refusal(queue, "consume from" if link.is_sender else "publish to")
        if refusal is not None:
            raise BrokerError(NOT_ALLOWED, refusal)
        return None

    def _close(self, queue: Queue) -> None:
        """What reaches a mirror queue any other way (an exchange, the anonymous relay) is refused too."""
        if source_of(queue) is not None:
            queue.publish_refusal = lambda: self._refusal(queue, "publish to")

    def _refusal(self, queue: Queue, verb: str) -> str | None:
        if queue.name == RECORD:
            return f"'{RECORD}' holds this standby's mirror epoch: not a client's to {verb}"
        source = source_of(queue)
        if source is None or self.record.read().promoted:
            return None
        return (f"queue '{queue.name}' is a mirror of cluster '{source}': read-only on this standby until it is "
                f"promoted; a client may browse it, not {verb} it")

    # -- the source's links ---------------------------------------------------------------------------
    def _check(self, link: Link, sends: bool) -> tuple[str, bool]:
        """The source cluster a `$mirror.*` link is from, once it may mirror here, and whether it reverses onto this
        cluster (its queues become that source's mirrors)."""
        user = link.conn.user
        if user not in self.accept_from:
            raise BrokerError(UNAUTHORIZED, f"user {user} may not mirror into {self.broker.name} (mirror.accept_from)")
        if self.ha is not None and self.ha.primary is None:
            raise BrokerError(NOT_ALLOWED, f"{self.broker.name} is not its cluster's primary")
        if self.ha is not None and not self.ha.features.on(MIRROR):
            raise BrokerError(NOT_ALLOWED, f"the feature flag {MIRROR} is not enabled in {self.broker.name}'s cluster: "
                                           f"enable it once every member runs {SUPPORTED[MIRROR].since} or newer "
                                           f"(haqueue admin cluster features enable {MIRROR})")
        if link.is_sender != sends:
            raise BrokerError(NOT_ALLOWED, f"{link.address} only {'sends' if sends else 'receives'}")
        props = link.properties
        refusal = protocol.refusal(props.get(protocol.PROTOCOLS))
        if refusal is not None:
            raise BrokerError(NOT_ALLOWED, refusal)
        source = props.get(protocol.CLUSTER)
        if not isinstance(source, str) or not source:
            raise BrokerError(NOT_ALLOWED, f"{link.address}: the source named no cluster ({protocol.CLUSTER})")
        epoch = props.get(protocol.EPOCH)
        if not isinstance(epoch, int):
            raise BrokerError(NOT_ALLOWED, f"{link.address}: the source named no epoch ({protocol.EPOCH})")
        reverse = bool(self.cluster) and props.get(protocol.REVERSES) == self.cluster
        known = self.record.read()
        fence = known.fence(source, epoch, reverse)
        if fence is not None:
            raise BrokerError(NOT_ALLOWED, fence)
        if epoch > known.epoch:  # so that a promotion's epoch is above every source's this standby accepted
            self.record.write(known.raise_to(epoch))
        return source, reverse

    def _state_endpoint(self, link: Link) -> LinkHandler:
        source, _ = self._check(link, sends=True)
        queues = {}
        for queue in self.broker.registry.queues():
            if source_of(queue) == source:
                queues[queue.name] = {"uid": queue.args.get(protocol.UID),
                                      "have": flatten(self._mirrored(queue).holdings())}
        log.info("mirror: source cluster %s connected from %s (user %s); it finds %d queues here", source,
                 link.conn.peer, link.conn.user, len(queues))
        self.sources.setdefault(source, set()).add(link.conn)
        state = {"queues": queues, protocol.STATE_PROTOCOL: protocol.chosen(link.properties[protocol.PROTOCOLS])}
        return _StateSender(link, encode_map(state), lambda: self._left(source, link.conn))

    def _left(self, source: str, conn: Connection) -> None:
        self.sources.get(source, set()).discard(conn)
        self.left[source] = time.monotonic()

    # -- switch-over (promotion.py) -------------------------------------------------------------------
    def serving(self) -> str | None:
        """Why a source may be serving still (its mirror is connected here, or was within SOURCE_GONE), or None."""
        now = time.monotonic()
        for source, conns in sorted(self.sources.items()):
            if conns:
                return f"cluster '{source}' is mirroring into it (connected from {sorted(c.peer for c in conns)[0]})"
            ago = now - self.left.get(source, 0.0)
            if ago < SOURCE_GONE:
                return f"cluster '{source}' was mirroring into it {ago:.1f}s ago"
        return None

    def promote(self, confirmed: Completion | None = None) -> None:
        """Make the mirror queues writable, raise the epoch (kept once `confirmed` is released), and end every
        source's connection: each is fenced off when it comes back."""
        if self.ha is not None and self.ha.primary is None:
            raise BrokerError(NOT_ALLOWED, f"{self.broker.name} is not its cluster's primary: promote the mirror "
                                           f"there")
        known = self.record.read()
        if known.promoted:
            raise BrokerError(NOT_ALLOWED, f"{self.broker.name}'s cluster was promoted already, at mirror epoch "
                                           f"{known.epoch}")
        applied = {}  # what a reverse keeps aside of its old source's messages: those past this
        for queue in self.broker.registry.queues():
            if source_of(queue) is not None:
                mirrored = self._mirrored(queue)
                mirrored.holdings()  # the index, of live messages only
                applied[queue.name] = max(mirrored.index, default=0)
        promoted = known.promote(applied)
        self.record.write(promoted, confirmed)
        for source, conns in self.sources.items():  # each at the epoch known before (it was accepted)
            for conn in list(conns):
                conn.close(NOT_ALLOWED, promoted.fence(source, max(known.epoch, protocol.FIRST_EPOCH), False) or "")
        log.warning("mirror: %s's cluster promoted at mirror epoch %d: its mirror queues are writable, and their "
                    "sources fenced off", self.broker.name, promoted.epoch)

    def _queue_endpoint(self, link: Link) -> LinkHandler:
        source, reverse = self._check(link, sends=False)
        name = (link.address or "")[len(protocol.QUEUE) + 1:]
        props = link.properties
        uid, args = props.get(protocol.UID), props.get(protocol.ARGS)
        args = {str(k): v for k, v in args.items()} if isinstance(args, dict) else {}
        registry = self.broker.registry
        queue = registry.lookup(name)
        if reverse and isinstance(queue, Queue) and not (source_of(queue) == source and queue.args.get(protocol.UID)
                                                         == uid):
            applied = props.get(protocol.APPLIED)
            self.mirrored.pop(name, None)
            become_mirror(self.broker, queue, source, applied if isinstance(applied, int) else 0, link)
            queue = None
        if queue is not None and not (isinstance(queue, Queue) and source_of(queue) == source):
            raise BrokerError(NOT_ALLOWED, f"'{name}' on {self.broker.name} is not a mirror of cluster '{source}': "
                                           f"delete it here, or leave it out of the source's mirror.queues")
        if isinstance(queue, Queue) and queue.args.get(protocol.UID) != uid:
            log.warning("mirror: queue %s of cluster %s was deleted and made again there: its copy here is replaced",
                        name, source)
            self.mirrored.pop(name, None)
            registry.delete(name, "queue")
            queue = None
        if queue is None:
            queue = registry.declare_queue(name, {**args, protocol.SOURCE_ARG: source, protocol.UID: uid})[0]
            log.info("mirror: queue %s made here, a mirror of cluster %s's", name, source)
            if source in self.wiring:  # its bindings, which came before it
                wiring.apply(registry, source, *self.wiring[source])
        assert isinstance(queue, Queue)
        return MirrorReceiver(self._mirrored(queue), link, lambda deleted: self._deleted(deleted, source))

    def _wiring_endpoint(self, link: Link) -> LinkHandler:
        source, reverse = self._check(link, sends=False)

        def wired(snapshot: dict[str, Any]) -> None:
            self.wiring[source] = (snapshot, reverse)
            wiring.apply(self.broker.registry, source, snapshot, reverse)
        return wiring.WiringReceiver(link, wired)

    def _deleted(self, queue: Queue, source: str) -> None:
        """The source deleted the queue: so is its mirror here (and with it any browser of it)."""
        if self.broker.registry.lookup(queue.name) is queue:
            self.mirrored.pop(queue.name, None)
            self.broker.registry.delete(queue.name, "queue")
            log.info("mirror: queue %s was deleted at cluster %s: its mirror here too", queue.name, source)

    # -- the registry's observer: a mirror queue deleted here other than by its mirror (which forgets it first)
    def declared(self, node: Node | Binding) -> None:
        pass

    def deleted(self, node: Node | Binding) -> None:
        """An admin deleted a mirror queue while its source's link fed it: what comes on that link has no queue to
        go to, and the source believes the standby holds what it had. The source's connection is closed, naming
        why: it connects again (within RETRY_INTERVAL), the queue is made again here, and the source sends it whole
        (the state names no such queue); its other queues resume from what this standby holds of them."""
        mirrored = self.mirrored.get(node.name) if isinstance(node, Queue) else None
        if mirrored is None or mirrored.queue is not node or not mirrored.links:
            return
        del self.mirrored[node.name]
        source = source_of(node) or ""
        reason = (f"queue '{node.name}', a mirror of cluster '{source}', was deleted on {self.broker.name} while "
                  f"mirrored: it is made again here and sent whole once the source connects again")
        log.warning("mirror: %s", reason)
        for conn in list(self.sources.get(source, ())):
            conn.close(NOT_ALLOWED, reason)

    def _mirrored(self, queue: Queue) -> MirroredQueue:
        mirrored = self.mirrored.get(queue.name)
        if mirrored is None or mirrored.queue is not queue:
            mirrored = self.mirrored[queue.name] = MirroredQueue(queue)
        return mirrored

    def status(self) -> dict[str, Any]:
        known = self.record.read()
        return {"role": "promoted" if known.promoted else "standby", "epoch": known.epoch,
                "promoted_at": known.promoted_at, "reversed_to": known.reverses,
                "accept_from": sorted(self.accept_from),
                "sources": {source: {"connected": bool(conns)} for source, conns in sorted(self.sources.items())},
                "queues": [self._mirrored(q).status() for q in sorted(self.broker.registry.queues(),
                                                                       key=lambda q: q.name)
                           if source_of(q) is not None]}


class _StateSender(LinkHandler):
    """The standby's end of `$mirror.state`: one message, sent once the source grants credit."""

    def __init__(self, link: Link, state: bytes, detached: Callable[[], None]) -> None:
        self.link = link
        self.state: bytes | None = state
        self.detached = detached

    def on_credit(self) -> None:
        if self.state is not None and self.link.credit():
            self.link.send(self.state, settled=True)
            self.state = None

    def on_detach(self) -> None:
        self.detached()
