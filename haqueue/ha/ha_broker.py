"""HaBroker: plugs HA into a broker through the core's named hooks and owns the role.

A broker starts as a backup. `promote` (from an admin, the local supervisor, Pacemaker or the
ZooKeeper coordinator) makes it primary: it raises the epoch, stops following, starts serving
backups and binds the public address. A primary never demotes in place: when fenced it restarts
as a backup.
"""
from __future__ import annotations

import logging
import os
import ssl
import sys
from typing import Any, Callable

from ..admin import ADMIN_TOOL
from ..broker.access import ADMIN, Permissions
from ..broker.connection import Connection
from ..broker.errors import BrokerError, CONNECTION_FORCED, CONNECTION_REDIRECT, NOT_ALLOWED, UNAUTHORIZED
from ..broker.proton_adapter import Link, LinkHandler
from ..broker.queue import Queue
from ..broker.server import Broker
from ..broker.tls import client_context, server_context
from ..config import AllowConfig, HaConfig, ListenerConfig
from . import protocol, test_hooks, versions
from .backup import Backup
from .features import SUPPORTED, FeatureFlags
from .policy import Policy
from .primary import Primary
from .promotion import PromotionRequests
from .upgrades import Upgrades
from .role import ACTIVE, BACKUP, JOINING, PRIMARY, READY, RECOVERING, RESTARTED_ENV, WAS_PRIMARY, EpochStore

log = logging.getLogger("haqueue.ha")

# The peer user (ha.username) opens HA links and runs admin operations (the supervisor and the OCF agent
# use it); it may not send, receive or manage queues.
PEER_PERMISSIONS = Permissions(AllowConfig(admin=True))


