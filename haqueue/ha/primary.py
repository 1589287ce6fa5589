"""Primary: accepts backups, sends them the wiring, and one ReplicatingSubscription per backup and queue.

`RemoteBackup` is the primary's view of one backup; `WiringSubscription` the primary's end of that
backup's `$ha.wiring` link. A backup that does not confirm within `backup_timeout` is dropped
(its holds released, its connection closed) and must reconnect and catch up: a stalled backup
never stalls the primary.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from ..broker.codec import nodes
from ..broker.errors import BrokerError, NOT_ALLOWED, NOT_FOUND, RESOURCE_LIMIT
from ..broker.exchange import Binding, Exchange
from ..broker.proton_adapter import Link, LinkHandler
from ..broker.queue import Queue
from ..broker.server import Broker
from ..config import HaConfig
from . import protocol, versions
from .adoption import Adoptions, Taker
from .ask_first import AskFirst
from .features import FeatureFlags
from .policy import Policy
from .queue_guard import QueueGuard
from .quorum import Quorums, confirmations_needed, from_disk, is_quorum
from .replicating_subscription import ReplicatingSubscription
from .role import ACTIVE, CATCHUP, READY, RECOVERING, EpochStore
from .test_hooks import link_refused

log = logging.getLogger("haqueue.ha.primary")


class PrimaryHost(Protocol):
    """What the primary needs of the HaBroker that runs it (ha_broker.HaBroker): it never imports it."""

    broker: Broker
    config: HaConfig
    policy: Policy
    epoch: EpochStore
    build: versions.Build  # this broker's
    features: FeatureFlags
    protocol_refusals: dict[str, str]  # peers refused, by name: why

    def protocol_refused(self, peer: str, reason: str) -> None:
        """A backup refused for its protocols or features (logged when it is news)."""

    def fence(self, reason: str, at_once: bool = False) -> None:
        """A newer primary exists: stop serving and start again as a backup."""

    def context_changing(self) -> None:
        """Call the context hooks: the backups ready for a queue are about to change."""


def describe(node: Queue | Exchange | Binding, level: str) -> dict[str, Any]:
    """A wiring object as the wiring link carries it."""
    if isinstance(node, Binding):
        return {"kind": "binding", "exchange": node.exchange.name, "queue": node.queue.name, "key": node.key,
                "args": dict(node.args), "uid": node.uid}
    info: dict[str, Any] = {"kind": node.kind, "name": node.name, "args": dict(node.args), "uid": node.uid,
                            "replicate": level}
    if isinstance(node, Exchange):
        info["type"] = node.type
    return info


class WiringSubscription(LinkHandler):
    """The primary's end of a backup's `$ha.wiring` link: a snapshot, then live events."""

    def __init__(self, backup: "RemoteBackup", link: Link) -> None:
        self.backup = backup
        self.link = link
        for part in backup.primary.snapshot():
            self.send(part)
        if backup.protocol >= protocol.FLAGS_PROTOCOL:  # one of protocol 1 knows no feature flags
            self.send(backup.primary.features_event())

    def send(self, event: dict[str, Any]) -> None:
        if not self.link.closed:
            self.link.send(protocol.encode_map(event), settled=True)

    def on_detach(self) -> None:
        self.backup.wiring_closed(self)


class BackupReports(LinkHandler):
    """The primary's end of a backup's `$ha.report` link: keeps its latest report."""

    def __init__(self, backup: "RemoteBackup") -> None:
        self.backup = backup

    def on_message(self, delivery: Any, data: bytes, settled: bool) -> None:
        self.backup.report = protocol.decode_map(data)
        self.backup.reported = time.monotonic()


class BackupCounters:
    """Totals for one backup, by name, for as long as this broker is primary: they outlive the backup's
    reconnections (and its RemoteBackup), so a backup that went away still shows (metrics)."""

    __slots__ = ("confirmed", "timeout_drops")

    def __init__(self) -> None:
        self.confirmed = 0  # live enqueues it confirmed
        self.timeout_drops = 0  # times it was dropped for not confirming within backup_timeout


class RemoteBackup:
    """The primary's view of one backup; its ReplicatingSubscriptions' host (SubscriptionHost)."""

    def __init__(self, primary: "Primary", name: str) -> None:
        self.primary = primary
        self.name = name
        self.counters = primary.counters.setdefault(name, BackupCounters())
        # The broker's own, for its subscriptions on their per-message paths: bound here, so a call costs them
        # no more than it did when they reached the broker through the primary.
        self.schedule = primary.broker.schedule  # dispatch a subscription at the end of this pass
        self.call_later = primary.broker.engine.call_later
        self.wiring: WiringSubscription | None = None
        self.subscriptions: dict[str, ReplicatingSubscription] = {}
        self.state = CATCHUP
        self.connection: Any = None
        # Queues created since this backup joined, held for it until its subscription catches up.
        self.pending: dict[str, QueueGuard] = {}
        self.report: dict[str, Any] = {}  # what it last said it holds in memory and on disk ($ha.report)
        self.reported = 0.0  # when (monotonic)
        self.build: versions.Build | None = None  # what it announced at open
        self.protocol = 0  # the replication protocol spoken with it

    @property
    def lag(self) -> int:
        return sum(sub.lag for sub in self.subscriptions.values())

    @property
    def unconfirmed(self) -> int:
        """Live enqueues sent and not yet confirmed (held in its memory, or on its disk, as the mode says)."""
        return sum(sub.unconfirmed for sub in self.subscriptions.values())

    def catchup_progress(self) -> dict[str, int]:
        """Catch-up messages done (sent, or dequeued meanwhile) and in all, over its queues still catching up."""
        catching_up = [sub for sub in self.subscriptions.values() if not sub.caught_up]
        total = sum(sub.catchup_total for sub in catching_up)
        return {"done": total - sum(len(sub.catchup) for sub in catching_up), "total": total}

    def lag_seconds(self, now: float) -> float:
        """How long the oldest live enqueue sent to it and not yet confirmed has waited (0: none waits)."""
        oldest = [sent for sub in self.subscriptions.values() if (sent := sub.oldest_unconfirmed())]
        return now - min(oldest) if oldest else 0.0

    @property
    def quorums(self) -> Quorums | None:
        return self.primary.quorums

    @property
    def holds(self) -> bool:
        return self.primary.holds

    def context_changing(self) -> None:
        self.primary.ha.context_changing()

    def changed(self) -> None:
        """Re-judge readiness at the end of this pass (`dispatch`, through broker.schedule, once however often
        asked): at thousands of queues, a judgement on each event (each queue declared, each queue caught up)
        was quadratic."""
        self.schedule(self)

    def never_here(self, queue: Queue) -> tuple[int, int]:
        return self.primary.inherited.get(queue, 0), self.primary.ha.epoch.epoch << protocol.EPOCH_SEQ_SHIFT

    def adopted(self, queue: Queue) -> list[tuple[int, int]]:
        return self.primary.adoptions.confirmed(queue)

    def caught_up(self, sub: ReplicatingSubscription) -> None:
        """What a guard held for this backup on the queue, the backup received in catch-up."""
        guard = self.pending.pop(sub.queue.name, None)
        if guard is not None:
            guard.release()
        expected = self.primary.expected.get(self.name)
        if expected is not None:
            expected.release_queue(sub.queue)
        self.changed()

    @property
    def deleted(self) -> bool:
        """Forgotten by the primary (broker.schedule skips it): nothing left to judge."""
        return self.primary.backups.get(self.name) is not self

    def dispatch(self) -> None:
        """Ready: wiring received and every message-replicated queue caught up (or held for it, pending)."""
        primary = self.primary
        # A queue still pending is held for this backup: nothing of it is confirmed without it.
        ready = self.wiring is not None and all(
            (q.name in self.subscriptions and self.subscriptions[q.name].caught_up) or q.name in self.pending
            for q in primary.broker.registry.queues() if primary.ha.policy.replicates_messages(q))
        state = READY if ready else CATCHUP
        if state != self.state:
            self.state = state
            log.info("backup %s is %s", self.name, state)
            primary.membership_changed()

    def subscription_closed(self, sub: ReplicatingSubscription) -> None:
        if self.subscriptions.get(sub.queue.name) is sub:
            del self.subscriptions[sub.queue.name]
        self.changed()

    def wiring_closed(self, wiring: WiringSubscription) -> None:
        if self.wiring is wiring:
            self.primary.forget(self)

    def guard(self, queue: Queue) -> None:
        """A queue created after this backup joined: hold its publishes until the backup has them."""
        old = self.pending.pop(queue.name, None)
        if old is not None:  # a queue of that name deleted and re-created
            old.release()
        guard = self.pending[queue.name] = QueueGuard(self.name)
        guard.guard(queue)

    def release_pending(self) -> None:
        for guard in self.pending.values():
            guard.release()
        self.pending.clear()

    def overdue(self, timeout: float) -> bool:
        return any(sub.overdue(timeout) for sub in self.subscriptions.values()) or \
            any(guard.overdue(timeout) for guard in self.pending.values())

    def drop(self, reason: str) -> None:
        log.warning("dropping backup %s: %s", self.name, reason)
        self.release_pending()
        for sub in list(self.subscriptions.values()):
            sub.close()
        if self.connection is not None and not self.connection.closed:
            self.connection.close("amqp:connection:forced", f"dropped by the primary: {reason}")
        self.primary.forget(self)


class Primary:
    def __init__(self, ha: PrimaryHost, expected: set[str], inherited: dict[Queue, int]) -> None:
        self.ha = ha
        # Per queue, the seq above the last this broker held when promoted: a rejoining backup's seqs from there
        # up to this epoch's first were never here (it was a primary cut off from the cluster): it keeps them aside.
        self.inherited = inherited
        self.adoptions = Adoptions()  # what backups brought of those seqs: adopted as new messages
        self.broker = ha.broker
        self.backups: dict[str, RemoteBackup] = {}
        self.counters: dict[str, BackupCounters] = {}  # every backup seen while primary, by name
        self.state = RECOVERING if expected else ACTIVE
        # Backups that were ready under the old primary: publishes wait for them to be ready again.
        self.expected: dict[str, QueueGuard] = {name: QueueGuard(name) for name in expected}
        self.ask_first = AskFirst(self._ask_first)  # on the queues while a backup catches up
        # Each publish waits for this many brokers to hold it (the floor), and under `all` for each subscribed
        # backup too (its subscription holds it); a coordinator that can suspend confirmations needs the floor's
        # guard even where nothing else would (the opt-out).
        self.needed = confirmations_needed(ha.config)
        self.holds = not is_quorum(ha.config.sync)
        suspendable = ha.config.coordinator == "zookeeper"
        self.quorums = Quorums(self.needed - 1) if self.needed > 1 or suspendable else None
        self.short = False  # fewer brokers hold new messages than `needed`: publishes wait
        for queue in self.broker.registry.queues():
            self._guard_new_queue(queue)
        self.broker.registry.observers.append(self)
        self.broker.registry.queue_hooks.append(self._guard_new_queue)
        self.broker.transactions.observers.append(self)
        timeout = ha.config.backup_timeout
        self.broker.engine.every(min(timeout / 4, 0.5), self._check_backups)
        if expected:
            log.info("recovering: waiting up to %.1fs for backups %s", timeout, ", ".join(sorted(expected)))
            self.broker.engine.call_later(timeout, self._recovery_timeout)
        self._judge_floor()

    # -- wiring --------------------------------------------------------------------------------
    def _level(self, node: Any) -> str:
        return self.ha.policy.level(node.args)

    def snapshot(self) -> list[dict[str, Any]]:
        """The wiring as one `snapshot` event, followed by `snapshot-part`s when it is too large for one message
        (the first says how many parts in all); a backup applies it once it has every part."""
        registry, policy = self.broker.registry, self.ha.policy
        objects = [("queues", describe(q, self._level(q))) for q in registry.queues() if policy.replicates_wiring(q)]
        objects += [("exchanges", describe(x, self._level(x))) for x in registry.exchanges()
                    if policy.replicates_wiring(x)]
        objects += [("bindings", describe(b, "")) for b in registry.bindings() if policy.replicates_wiring(b)]
        head: dict[str, Any] = {"event": "snapshot", "epoch": self.ha.epoch.epoch, "primary": self.broker.name,
                                "sync": self.ha.config.sync, "members": self.members()}
        parts: list[dict[str, Any]] = [head]
        room = protocol.MESSAGE_NODES - nodes(head)
        for kind, description in objects:
            size = nodes(description) + 1
            if size > room and len(parts[-1]) > 1:
                parts.append({"event": "snapshot-part"})
                room = protocol.MESSAGE_NODES
            parts[-1].setdefault(kind, []).append(description)
            room -= size
        head["parts"] = len(parts)
        return parts

    def features_event(self) -> dict[str, Any]:
        return {"event": "features", "enabled": sorted(self.ha.features.enabled)}

    def features_changed(self) -> None:
        for backup in list(self.backups.values()):
            if backup.wiring is not None and backup.protocol >= protocol.FLAGS_PROTOCOL:
                backup.wiring.send(self.features_event())

    def _broadcast(self, event: dict[str, Any]) -> None:
        for backup in list(self.backups.values()):
            if backup.wiring is not None:
                backup.wiring.send(event)

    def declared(self, node: Queue | Exchange | Binding) -> None:
        if self.ha.policy.replicates_wiring(node):
            self._broadcast({"event": "declare", **describe(node, "" if isinstance(node, Binding) else self._level(node))})
        if isinstance(node, Queue):
            for backup in self.backups.values():
                if node.name not in backup.pending:  # a queue held for the backup leaves its readiness as it was
                    backup.changed()

    def deleted(self, node: Queue | Exchange | Binding) -> None:
        if isinstance(node, Queue):
            self.inherited.pop(node, None)
            self.adoptions.forget(node)
        if self.ha.policy.replicates_wiring(node):
            self._broadcast({"event": "delete", **describe(node, "")})

    def _guard_new_queue(self, queue: Queue) -> None:
        if self.ha.policy.replicates_messages(queue):
            # Numbered from this epoch's first seq: a message numbered here never takes the seq of one a
            # predecessor numbered but never replicated, and a backup tells by a seq which epoch's primary
            # numbered it (adoption.py).
            queue.next_seq = max(queue.next_seq, self.ha.epoch.epoch << protocol.EPOCH_SEQ_SHIFT)
            # Messages kept on this broker alone (x-replicate: false; transient ones under `durable`): no guard
            # holds them, no backup is sent them.
            queue.keep_local_where(self.ha.policy.keeps_local(queue))
            if self.ask_first.standing:
                self.ask_first.stand_on([queue])
            if self.quorums is not None:
                self.quorums.guard(queue)
            if not self.holds:  # votes from any majority, not each backup's own guard
                return
            for guard in self.expected.values():
                guard.guard(queue)
            for backup in self.backups.values():
                if backup.wiring is not None:
                    backup.guard(queue)

    # -- a transaction's commit: replicated in parts, one per queue, applied whole by each backup ----
    def _subscriptions(self, backup: "RemoteBackup", queues: list[Queue]) -> list[ReplicatingSubscription]:
        return [sub for q in queues if (sub := backup.subscriptions.get(q.name)) is not None and sub.queue is q]

    def committing(self, number: int, queues: list[Queue]) -> None:
        for backup in self.backups.values():
            for sub in self._subscriptions(backup, queues):
                sub.committing(number)

    def committed(self, number: int, queues: list[Queue]) -> None:
        for backup in self.backups.values():
            subs = self._subscriptions(backup, queues)
            names = [sub.queue.name for sub in subs]
            for sub in subs:
                sub.committed(number, names)

    # -- membership ----------------------------------------------------------------------------
    def members(self) -> dict[str, str]:
        return {name: backup.state for name, backup in self.backups.items()}

    def _ask_first(self, queue: Queue) -> None:
        """A publish on `queue` waits: ask each backup not subscribed to it yet to take it before the queues still
        waiting their turn (ask_first.py)."""
        for backup in self.backups.values():
            sub = backup.subscriptions.get(queue.name)
            if backup.wiring is not None and backup.protocol >= protocol.FIRST_PROTOCOL \
                    and (sub is None or sub.queue is not queue):
                backup.wiring.send({"event": "first", "queue": queue.name})

    def _waiting_queues(self) -> set[Queue]:
        """The queues on which publishes wait for backups now."""
        queues = {queue for queue, held in self.quorums.pending.items() if held} if self.quorums is not None else set()
        for guard in self.expected.values():
            queues.update(guard.held)
        return queues

    def ready_backups(self, queue: Queue) -> tuple[str, ...]:
        return tuple(sorted(name for name, backup in self.backups.items()
                            if (sub := backup.subscriptions.get(queue.name)) is not None
                            and sub.caught_up and sub.queue is queue))

    def membership_changed(self) -> None:
        for name, guard in list(self.expected.items()):
            backup = self.backups.get(name)
            if backup is not None and backup.state == READY:
                guard.release()
                del self.expected[name]
        if self.state == RECOVERING and not self.expected:
            self._go_active()
        if self.ask_first.standing and all(backup.state == READY for backup in self.backups.values()):
            self.ask_first.leave()
        self._judge_floor()
        self._broadcast({"event": "membership", "members": self.members()})

    def holders(self) -> int:
        """Brokers that hold every new message: this one and its ready backups."""
        return 1 + sum(backup.state == READY for backup in self.backups.values())

    def _judge_floor(self) -> None:
        """Say once when publishes start and stop waiting for enough brokers to hold them."""
        short = self.holders() < self.needed
        if short != self.short:
            self.short = short
            if short:
                log.warning("only %d of %d brokers hold new messages, %d must (ha.min_confirmations): publishes "
                            "wait until a backup is ready again", self.holders(), len(self.ha.config.brokers),
                            self.needed)
            else:
                log.info("%d brokers hold new messages again: publishes are confirmed", self.holders())

    def suspend(self, reason: str) -> None:
        """A coordinator cannot prove this broker is still the primary: confirm nothing until resume()."""
        if self.quorums is not None and not self.quorums.suspended:
            log.warning("confirmations suspended: %s", reason)
            self.quorums.suspend(reason)

    def resume(self) -> None:
        if self.quorums is not None and self.quorums.suspended:
            log.info("confirmations resumed")
            self.quorums.resume()

    def _recovery_timeout(self) -> None:
        if self.state == RECOVERING:
            log.warning("backups %s not ready within %.1fs: going active without them",
                        ", ".join(sorted(self.expected)), self.ha.config.backup_timeout)
            for guard in self.expected.values():
                guard.release()
            self.expected.clear()
            self._go_active()

    def _go_active(self) -> None:
        self.state = ACTIVE
        log.info("primary %s is active (epoch %d)", self.broker.name, self.ha.epoch.epoch)

    def forget(self, backup: RemoteBackup) -> None:
        if self.backups.get(backup.name) is backup:
            del self.backups[backup.name]
            backup.release_pending()
            for sub in list(backup.subscriptions.values()):
                sub.close()
            self.membership_changed()

    def _check_backups(self) -> None:
        timeout = self.ha.config.backup_timeout
        for backup in list(self.backups.values()):
            if backup.overdue(timeout):
                backup.counters.timeout_drops += 1
                backup.drop(f"no confirmation within {timeout:g}s")

    # -- the backups' links ----------------------------------------------------------------------
    def _backup_for(self, link: Link, wiring: bool, props: dict[str, Any] | None = None) -> RemoteBackup:
        """`props`: the link's properties, if the caller has them (decoded from proton's data at each read: at
        10,000 queue links a second read was 7 % of a new primary's CPU while its backups re-subscribed)."""
        props = link.properties if props is None else props
        name = str(props.get(protocol.BROKER) or link.remote_container)
        their_epoch = int(props.get(protocol.EPOCH) or 0)
        if their_epoch > self.ha.epoch.epoch:
            self.ha.fence(f"backup {name} has seen epoch {their_epoch}, this primary has {self.ha.epoch.epoch}")
            raise BrokerError(NOT_ALLOWED, "this primary is stale (a newer epoch exists)")
        backup = self.backups.get(name)
        if wiring and backup is not None and backup.connection is not link.conn:
            backup.drop("reconnected")  # the same backup again: its old links are stale
            backup = None
        if backup is None:
            if not wiring:
                raise BrokerError(NOT_FOUND, f"backup {name} must attach {protocol.WIRING} first")
            build = versions.announced(link.conn.remote_properties, name)
            refusal = versions.refusal(build, self.ha.build, self.ha.features.enabled, "primary")
            if refusal is not None:  # it could not read what this cluster writes
                self.ha.protocol_refused(name, refusal)
                raise BrokerError(NOT_ALLOWED, refusal)
            self.ha.protocol_refusals.pop(name, None)
            backup = RemoteBackup(self, name)
            backup.connection = link.conn
            backup.build = build
            backup.protocol = versions.agreed(self.ha.build, build) or 0
            self.backups[name] = backup
            log.info("backup %s connected from %s", name, link.conn.peer)
        return backup

    def report_endpoint(self, link: Link) -> "BackupReports":
        return BackupReports(self._backup_for(link, wiring=False))

    def wiring_endpoint(self, link: Link) -> WiringSubscription:
        backup = self._backup_for(link, wiring=True)
        backup.wiring = WiringSubscription(backup, link)
        if not self.ask_first.standing:
            policy = self.ha.policy
            self.ask_first.stand_on([q for q in self.broker.registry.queues() if policy.replicates_messages(q)])
        self.ask_first.asked.clear()  # a queue a publish waits on, this backup is asked for too
        for queue in self._waiting_queues():
            self._ask_first(queue)
        backup.changed()
        self.membership_changed()
        return backup.wiring

    def queue_endpoint(self, link: Link) -> ReplicatingSubscription:
        props = link.properties
        backup = self._backup_for(link, wiring=False, props=props)
        queue = self._replicated_queue(link, protocol.QUEUE)
        name = queue.name
        if link_refused(name):  # a test hook (test_hooks.py)
            raise BrokerError(RESOURCE_LIMIT, f"queue '{name}' refused by a test hook")
        have = protocol.unflatten(list(props.get(protocol.HAVE) or []))
        if props.get(protocol.UID) != queue.uid:
            have = []  # the backup holds another queue of that name: it gets everything
        old = backup.subscriptions.get(name)
        if old is not None:
            old.close()
        sub = ReplicatingSubscription(backup, link, queue, have)
        backup.subscriptions[name] = sub
        return sub

    def adopt_endpoint(self, link: Link) -> Taker:
        backup = self._backup_for(link, wiring=False)
        queue = self._replicated_queue(link, protocol.ADOPT)
        if link.properties.get(protocol.UID) != queue.uid:  # the backup held another queue of that name
            raise BrokerError(NOT_FOUND, f"no queue '{queue.name}' replicated with its messages")
        return Taker(self.adoptions, backup.name, queue, link)

    def _replicated_queue(self, link: Link, prefix: str) -> Queue:
        """The queue a `<prefix>/<name>` link is for, if its messages are replicated."""
        name = (link.address or "")[len(prefix) + 1:]
        queue = self.broker.registry.lookup(name)
        if not isinstance(queue, Queue) or not self.ha.policy.replicates_messages(queue):
            raise BrokerError(NOT_FOUND, f"no queue '{name}' replicated with its messages")
        return queue

    def confirming(self) -> bool:
        """Can a publish be confirmed now (enough brokers hold new messages, and no coordinator holds them)?"""
        return not self.short and not (self.quorums is not None and self.quorums.suspended)

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        status: dict[str, Any] = {
            "sync": self.ha.config.sync,
            "backups": [{"name": b.name, "state": b.state,
                         "release": b.build.release if b.build else None, "protocol": b.protocol, "lag": b.lag, "lag_seconds": round(b.lag_seconds(now), 3),
                         "catchup": b.catchup_progress(), "unconfirmed": b.unconfirmed,
                         "timeout_drops": b.counters.timeout_drops,
                         "confirms_from": "disk" if from_disk(self.ha.config.sync) else "memory",
                         "memory": b.report.get("memory"), "disk": b.report.get("disk"),
                         "reported_seconds_ago": round(now - b.reported, 1) if b.reported else None}
                        for b in self.backups.values()],
            "expected": sorted(self.expected),
            "min_confirmations": self.needed, "holders": self.holders(), "confirming": self.confirming(),
            "adopted": self.adoptions.total}
        if self.quorums is not None:
            status["quorum"] = self.quorums.status()
        return status
