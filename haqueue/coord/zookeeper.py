"""ZooKeeperCoordinator: the brokers elect their primary through ZooKeeper (kazoo); a primary that
cannot prove it still holds the election stops serving. The protocol is in design/zookeeper.md.

Under `ha.zookeeper.path`:
  members/<name>  ephemeral, one per broker: its role, state, applied, epoch, freshness, weight, preferred (JSON)
  epoch           the cluster epoch, raised by compare-and-set on the znode's version
  primary         ephemeral, created in one transaction with the epoch's raise: who won

Threads: the broker's loop owns every broker object; `_Worker` (one thread) does every ZooKeeper
call, blocking; kazoo's own threads only wake the worker or hand work to the loop through
`engine.call_soon_threadsafe`. The loop side fences: it holds a lease (until when the primary node
is known to be ours) and re-executes as a backup the moment the lease runs out.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NoNodeError, NodeExistsError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.watchers import DataWatch
from kazoo.retry import KazooRetry

from ..broker.errors import BrokerError, NOT_ALLOWED
from ..ha.role import BACKUP, JOINING, PRIMARY, READY, RESTARTED_ENV

if TYPE_CHECKING:
    from ..ha.ha_broker import HaBroker

log = logging.getLogger("haqueue.coord.zookeeper")

STATE_INTERVAL = 0.2  # seconds between looks at the broker's state (published when it changes)
LEASE_CHECK = 0.1  # seconds between lease checks on the loop (a SIGCONT checks at once too)
LEASE_FRACTION = 0.6  # of the session timeout; the rest is the margin before the session can expire
CONTEND_STEP = 0.5  # seconds the k-th ranked candidate waits (k times) for better ones to win
START_TIMEOUT_MIN = 5.0  # seconds to reach ZooKeeper at start before giving up


class ZooKeeperUnusable(OSError):
    """ZooKeeper cannot be reached or the cluster path cannot be used; an OSError so that the broker
    reports it as "cannot start" and exits."""


def _json(data: bytes | None) -> dict[str, Any]:
    try:
        value = json.loads(data or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def freshness(member: dict[str, Any]) -> tuple[int, ...]:
    """How complete a member's store is (design/store.md); a member that does not say: its epoch alone."""
    return tuple(int(x) for x in member.get("freshness") or (member.get("epoch", 0),))


def restarting(members: dict[str, dict[str, Any]], zk_epoch: int) -> bool:
    """Every member is joining (none primary, ready or catching up) in a cluster that has had a primary:
    it is coming back after a total outage."""
    return bool(members) and all(m.get("state") == JOINING for m in members.values()) and \
        (zk_epoch > 0 or any(m.get("had_primary") for m in members.values()))


def ready_backups(members: dict[str, dict[str, Any]]) -> list[str]:
    return [n for n, m in members.items() if m.get("role") == BACKUP and m.get("state") == READY]


def rank(members: dict[str, dict[str, Any]], zk_epoch: int) -> list[str]:
    """The candidates best first: ready backups, the preferred first (under sync all every ready backup
    holds every confirmed message: they are equally eligible), then by applied, then weight ("latest update
    wins"); in a brand-new cluster (no election yet, no member has had a primary) every joining member;
    after a total outage the joining members with the freshest store: none with a fresher one present.
    Among joining members: the preferred first, then by weight."""
    def preferred(n: str) -> bool:
        return bool(members[n].get("preferred"))

    ready = ready_backups(members)
    if ready:
        return sorted(ready, key=lambda n: (not preferred(n), -int(members[n].get("applied", 0)),
                                            -int(members[n].get("weight", 0)), n))
    if not members or any(m.get("state") != JOINING for m in members.values()):
        return []
    if restarting(members, zk_epoch):
        best = max(freshness(m) for m in members.values())
        members = {n: m for n, m in members.items() if freshness(m) == best}
    return sorted(members, key=lambda n: (not preferred(n), -int(members[n].get("weight", 0)), n))