class HaBroker:
    def __init__(self, broker: Broker, config: HaConfig) -> None:
        self.broker = broker
        self.config = config
        self.policy = Policy(config.replicate)
        self.epoch = EpochStore(broker.config.data_dir)
        self.features = FeatureFlags(broker.config.data_dir)
        self.build = versions.own(broker.name, frozenset(SUPPORTED))
        # Peers refused for a replication protocol this broker does not share (name -> why), until they share one.
        self.protocol_refusals: dict[str, str] = {}
        self._refusals_logged: dict[str, str] = {}  # the last refusal logged per peer: each is logged once
        self.config_address = next((l for l in broker.config.listen if (l.host, l.port) in config.brokers), None)
        self.primary: Primary | None = None
        # Called on a backup with (queue, kind, seq, primary enqueue time in µs, message bytes) for each
        # message applied: ENQUEUE and CATCHUP as received, DEQUEUE once per message removed, DIVERGED once
        # per message kept aside (the audit log).
        self.replication_hooks: list[Callable[[Queue, bytes, int, int, bytes], None]] = []
        # Called just before the epoch, the role or the backups ready for a queue change (the audit log
        # writes what it buffered under the old ones); promotion hooks once this broker is the primary.
        self.context_hooks: list[Callable[[], None]] = []
        self.promotion_hooks: list[Callable[[], None]] = []
        self.public_listener_bound = False
        # Listeners (host, port) on which a backup admits clients too, for a plug-in that serves them
        # elsewhere (the shard relay on a node's client address).
        self.client_listeners: set[tuple[str, int]] = set()
        self.failovers_seen = 0  # the epoch rose from one a primary held to a newer one, since this process started
        self.status_hooks: list[Callable[[dict[str, Any]], None]] = []  # a coordinator adds its fields
        # Called after a graceful shutdown, just before re-executing as a backup (a coordinator ends its session,
        # so the others need not wait for it to expire).
        self.restart_hooks: list[Callable[[], None]] = []
        broker.access.add_user(config.username, config.password, PEER_PERMISSIONS)
        broker.engine.connection_limits.exempt_users.add(config.username)  # peers: no client limit applies
        # ha.tls: the peer listener (this broker's address in ha.brokers) takes only peers with a certificate
        # from ha.tls.ca_file, and this broker connects to its peers with its own (design/security.md).
        self.peer_tls: ssl.SSLContext | None = None
        self.client_tls: ssl.SSLContext | None = None
        if config.tls is not None:
            assert self.config_address is not None  # the config checked that a listener is in ha.brokers
            self.peer_tls = server_context(config.tls, True, "ha.tls")
            self.client_tls = client_context(config.tls, "ha.tls")
            broker.listener_tls[(self.config_address.host, self.config_address.port)] = self.peer_tls
        broker.registry.validators.append(self.policy.validate)
        broker.admission.append(self.admit)
        broker.endpoints[protocol.WIRING] = self._endpoint(lambda p, link: p.wiring_endpoint(link))
        broker.endpoints[protocol.QUEUE] = self._endpoint(lambda p, link: p.queue_endpoint(link))
        broker.endpoints[protocol.REPORT] = self._endpoint(lambda p, link: p.report_endpoint(link))
        broker.endpoints[protocol.ADOPT] = self._endpoint(lambda p, link: p.adopt_endpoint(link))
        broker.status_hooks.append(self._broker_status)
        broker.management.register("ha", "READ", lambda name, body: (200, self.status()))
        self.backup = Backup(self)
        Upgrades(self)
        if config.coordinator == "external":
            PromotionRequests(self)  # else the coordinator answers them (coord/zookeeper.py)
        test_hooks.warn_if_set()

    @property
    def role(self) -> str:
        return PRIMARY if self.primary is not None else BACKUP

    @property
    def state(self) -> str:
        return self.primary.state if self.primary is not None else self.backup.state

    def is_peer(self, conn: Connection) -> bool:
        """Logged in as the ha user, and with ha.tls, through the peer listener (so with a certificate from its CA)."""
        if conn.user != self.config.username:
            return False
        return self.peer_tls is None or (conn.listener is not None and conn.listener.tls_context is self.peer_tls)

    # -- admission and the HA links ------------------------------------------------------------
    def admit(self, conn: Connection) -> None:
        if self.is_peer(conn):  # tell a peer where this broker stands: it decides if the cluster is new
            conn.set_properties({protocol.EPOCH: self.epoch.epoch, protocol.HAD_PRIMARY: self.epoch.had_primary,
                                 protocol.ROLE: self.role, protocol.STATE: self.state,
                                 protocol.FRESHNESS: list(self.freshness()),
                                 protocol.CLIENT_ADDRESS: self._client_address(),
                                 **versions.announcement(self.build)})
            if not conn.remote_properties.get(ADMIN_TOOL):  # a broker, which may follow this one
                self._check_protocol(versions.announced(conn.remote_properties, conn.remote_container))
            return
        if self.primary is None:
            if self._admin_tool(conn):
                log.debug("admitted admin tool %s (%s, user %s) on this backup", conn.peer, conn.remote_container,
                          conn.user)
                return
            listener = conn.listener.options if conn.listener is not None else None
            if listener is not None and (listener.host, listener.port) in self.client_listeners:
                return
            raise self._refusal(conn)

    def _check_protocol(self, peer: versions.Build) -> None:
        """Refuse a peer with which this broker shares no replication protocol, naming the one to upgrade. (The
        features enabled in the cluster are checked when a backup attaches $ha.wiring, to follow: a shard's
        relay connects as the peer user too, and follows nothing.)"""
        reason = versions.refusal(peer, self.build, frozenset(), self.role)
        if reason is None:
            self.protocol_refusals.pop(peer.name, None)
            return
        self.protocol_refused(peer.name, reason)
        raise BrokerError(NOT_ALLOWED, reason)

    def protocol_refused(self, peer: str, reason: str) -> None:
        """A peer refused, or refusing this broker, for its protocols or features: logged when it is news."""
        if self._refusals_logged.get(peer) != reason:
            log.error("%s", reason)
            self._refusals_logged[peer] = reason
        self.protocol_refusals[peer] = reason

    def _refusal(self, conn: Connection) -> BrokerError:
        """How a client on this backup is sent away: with the client address of the primary it follows in the
        condition's info (network-host, port), where that primary named one; as amqp:connection:redirect under
        ha.client_redirect, else as amqp:connection:forced, the one condition after which the stock clients'
        reconnect goes on to their next address (design/replication.md)."""
        primary, address = self.backup.primary, self.backup.primary_client
        if primary is None or address is None:
            log.info("refused client %s (%s): this broker is a backup", conn.peer, conn.remote_container)
            return BrokerError(CONNECTION_FORCED, f"{self.broker.name} is a backup; connect to the primary")
        host, port = address
        condition = CONNECTION_REDIRECT if self.config.client_redirect else CONNECTION_FORCED
        log.info("refused client %s (%s) with %s: the primary %s serves clients at %s:%d", conn.peer,
                 conn.remote_container, condition, primary, host, port)
        return BrokerError(condition, f"{self.broker.name} is a backup; the primary {primary} serves clients "
                                      f"at {host}:{port}", {"network-host": host, "port": port})

    def _client_address(self) -> str:
        """Where this broker serves clients as primary, for its backups' redirects: ha.public; else its address in
        ha.brokers (clients that list every broker use it) unless ha.tls keeps that listener for peers, then its
        first other listener; "" if it has none."""
        if self.config.public is not None:
            return "%s:%d" % self.config.public
        own = self.config_address
        if own is None:
            return ""
        if self.peer_tls is None:
            return f"{own.host}:{own.port}"
        other = next((l for l in self.broker.config.listen if l is not own), None)
        if other is None:
            return ""
        return f"{own.host if other.host in ('', '0.0.0.0', '::') else other.host}:{other.port}"

    def _admin_tool(self, conn: Connection) -> bool:
        """A connection that says it is an admin tool (haqueue.admin.AdminClient does), whose user may run admin
        operations: a backup lets it in, as Qpid's backups do a connection marked `qpid.ha-admin`. A client that
        does not say so is refused, so a failover-capable client moves on at once. Under ha.tls the ha user
        is one only through the peer listener: its password alone admits nothing."""
        if conn.user == self.config.username and not self.is_peer(conn):
            return False
        return bool(conn.remote_properties.get(ADMIN_TOOL)) and self.broker.access.may(conn.user, ADMIN)

    def _endpoint(self, attach: Any) -> Any:
        def endpoint(link: Link) -> LinkHandler:
            if not self.is_peer(link.conn):
                raise BrokerError(UNAUTHORIZED, f"{link.address} is for HA peers (user {link.conn.user} is not)")
            if self.primary is None:
                raise BrokerError(NOT_ALLOWED, f"{self.broker.name} is not the primary (backup, {self.state})")
            return attach(self.primary, link)
        return endpoint

    # -- promotion ------------------------------------------------------------------------------
    def promote(self, force: bool = False, epoch: int | None = None) -> dict[str, Any]:
        """`epoch`: one a coordinator has already claimed (ZooKeeper's compare-and-set); by default the
        highest seen plus one."""
        if self.primary is not None:
            return self.status()
        self.backup.judge_ready()  # a judgement due at the end of this pass: made now
        if self.backup.state != READY and not force:
            reason = self.promotion_refusal()
            if reason:
                raise BrokerError(NOT_ALLOWED, f"{self.broker.name} cannot be promoted: still catching up "
                                               f"(state {self.backup.state}; {reason}); promote a ready backup, "
                                               f"or use --force")
        expected = {name for name, state in self.backup.members.items()
                    if state == READY and name != self.broker.name}
        if not self.epoch.had_primary and not self.features.known:
            self.features.set(SUPPORTED)  # a brand-new cluster starts with every feature this build has
        self.backup.stop()
        # Above every epoch seen, ours or a peer's, so no two primaries ever share one.
        self.hold_epoch(max(self.epoch.epoch, self.backup.max_peer_epoch) + 1 if epoch is None else epoch)
        inherited = {queue: queue.next_seq for queue in self.broker.registry.queues()}  # the Primary moves them on
        self.epoch.stand(WAS_PRIMARY)
        self.epoch.lead()
        self.primary = Primary(self, expected, inherited)
        log.info("%s promoted to primary, epoch %d", self.broker.name, self.epoch.epoch)
        for hook in self.promotion_hooks:
            hook()
        self._bind_public()
        return self.status()

    def raise_epoch(self, epoch: int) -> None:
        """This broker has seen `epoch` (persisted); a newer one than it had changes its context."""
        if epoch > self.epoch.epoch:
            if self.epoch.had_primary:  # not a brand-new cluster's first primary
                self.failovers_seen += 1
            self.context_changing()
        self.epoch.raise_to(epoch)

    def hold_epoch(self, epoch: int) -> None:
        """This broker follows, or is, the primary of `epoch` (persisted)."""
        self.raise_epoch(epoch)
        self.epoch.hold(epoch)

    def suspend_confirmations(self, reason: str) -> None:
        """A coordinator's word: this primary may no longer be the elected one (design/zookeeper.md)."""
        if self.primary is not None:
            self.primary.suspend(reason)

    def resume_confirmations(self) -> None:
        if self.primary is not None:
            self.primary.resume()

    def context_changing(self) -> None:
        for hook in self.context_hooks:
            hook()

    def ready_backups(self, queue: Queue) -> tuple[str, ...]:
        """The backups whose replication of `queue` has caught up (none on a backup)."""
        return self.primary.ready_backups(queue) if self.primary is not None else ()

    def freshness(self) -> tuple[int, int, int]:
        """How complete this broker's store is, to compare with its peers' after a total outage:
        (the latest epoch it held, standing in it, stream), where stream sums the replicated queues' next seqs
        (design/store.md)."""
        stream = sum(q.next_seq - 1 for q in self.broker.registry.queues() if self.policy.replicates_messages(q))
        return self.epoch.held, self.epoch.standing, stream

    def promotion_refusal(self) -> str | None:
        """Why this backup, not ready, may not be promoted; None if it may: in a brand-new cluster, or when no
        peer is ready (the primary is gone and what it confirmed is in some store: a total outage, or a primary
        lost while its backups were catching up) and no reachable peer's store is fresher."""
        backup = self.backup
        if backup.state != JOINING:
            return "it has followed a primary since it started"
        if not backup.tried_every_peer:
            return "it has not reached every peer yet"
        if not self.epoch.had_primary and not backup.peers_with_history:
            return None  # a brand-new cluster
        serving = sorted(f"{peer} ({state})" for peer, state in backup.peer_states.items()
                         if state in (READY, ACTIVE, RECOVERING))
        if serving:  # a primary, or a ready backup that holds every confirmed message: the one to promote
            return f"{', '.join(serving)} is primary or a ready backup"
        own = self.freshness()
        fresher = sorted(peer for peer, theirs in backup.peer_freshness.items() if theirs > own)
        if fresher:
            return f"{', '.join(fresher)} has a fresher store (freshness {list(backup.peer_freshness[fresher[0]])} " \
                   f"> {list(own)})"
        return None

    def _bind_public(self) -> None:
        """Bind the clients' address; while a hung old primary still holds it, keep trying."""
        if self.config.public is None or self.public_listener_bound:
            return
        host, port = self.config.public
        try:
            self.broker.listen(ListenerConfig(host, port, max_frame_size=self.broker.config.limits.max_frame_size))
        except OSError as e:
            log.warning("%s; retrying", e)
            self.broker.engine.call_later(0.2, self._bind_public)
            return
        self.public_listener_bound = True

    def fence(self, reason: str, at_once: bool = False) -> None:
        """A newer primary exists: stop serving at once and start again as a backup. `at_once`
        re-executes now, dropping what is not yet written: a primary whose ZooKeeper lease has run out
        must not send a single settlement more (design/zookeeper.md)."""
        log.error("%s fenced: %s; restarting as a backup", self.broker.name, reason)
        if at_once:
            self._exec()
        self.broker.engine.call_later(0, self._restart)

    def resign(self, reason: str) -> None:
        """Step down cleanly (a coordinator's failback to the preferred primary): close every connection,
        write what is pending, then restart as a backup."""
        log.warning("%s resigns: %s; restarting as a backup", self.broker.name, reason)
        self.broker.engine.call_later(0, self._restart)

    def _restart(self) -> None:
        self.broker.engine.shutdown()
        for hook in self.restart_hooks:
            hook()
        self._exec()

    @staticmethod
    def _exec() -> None:
        os.environ[RESTARTED_ENV] = "1"
        os.execv(sys.executable, [sys.executable, "-m", "haqueue", *sys.argv[1:]])

    # -- status ---------------------------------------------------------------------------------
    def _broker_status(self, status: dict[str, Any]) -> None:
        status["role"], status["state"] = self.role, self.state
        status["protocols"] = [self.build.oldest, self.build.newest]

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = {"name": self.broker.name, "role": self.role, "state": self.state,
                                  "epoch": self.epoch.epoch, "freshness": list(self.freshness()),
                                  "coordinator": self.config.coordinator,
                                  "brokers": [f"{h}:{p}" for h, p in self.config.brokers],
                                  "public": f"{self.config.public[0]}:{self.config.public[1]}"
                                  if self.config.public else None,
                                  "diverged": self.backup.quarantine.status(), **self.build.describe(),
                                  "protocol_refusals": dict(self.protocol_refusals)}
        if self.primary is not None:
            status.update(self.primary.status())
        else:
            status.update(self.backup.status())
            if self.backup.state != READY:
                refusal = self.promotion_refusal()
                status["promotable"] = refusal is None
                if refusal is not None:  # what stands in the way, and what overrides it
                    where = self.config_address
                    address = f" -b {where.host}:{where.port}" if where is not None else ""
                    status["promotion_refused"] = f"{refusal}; `haqueue admin{address} ha promote --force` " \
                                                  f"promotes it anyway, losing what it lacks"
        for hook in self.status_hooks:
            hook(status)
        return status
