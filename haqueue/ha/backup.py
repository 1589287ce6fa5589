"""Backup: finds and follows the primary, runs the wiring replicator and one QueueReplicator per
message-replicated queue, and knows its own state: joining -> catchup -> ready.

It tries each broker of `ha.brokers` in turn; only the primary accepts the `$ha.wiring` link. A
backup that loses its primary keeps its state (a ready backup stays ready, so it can be promoted)
and keeps looking. Once following, it reports to the primary every second what it holds in memory
and on disk (`$ha.report`).
"""
from __future__ import annotations

import logging
import ssl
from typing import Any, Callable, ContextManager, Iterable, Protocol

from ..broker.connection import Connection
from ..broker.proton_adapter import LinkHandler
from ..broker.queue import Queue
from ..broker.registry import Registry
from ..broker.server import Broker, Durability
from ..config import HaConfig, ListenerConfig, parse_address
from . import protocol, test_hooks, versions
from .features import FeatureFlags
from .quarantine import Quarantine
from .queue_replicator import QueueReplicator
from .transaction_replicator import TransactionReplicator
from .role import CATCHUP, JOINING, OUTSIDE, READY, WAS_READY, EpochStore
from .wiring_replicator import WiringReplicator

log = logging.getLogger("haqueue.ha.backup")

RETRY_INTERVAL = 0.2  # seconds between attempts to find the primary
STATUS_QUEUES = 100  # queues described one by one in the status
REFUSED_RETRY = 1.0  # seconds before a queue link the primary refused is attached again
HEARTBEAT = 2.0  # idle timeout on the link to the primary: a hung primary is noticed within it
# Queue links attached and not caught up yet, at most; the other queues wait their turn. The primary answers the
# attaches in the order they come: with all 10,000 sent at once, a queue it asks for first (a publish waits on
# it) came after every other. Each turn costs a round trip, which a loaded machine makes long: at load 11-14 a
# re-subscription to 10,000 queues took 29 s 256 at a time, 20 s all at once (one run each).
SUBSCRIBING = 1024


class BackupHost(Protocol):
    """What a backup needs of the HaBroker that runs it (ha_broker.HaBroker): it never imports it."""

    broker: Broker
    config: HaConfig
    config_address: ListenerConfig | None  # this broker's listener in ha.brokers, if it has one
    client_tls: ssl.SSLContext | None  # for its connections to its peers (ha.tls)
    epoch: EpochStore
    replication_hooks: list[Callable[[Queue, bytes, int, int, bytes], None]]
    build: versions.Build  # this broker's, announced to its peers
    protocol_refusals: dict[str, str]
    features: FeatureFlags  # the cluster's, as this broker last knew

    def hold_epoch(self, epoch: int) -> None:
        """This broker follows the primary of `epoch` (persisted)."""

    def protocol_refused(self, peer: str, reason: str) -> None:
        """A peer with which this broker shares no replication protocol (logged when it is news)."""