class ZooKeeperCoordinator:
    def __init__(self, ha: "HaBroker") -> None:
        config = ha.config.zookeeper
        assert config is not None
        self.ha = ha
        self.engine = ha.broker.engine
        self.name = ha.broker.name
        self.config = config
        self.lease_until = 0.0  # monotonic; meaningful while primary
        self.forced = False  # an admin's `ha promote --force`: contend even if not ready
        self.worker = _Worker(self)
        self._publish_state()
        self.worker.start()  # raises ZooKeeperUnusable: the broker does not start
        atexit.register(self.worker.close)  # a broker stopped cleanly leaves the cluster at once
        ha.status_hooks.append(self._status)
        ha.restart_hooks.append(self.worker.close)  # a resigning or fenced primary's znodes go at once
        ha.broker.management.register("ha", "PROMOTE", self._admin_promote)
        self.engine.every(LEASE_CHECK, self.check_lease)
        self.engine.every(STATE_INTERVAL, self._publish_state)
        # A stopped process learns of it on SIGCONT, before its loop reads what piled up meanwhile.
        signal.signal(signal.SIGCONT, lambda *_: self.check_lease())

    # -- on the loop ------------------------------------------------------------------------------
    def member_data(self) -> dict[str, Any]:
        ha = self.ha
        address = ha.config_address
        return {"name": self.name, "role": ha.role, "state": ha.state, "applied": ha.backup.applied,
                "epoch": ha.epoch.epoch, "had_primary": ha.epoch.had_primary, "freshness": list(ha.freshness()),
                "eligible": self.eligible(), "weight": self.config.weight, "preferred": self.config.preferred,
                "address": f"{address.host}:{address.port}" if address else None, "forced": self.forced}

    def eligible(self) -> bool:
        """May this backup serve if elected: forced, ready, or one the promotion rule accepts (a brand-new
        cluster, or the freshest store after a total outage). A candidate contends only while it is, so a
        win is rarely resigned (a resignation raises the cluster epoch, which the others only note: their
        freshness stays what their stores hold)."""
        ha = self.ha
        return self.forced or ha.backup.state == READY or ha.promotion_refusal() is None

    def _publish_state(self) -> None:
        self.worker.publish(self.member_data())

    def check_lease(self) -> None:
        if self.ha.role == PRIMARY and time.monotonic() >= self.lease_until:
            self.fence(f"no proof from ZooKeeper for {self.worker.timeout * LEASE_FRACTION:.1f}s "
                       f"that this broker is still the elected primary")

    def fence(self, reason: str) -> None:
        if self.ha.role == PRIMARY:
            self.ha.fence(reason, at_once=True)

    def renewed(self, sent: float, timeout: float) -> None:
        """The primary node was ours when a request sent at `sent` reached ZooKeeper: the session
        cannot expire before sent + timeout."""
        self.lease_until = max(self.lease_until, sent + timeout * LEASE_FRACTION)

    def won(self, epoch: int, sent: float, timeout: float) -> None:
        ha = self.ha
        if ha.role == PRIMARY or not self.eligible() or ha.epoch.epoch > epoch:
            log.warning("won the election at epoch %d but cannot serve (%s, %s, epoch %d): resigning",
                        epoch, ha.role, ha.state, ha.epoch.epoch)
            self.worker.resign()
            return
        self.renewed(sent, timeout)
        log.info("%s won the ZooKeeper election: epoch %d", self.name, epoch)
        try:
            ha.promote(force=True, epoch=epoch)
        except OSError as e:  # the public address: still the primary on its own listeners
            log.error("promoted, but %s", e)
        self.forced = False
        self._publish_state()

    def fail_back(self, preferred: str) -> None:
        """Preferred-primary re-election (Kafka's): the preferred member has been ready for failback_delay;
        resigning ends this session (deleting the primary node) so that it wins the next election."""
        if self.ha.role == PRIMARY:
            self.ha.resign(f"the preferred primary {preferred} has been ready for {self.config.failback_delay:g}s")

    def epoch_seen(self, epoch: int) -> None:
        """The cluster epoch in ZooKeeper: a primary behind it is a zombie; a backup refuses primaries behind it."""
        ha = self.ha
        if epoch <= ha.epoch.epoch or epoch == self.worker.claiming:
            return
        if ha.role == PRIMARY:
            self.fence(f"ZooKeeper's epoch is {epoch}, this primary's {ha.epoch.epoch}")
        else:
            ha.raise_epoch(epoch)

    def _admin_promote(self, name: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        if self.ha.role == PRIMARY:
            return 200, self.ha.status()
        if not body.get("force"):
            raise BrokerError(NOT_ALLOWED, f"{self.name}: the primary is elected through ZooKeeper (a ready "
                                           f"backup wins); --force makes this broker a candidate when none is ready")
        if self.worker.primary_name is not None:
            raise BrokerError(NOT_ALLOWED, f"{self.name}: {self.worker.primary_name} is the elected primary")
        self.forced = True
        log.warning("%s: forced candidate (ha promote --force)", self.name)
        self._publish_state()
        return 200, self.ha.status()

    def _status(self, status: dict[str, Any]) -> None:
        worker = self.worker
        status["zookeeper"] = {"hosts": worker.hosts, "path": self.config.path, "session": worker.session_state,
                               "session_timeout": worker.timeout, "primary": worker.primary_name,
                               "zk_epoch": worker.zk_epoch, "members": worker.members,
                               "preferred": self.config.preferred, "failback_delay": self.config.failback_delay,
                               "lease_left": round(self.lease_until - time.monotonic(), 3)
                               if self.ha.role == PRIMARY else None}

    def call(self, fn: Callable[[], None]) -> None:
        """Run fn on the broker's loop (from the worker or kazoo's threads)."""
        self.engine.call_soon_threadsafe(fn)


class _Worker:
    """Every ZooKeeper call, on one thread of its own: keeps the member node, elects, renews the lease."""

    def __init__(self, coordinator: ZooKeeperCoordinator) -> None:
        config = coordinator.config
        self.coordinator = coordinator
        self.name = coordinator.name
        self.hosts = ",".join(f"{h}:{p}" for h, p in config.hosts)
        self.path = config.path.rstrip("/")
        self.cluster_size = len(coordinator.ha.config.brokers)
        self.recovery_wait = coordinator.ha.config.recovery_wait
        self.member_path = f"{self.path}/members/{self.name}"
        self.epoch_path, self.primary_path = f"{self.path}/epoch", f"{self.path}/primary"
        self.timeout = config.session_timeout  # replaced by what ZooKeeper grants
        retry = KazooRetry(max_tries=-1, delay=0.1, backoff=1.5, max_delay=1.0, max_jitter=0.1)
        self.client = KazooClient(hosts=self.hosts, timeout=config.session_timeout, connection_retry=retry)
        self._learn_granted_timeout()
        self.client.add_listener(self._state_changed)
        self.session_state = "connecting"
        self.members: dict[str, dict[str, Any]] = {}  # as last read, for status and the election
        self.primary_name: str | None = None
        self.zk_epoch = 0
        self._wake = threading.Event()
        self._desired: dict[str, Any] = {}
        self._published: dict[str, Any] | None = None
        self._session: int | None = None  # the session our member node belongs to
        self._leader_session: int | None = None  # set while we hold the primary node
        self._resign = False
        self._no_primary_since: float | None = None
        self._preferred_ready_since: float | None = None  # while primary: since when a preferred member is ready
        self._failing_back = False
        # The epoch our transaction is raising ZooKeeper's to: its own watch event must not count as
        # news of another primary (it would mark a brand-new winner as having had one, and it resigns).
        self.claiming: int | None = None
        self._thread = threading.Thread(target=self._run, name="zookeeper", daemon=True)

    def _learn_granted_timeout(self) -> None:
        """ZooKeeper may grant a shorter session timeout than asked (maxSessionTimeout); the lease must
        use the granted one. kazoo keeps it private: read it where kazoo's connection computes it."""
        connection = self.client._connection
        connect = connection._connect

        def granted(*args: Any) -> Any:
            read_timeout, connect_timeout = connect(*args)
            self.timeout = read_timeout * 1.5 / 1000.0  # kazoo's read timeout is 2/3 of the granted one
            return read_timeout, connect_timeout
        connection._connect = granted

    # -- start: fail clearly rather than hang ----------------------------------------------------
    def start(self) -> None:
        wait = max(START_TIMEOUT_MIN, 2 * self.coordinator.config.session_timeout)
        while True:
            try:
                self.client.start(timeout=wait)
                break
            except KazooTimeoutError:
                if not os.environ.get(RESTARTED_ENV):
                    raise ZooKeeperUnusable(f"ZooKeeper not reachable at {self.hosts} within {wait:g}s "
                                            f"(ha.zookeeper.hosts)") from None
                # Fenced or resigned under a partition: exiting would leave the node without a broker.
                log.warning("ZooKeeper not reachable at %s within %gs; this broker restarted as a backup and "
                            "keeps trying", self.hosts, wait)
        try:
            self.client.ensure_path(f"{self.path}/members")
            try:
                self.client.create(self.epoch_path, b"0")
            except NodeExistsError:
                pass
            self._read_epoch()
        except (KazooException, ValueError) as e:
            self.client.stop()
            self.client.close()
            raise ZooKeeperUnusable(f"ZooKeeper path {self.path} (ha.zookeeper.path) cannot be used: "
                                    f"{type(e).__name__} {e}".strip()) from None
        if self.timeout < self.coordinator.config.session_timeout:
            log.warning("ZooKeeper granted a %.1fs session timeout (%.1fs asked): fencing follows it",
                        self.timeout, self.coordinator.config.session_timeout)
        DataWatch(self.client, self.primary_path, self._primary_changed)
        DataWatch(self.client, self.epoch_path, self._epoch_changed)
        self._thread.start()
        log.info("ZooKeeper %s, cluster path %s, session timeout %.1fs", self.hosts, self.path, self.timeout)

    def close(self, wait: float = 2.0) -> None:
        """End the session, deleting our ephemeral nodes now rather than when it expires; bounded,
        as ZooKeeper may be unreachable."""
        closer = threading.Thread(target=lambda: (self.client.stop(), self.client.close()), daemon=True)
        closer.start()
        closer.join(wait)

    def _read_epoch(self) -> tuple[int, Any]:
        data, stat = self.client.get(self.epoch_path)
        try:
            self.zk_epoch = int(data)
        except ValueError:
            raise ValueError(f"{self.epoch_path} holds {data[:40]!r}, not an epoch: another application's path?")
        return self.zk_epoch, stat

    # -- from the loop and kazoo's threads ---------------------------------------------------------
    def publish(self, data: dict[str, Any]) -> None:
        if data != self._desired:
            self._desired = data
            self._wake.set()

    def resign(self) -> None:
        self._resign = True
        self._wake.set()

    def _state_changed(self, state: str) -> None:
        """kazoo's connection thread: must not block."""
        self.session_state = state.lower()
        ha = self.coordinator.ha
        if state == KazooState.LOST:
            self.coordinator.call(lambda: self.coordinator.fence("ZooKeeper session lost"))
        elif state == KazooState.SUSPENDED:  # at once, not when the lease runs out: a partition may be under way
            self.coordinator.call(lambda: ha.suspend_confirmations("the ZooKeeper session is suspended"))
        else:
            self.coordinator.call(ha.resume_confirmations)
        self._wake.set()

    def _primary_changed(self, data: bytes | None, stat: Any, event: Any = None) -> None:
        self.primary_name = _json(data).get("name") if stat is not None else None
        self._wake.set()

    def _epoch_changed(self, data: bytes | None, stat: Any, event: Any = None) -> None:
        try:
            epoch = int(data or b"0")
        except ValueError:
            return
        self.zk_epoch = epoch
        self.coordinator.call(lambda: self.coordinator.epoch_seen(epoch))

    # -- the worker's loop --------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait(min(0.5, self.timeout / 8))
            self._wake.clear()
            try:
                self._step()
            except KazooException as e:  # connection loss and the like: the next step tries again
                log.debug("ZooKeeper step: %r", e)
            except Exception:
                log.exception("ZooKeeper coordinator step failed")

    def _step(self) -> None:
        client = self.client
        if client.state != KazooState.CONNECTED:
            return
        session = client.client_id[0] if client.client_id else None
        if session != self._session:
            self._register(session)
        desired = self._desired
        if desired != self._published:
            client.set(self.member_path, json.dumps(desired).encode())
            self._published = desired
        self._read_members()
        if self._leader_session is not None:
            self._renew()
            self._fail_back_when_due()
        elif self._primary_owner() is None:
            self._elect()
        else:
            self._no_primary_since = None

    def _register(self, session: int | None) -> None:
        """A member node in this session; one of our name left by an earlier session is ours (names
        are unique in a cluster): our previous process, gone, or fenced and re-executed."""
        for path in (self.member_path, self.primary_path):
            try:
                data, stat = self.client.get(path)
            except NoNodeError:
                continue
            if stat.ephemeralOwner != session and (path == self.member_path or _json(data).get("name") == self.name):
                log.info("removing %s left by an earlier session of %s", path, self.name)
                try:
                    self.client.delete(path, version=stat.version)
                except NoNodeError:
                    pass
        self._published = None
        self.client.create(self.member_path, json.dumps(self._desired).encode(), ephemeral=True)
        self._published = self._desired
        self._session = session
        self._leader_session = None

    def _read_members(self) -> None:
        members = {}
        for name in self.client.get_children(f"{self.path}/members"):
            try:
                data, _ = self.client.get(f"{self.path}/members/{name}")
            except NoNodeError:
                continue
            members[name] = _json(data)
        self.members = members

    def _primary_owner(self) -> int | None:
        stat = self.client.exists(self.primary_path)
        return stat.ephemeralOwner if stat is not None else None

    def _renew(self) -> None:
        """Sync through the leader, then check the primary node is still ours: the session was alive
        when the request was sent, so it cannot expire before then + the session timeout."""
        if self._resign:
            self._resign = False
            stat = self.client.exists(self.primary_path)
            if stat is not None and stat.ephemeralOwner == self._leader_session:
                self.client.delete(self.primary_path, version=stat.version)
            self._leader_session = None
            return
        sent = time.monotonic()
        self.client.sync(self.primary_path)
        owner = self._primary_owner()
        coordinator, timeout = self.coordinator, self.timeout
        if owner == self._leader_session:
            coordinator.call(lambda: coordinator.renewed(sent, timeout))
        else:
            self._leader_session = None
            coordinator.call(lambda: coordinator.fence("the primary node in ZooKeeper is no longer ours"))

    def _fail_back_when_due(self) -> None:
        """A primary that is not preferred hands over once a preferred member has been ready continuously
        for failback_delay (as seen at each step); 0 keeps the current primary."""
        delay = self.coordinator.config.failback_delay
        if not delay or self._desired.get("preferred") or self._failing_back or self._leader_session is None:
            return
        preferred = sorted(n for n in ready_backups(self.members) if self.members[n].get("preferred"))
        now = time.monotonic()
        if not preferred:
            self._preferred_ready_since = None
            return
        if self._preferred_ready_since is None:
            self._preferred_ready_since = now
        if now - self._preferred_ready_since >= delay:
            self._failing_back = True
            coordinator, name = self.coordinator, preferred[0]
            coordinator.call(lambda: coordinator.fail_back(name))

    def _elect(self) -> None:
        """Only an eligible candidate contends; the k-th best waits k steps for the better ones first.
        After a total outage, no one contends until every broker is back or `ha.recovery_wait` has passed:
        the freshest store may be on its way."""
        now = time.monotonic()
        if self._no_primary_since is None:
            self._no_primary_since = now
        members = dict(self.members)
        members[self.name] = self._desired  # our own state as the loop last saw it
        if restarting(members, self.zk_epoch) and len(members) < self.cluster_size \
                and now - self._no_primary_since < self.recovery_wait:
            return
        candidates = rank(members, self.zk_epoch)
        if self._desired.get("forced") and self.name not in candidates:
            candidates.append(self.name)
        if self.name not in candidates or not self._desired.get("eligible"):
            return
        place = candidates.index(self.name)
        if now - self._no_primary_since < place * CONTEND_STEP:
            return
        self._contend()

    def _contend(self) -> None:
        """Raise the epoch and create the primary node in one transaction: both or neither."""
        zk_epoch, stat = self._read_epoch()
        # above every epoch known, ZooKeeper's or a member's (one may predate ZooKeeper coordination)
        epoch = max([zk_epoch, int(self._desired.get("epoch", 0))]
                    + [int(m.get("epoch", 0)) for m in self.members.values()]) + 1
        session = self.client.client_id[0] if self.client.client_id else None
        transaction = self.client.transaction()
        transaction.set_data(self.epoch_path, str(epoch).encode(), version=stat.version)
        transaction.create(self.primary_path, json.dumps({"name": self.name, "epoch": epoch}).encode(),
                           ephemeral=True)
        sent = time.monotonic()
        self.claiming = epoch
        results = transaction.commit()
        if any(isinstance(r, Exception) for r in results):
            log.info("lost the election race at epoch %d: %s", epoch, results)
            self.claiming = None
            seen, _ = self._read_epoch()  # a watch event ignored meanwhile was someone else's
            coordinator = self.coordinator
            coordinator.call(lambda: coordinator.epoch_seen(seen))
            return
        self._leader_session = session
        self._no_primary_since = None
        coordinator, timeout = self.coordinator, self.timeout
        coordinator.call(lambda: coordinator.won(epoch, sent, timeout))
