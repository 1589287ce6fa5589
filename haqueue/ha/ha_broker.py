"""HaBroker: plugs HA into a broker through the core's named hooks and owns the role.

A broker starts as a backup. `promote` (from an admin, the local supervisor, Pacemaker or the
ZooKeeper coordinator) makes it primary: it raises the epoch, stops following, starts serving
backups and binds the public address. A primary never demotes in place: when fenced it restarts
as a backup.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Any

from ..broker.engine import Connection, Link, LinkHandler
from ..broker.errors import BrokerError, CONNECTION_FORCED, NOT_ALLOWED, UNAUTHORIZED
from ..broker.server import Broker
from ..config import HaConfig, ListenerConfig
from . import protocol
from .backup import Backup
from .policy import Policy
from .primary import Primary
from .role import BACKUP, JOINING, PRIMARY, READY, EpochStore

log = logging.getLogger("haqueue.ha")

# Each epoch's queue seqs start here, so a message numbered by a new primary never takes the seq
# of one its predecessor numbered but never replicated.
EPOCH_SEQ_SHIFT = 40


class HaBroker:
    def __init__(self, broker: Broker, config: HaConfig) -> None:
        self.broker = broker
        self.config = config
        self.policy = Policy(config.replicate)
        self.epoch = EpochStore(broker.config.data_dir)
        self.config_address = next((l for l in broker.config.listen if (l.host, l.port) in config.brokers), None)
        self.primary: Primary | None = None
        self.public_listener_bound = False
        broker.config.users.setdefault(config.username, config.password)
        broker.registry.validators.append(self.policy.validate)
        broker.admission.append(self.admit)
        broker.endpoints[protocol.WIRING] = self._endpoint(lambda p, link: p.wiring_endpoint(link))
        broker.endpoints[protocol.QUEUE] = self._endpoint(lambda p, link: p.queue_endpoint(link))
        broker.status_hooks.append(self._broker_status)
        broker.management.register("ha", "READ", lambda name, body: (200, self.status()))
        broker.management.register("ha", "PROMOTE", lambda name, body: (200, self.promote(bool(body.get("force")))))
        self.backup = Backup(self)

    @property
    def role(self) -> str:
        return PRIMARY if self.primary is not None else BACKUP

    @property
    def state(self) -> str:
        return self.primary.state if self.primary is not None else self.backup.state

    def is_peer(self, conn: Connection) -> bool:
        return conn.user == self.config.username

    # -- admission and the HA links ------------------------------------------------------------
    def admit(self, conn: Connection) -> None:
        if self.primary is None and not self.is_peer(conn):
            log.info("refused client %s (%s): this broker is a backup", conn.peer, conn.remote_container)
            raise BrokerError(CONNECTION_FORCED, f"{self.broker.name} is a backup; connect to the primary")

    def _endpoint(self, attach: Any) -> Any:
        def endpoint(link: Link) -> LinkHandler:
            if not self.is_peer(link.conn):
                raise BrokerError(UNAUTHORIZED, f"{link.address} is for HA peers (user {link.conn.user} is not)")
            if self.primary is None:
                raise BrokerError(NOT_ALLOWED, f"{self.broker.name} is not the primary (backup, {self.state})")
            return attach(self.primary, link)
        return endpoint

    # -- promotion ------------------------------------------------------------------------------
    def promote(self, force: bool = False) -> dict[str, Any]:
        if self.primary is not None:
            return self.status()
        brand_new = not self.epoch.had_primary and self.backup.state == JOINING
        if self.backup.state != READY and not brand_new and not force:
            raise BrokerError(NOT_ALLOWED, f"{self.broker.name} cannot be promoted: still catching up "
                                           f"(state {self.backup.state}); promote a ready backup, or use --force")
        expected = {name for name, state in self.backup.members.items()
                    if state == READY and name != self.broker.name}
        self.backup.stop()
        self.epoch.raise_to(self.epoch.epoch + 1)
        floor = self.epoch.epoch << EPOCH_SEQ_SHIFT
        for queue in self.broker.registry.queues():
            queue.next_seq = max(queue.next_seq, floor)
        self.primary = Primary(self, expected)
        log.info("%s promoted to primary, epoch %d", self.broker.name, self.epoch.epoch)
        self._bind_public()
        return self.status()

    def _bind_public(self) -> None:
        if self.config.public is None or self.public_listener_bound:
            return
        host, port = self.config.public
        self.broker.listen(ListenerConfig(host, port, max_frame_size=self.broker.config.limits.max_frame_size))
        self.public_listener_bound = True

    def fence(self, reason: str) -> None:
        """A newer primary exists: stop serving at once and start again as a backup."""
        log.error("%s fenced: %s; restarting as a backup", self.broker.name, reason)
        self.broker.engine.call_later(0, self._restart)

    def _restart(self) -> None:
        self.broker.engine.shutdown()
        os.execv(sys.executable, [sys.executable, "-m", "haqueue", *sys.argv[1:]])

    # -- status ---------------------------------------------------------------------------------
    def _broker_status(self, status: dict[str, Any]) -> None:
        status["role"], status["state"] = self.role, self.state

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = {"name": self.broker.name, "role": self.role, "state": self.state,
                                  "epoch": self.epoch.epoch,
                                  "brokers": [f"{h}:{p}" for h, p in self.config.brokers],
                                  "public": f"{self.config.public[0]}:{self.config.public[1]}"
                                  if self.config.public else None}
        if self.primary is not None:
            status.update(self.primary.status())
        else:
            status.update(self.backup.status())
        return status