class Backup:
    def __init__(self, ha: BackupHost) -> None:
        self.ha = ha
        self.state = JOINING
        self.conn: Connection | None = None
        self.primary: str | None = None
        self.primary_client: tuple[str, int] | None = None  # where the primary followed serves clients, if it said
        self.peer_build: versions.Build | None = None  # what the peer of the current connection announced
        self.protocol = 0  # the replication protocol spoken with that peer
        self.members: dict[str, str] = {}
        self.replicators: dict[str, QueueReplicator] = {}
        self.waiting: dict[str, Queue] = {}  # queues to subscribe to, in turn (first in, first subscribed)
        self.subscribing: set[str] = set()  # queues whose links are attached and not caught up yet
        self.window = test_hooks.subscribing(SUBSCRIBING)
        self.refused: dict[str, str] = {}  # queue -> why the primary refused its link, until it replicates
        self.refusals = 0  # queue links refused since this process started (status, metrics)
        self.transactions = TransactionReplicator(self)  # commits arriving in parts
        self.acquired: dict[str, set[int]] = {}  # queue -> seqs a consumer held on the primary
        self.applied = 0  # replication transfers applied: ranks backups by how up to date they are
        self.from_disk = False  # the primary's sync mode asks for confirmations from the journal's disk
        self.quarantine = Quarantine(ha.broker.config.data_dir)  # what a new primary never had, kept aside
        self.wiring: WiringReplicator | None = None
        self.reporter: Reporter | None = None
        self.stopped = False
        own = (ha.config_address.host, ha.config_address.port) if ha.config_address else None
        self.candidates = [addr for addr in ha.config.brokers if addr != own]
        self._peer: tuple[str, int] | None = None
        self._opened = False
        self._next = 0
        self._tried: set[tuple[str, int]] = set()  # peers reached or refused at least once
        self.peers_with_history: set[str] = set()  # peers that have had a primary: the cluster is not new
        self.max_peer_epoch = 0  # the highest epoch a peer has told us of
        self.peer_freshness: dict[str, tuple[int, ...]] = {}  # what each peer said of its store when last met
        self.peer_states: dict[str, str] = {}  # and of its state
        ha.broker.engine.call_later(0, self._connect)

    @property
    def tried_every_peer(self) -> bool:
        return len(self._tried) >= len(self.candidates)

    # -- what its replicators need of the broker (ReplicaHost, WiringHost, CommitHost) -----------
    @property
    def registry(self) -> Registry:
        return self.ha.broker.registry

    @property
    def durability(self) -> Durability | None:
        return self.ha.broker.durability

    @property
    def replication_hooks(self) -> list[Callable[[Queue, bytes, int, int, bytes], None]]:
        return self.ha.replication_hooks

    def atomically(self) -> ContextManager[None]:
        return self.ha.broker.atomically()

    def link_properties(self) -> dict[str, Any]:
        """What this backup says of itself on each link it attaches: its name, the highest epoch it has seen."""
        return {protocol.BROKER: self.ha.broker.name, protocol.EPOCH: self.ha.epoch.epoch}

    # -- finding the primary -----------------------------------------------------------------
    def _connect(self) -> None:
        if self.stopped or self.conn is not None or not self.candidates:
            return
        host, port = self.candidates[self._next % len(self.candidates)]
        self._next += 1
        self._peer = (host, port)
        config = self.ha.config
        conn = self.conn = self.ha.broker.engine.connect(host, port, self, config.username, config.password,
                                                         idle_timeout=HEARTBEAT, tls=self.ha.client_tls)
        conn.set_properties(versions.announcement(self.ha.build))
        self._opened = False
        # A hung peer accepts TCP connections (the kernel does) but never answers: give up on it.
        self.ha.broker.engine.call_later(HEARTBEAT, lambda: self._open_timeout(conn))

    def _open_timeout(self, conn: Connection) -> None:
        if conn is self.conn and not self._opened and not conn.closed:
            log.debug("%s did not answer within %.1fs", conn.peer, HEARTBEAT)
            conn.abort()

    def on_open(self, conn: Connection) -> None:
        if conn is not self.conn:
            return
        self._opened = True
        if self._peer is not None:
            self._tried.add(self._peer)
        props = conn.remote_properties
        epoch = int(props.get(protocol.EPOCH) or 0)
        self.max_peer_epoch = max(self.max_peer_epoch, epoch)
        if props.get(protocol.HAD_PRIMARY) or epoch > 0:
            self.peers_with_history.add(conn.peer)
        self.peer_freshness[conn.peer] = tuple(props.get(protocol.FRESHNESS) or (epoch,))
        self.peer_states[conn.peer] = str(props.get(protocol.STATE) or JOINING)
        peer = self.peer_build = versions.announced(props, conn.peer)
        reason = versions.refusal(self.ha.build, peer, self.ha.features.enabled, str(props.get(protocol.ROLE) or "peer"))
        if reason is not None:  # never followed half-way: no link to a peer this broker may misread
            self.ha.protocol_refused(peer.name, reason)
            self._give_up_on(reason)
            return
        self.ha.protocol_refusals.pop(peer.name, None)
        self.protocol = versions.agreed(self.ha.build, peer) or 0
        self.wiring = WiringReplicator(self)
        self.wiring.link = conn.open_link(False, protocol.WIRING, protocol.WIRING, self.wiring, credit=1000,
                                          properties=self.link_properties())

    def on_closed(self, conn: Connection, reason: str) -> None:
        if conn is not self.conn:
            return
        if self.primary is not None:
            log.warning("lost primary %s: %s", self.primary, reason)
        self.conn = None
        self.peer_build = None
        self.protocol = 0
        self.primary = None
        self.primary_client = None
        self.wiring = None
        self.reporter = None
        self.replicators.clear()
        self.waiting.clear()
        self.subscribing.clear()
        self.refused.clear()
        self.transactions.drop_incomplete()  # a new subscription is sent what the primary did commit
        if self._peer is not None:
            self._tried.add(self._peer)
        if not self.stopped:
            # Through the peers one after another, then a pause before the next round.
            pause = RETRY_INTERVAL if self._next % len(self.candidates) == 0 else 0.0
            self.ha.broker.engine.call_later(pause, self._connect)

    def _give_up_on(self, reason: str) -> None:
        """This peer is not (or may not be) our primary: close and try the next."""
        log.debug("%s: %s", self.conn.peer if self.conn else "?", reason)
        if self.conn is not None:
            self.conn.close()

    def cluster_features(self, enabled: Iterable[str]) -> None:
        self.ha.features.set(enabled)

    def wiring_detached(self, error: str | None) -> None:
        self._give_up_on(error or "wiring link closed")

    def replicator_refused(self, replicator: QueueReplicator, error: str) -> None:
        """The primary refused (or closed) a queue's link: this backup does not hold that queue, so it is not
        ready, and it attaches the link again until the primary takes it or the wiring deletes the queue."""
        queue = replicator.queue
        if self.replicators.get(queue.name) is not replicator:
            return
        replicator.caught_up = False
        self.refusals += 1
        self._subscribed(queue.name)
        if queue.name not in self.refused:
            log.warning("queue %s not replicated: %s; attaching again every %gs", queue.name, error, REFUSED_RETRY)
        self.refused[queue.name] = error
        self.check_ready()
        conn = self.conn
        self.ha.broker.engine.call_later(REFUSED_RETRY, lambda: self._attach_again(replicator, conn))

    def _attach_again(self, replicator: QueueReplicator, conn: Connection | None) -> None:
        queue = replicator.queue
        if self.stopped or conn is not self.conn or self.replicators.get(queue.name) is not replicator:
            return  # another connection, or the queue is gone or replicating again
        del self.replicators[queue.name]
        self.replicate(queue)

    def accept_primary(self, name: str, epoch: int) -> bool:
        """Called with the primary's snapshot: refuse a primary older than one already seen."""
        known = self.ha.epoch.epoch
        if epoch < known:
            log.error("refusing primary %s: its epoch %d is older than %d", name, epoch, known)
            self._give_up_on("stale primary")
            return False
        self.ha.hold_epoch(epoch)
        if self.primary != name:
            log.info("following primary %s (epoch %d)", name, epoch)
        self.primary = name
        if self.conn is not None:
            self.primary_client = _client_address(self.conn.remote_properties)
            if self.reporter is None:
                self.reporter = Reporter(self, self.conn)
        return True

    # -- replication ---------------------------------------------------------------------------
    def wiring_synced(self) -> None:
        if self.state == JOINING:
            self.state = CATCHUP
            self.ha.epoch.stand(OUTSIDE)  # what it kept may lack what was confirmed while it was away
        self.check_ready()

    def replicate(self, queue: Queue, fresh: bool = False) -> None:
        """Subscribe to the queue now if `fresh` (declared on the primary after the snapshot: nothing to catch up)
        or if fewer than `window` subscriptions are under way; else in its turn."""
        if queue.name in self.replicators or queue.name in self.waiting or self.conn is None:
            return
        if fresh or (not self.waiting and len(self.subscribing) < self.window):
            self._subscribe(queue, fresh)
        else:
            self.waiting[queue.name] = queue
            self.check_ready()

    def _subscribe(self, queue: Queue, fresh: bool) -> None:
        assert self.conn is not None
        replicator = QueueReplicator(self, queue, self.conn)
        replicator.caught_up = fresh
        self.replicators[queue.name] = replicator
        if not fresh:
            self.subscribing.add(queue.name)
        self.check_ready()

    def _subscribed(self, name: str) -> None:
        """A subscription is no longer under way (caught up, refused, or its queue gone): the next in turn."""
        self.subscribing.discard(name)
        while self.waiting and len(self.subscribing) < self.window and self.conn is not None:
            self._subscribe(self.waiting.pop(next(iter(self.waiting))), False)

    def first(self, name: str) -> None:
        """A publish on this queue waits for this backup: subscribe to it before the rest. (A waiting queue has no
        replicator: `replicate` puts it here only then, and the connection's loss clears both.)"""
        queue = self.waiting.pop(name, None)
        if queue is not None and self.conn is not None:
            self._subscribe(queue, False)

    def stop_replicating(self, queue: Queue) -> None:
        replicator = self.replicators.pop(queue.name, None)
        if replicator is not None:
            replicator.close()
        self.waiting.pop(queue.name, None)
        self._subscribed(queue.name)
        self.acquired.pop(queue.name, None)  # the queue is gone: nothing of it to redeliver

    def numbered_here(self, seq: int) -> bool:
        return seq >> protocol.EPOCH_SEQ_SHIFT in self.ha.epoch.led

    def caught_up(self, replicator: QueueReplicator) -> None:
        self.refused.pop(replicator.queue.name, None)
        self._subscribed(replicator.queue.name)
        self.check_ready()

    def check_ready(self) -> None:
        """Judge readiness at the end of this pass (`dispatch`, through broker.schedule, once however often
        asked): at thousands of queues, a judgement on each event (every queue declared, every queue caught up)
        was quadratic."""
        self.ha.broker.schedule(self)

    @property
    def deleted(self) -> bool:
        """Stopped (promoted, broker.schedule skips it): nothing left to judge."""
        return self.stopped

    def dispatch(self) -> None:
        self.judge_ready()

    def judge_ready(self) -> None:
        if self.state == JOINING or self.primary is None:
            return
        ready = not self.waiting and all(r.caught_up for r in self.replicators.values())
        state = READY if ready else CATCHUP
        if state != self.state:
            self.state = state
            self.ha.epoch.stand(WAS_READY if state == READY else OUTSIDE)
            log.info("backup %s is %s", self.ha.broker.name, state)

    def stop(self) -> None:
        """On promotion: stop following, keep every message received."""
        self.stopped = True
        for replicator in self.replicators.values():
            replicator.merge()
        self.transactions.drop_incomplete()
        if self.conn is not None:
            self.conn.close()
        self._redeliver()

    def _redeliver(self) -> None:
        """Messages a consumer held on the old primary go out again with delivery-count + 1."""
        for name, seqs in self.acquired.items():
            queue = self.ha.broker.registry.lookup(name)
            if isinstance(queue, Queue) and seqs:
                queue.redeliver(seqs)
        self.acquired.clear()

    def held(self) -> dict[str, Any]:
        """Messages and bytes in memory, and what the journal holds (with a store): the report."""
        broker = self.ha.broker
        queues = broker.registry.queues()
        paged = sum(q.pager.count for q in queues if q.pager is not None)
        held: dict[str, Any] = {"memory": {"messages": sum(q.depth for q in queues) - paged,
                                           "bytes": broker.memory.used}}
        if broker.durability is not None:
            held["disk"] = broker.durability.held()
        return held

    def status(self) -> dict[str, Any]:
        """Per queue for at most STATUS_QUEUES queues, those not caught up first: one answer must stay within
        what a management reply can encode at any number of queues; the counts cover them all."""
        replicators = self.replicators.values()
        behind = [r for r in replicators if not r.caught_up]
        shown = (behind + [r for r in replicators if r.caught_up])[:STATUS_QUEUES]
        return {"primary": self.primary, "members": self.members, "applied": self.applied,
                "primary_build": self.peer_build.describe() if self.primary and self.peer_build else None,
                "protocol": self.protocol if self.primary else None,
                "replicating": {"queues": len(self.replicators) + len(self.waiting),
                                "caught_up": len(self.replicators) - len(behind), "waiting": len(self.waiting),
                                "refused": len(self.refused)},
                "queues": {r.queue.name: r.status() for r in shown},
                "refused": dict(list(self.refused.items())[:STATUS_QUEUES]), "refusals": self.refusals,
                **self.held()}


class Reporter(LinkHandler):
    """The backup's end of `$ha.report`: what it holds, every REPORT_INTERVAL, sent settled (a lost
    report is replaced by the next)."""

    def __init__(self, backup: Backup, conn: Connection) -> None:
        self.backup = backup
        self.link = conn.open_link(True, protocol.REPORT, protocol.REPORT, self, properties=backup.link_properties())
        backup.ha.broker.engine.call_later(0, self._report)

    def _report(self) -> None:
        if self.link.closed:
            return
        if self.link.credit() > 0:
            self.link.send(protocol.encode_map(self.backup.held()), settled=True)
        self.backup.ha.broker.engine.call_later(protocol.REPORT_INTERVAL, self._report)


def _client_address(properties: dict[str, Any]) -> tuple[str, int] | None:
    """Where a primary said (in its open) it serves clients; None if it named none or nothing usable."""
    try:
        return parse_address(str(properties.get(protocol.CLIENT_ADDRESS) or ""))
    except ValueError:
        return None
