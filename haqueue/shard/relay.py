"""The relay's connections: one per shard to that shard's primary, shared by every link relayed there.

A connection is made when the first link needs it, as the HA peer user (the owning primary admits relayed
links from it with the client's rights, which this process checked). When it drops (the primary failed),
its links are told (`owner_lost`) and it is made again to the address the directory gives, every
RETRY_INTERVAL, until it opens (each link then re-attaches: `attach`) or shard.relay_timeout has passed
with none, when the links are detached with amqp:link:detach-forced.

A primary may go silent rather than close: its address (a Pacemaker VIP) moved to another node while the
relay waited on an outcome, so neither the primary's close nor a reset reaches the relay until TCP's
retransmissions, backed off for as long as the address was nowhere, find the new holder (a relayed
publish once waited past its client's 20 s). So, as a backup with its primary, the connection has
AMQP heartbeats (HEARTBEAT) and one that has not opened within HEARTBEAT is given up (a peer that
accepts TCP but does not answer, or a SYN to an address between nodes).
"""
from __future__ import annotations

import itertools
import logging
import time
from typing import Protocol

from ..broker.connection import Connection
from ..broker.engine import Engine
from .directory import ShardDirectory

log = logging.getLogger("haqueue.shard")

RETRY_INTERVAL = 0.2  # seconds between attempts to reach a shard's primary
HEARTBEAT = 2.0  # idle timeout of a connection to a shard's primary, and how long it may take to open
DETACH_FORCED = "amqp:link:detach-forced"


class Relayed(Protocol):
    """A client link relayed to a shard's primary (relayed_links.py)."""

    def attach(self, conn: Connection) -> None: ...  # the owner connection is open: attach the mirror link
    def owner_lost(self) -> None: ...  # it dropped: the mirror link is gone
    def give_up(self, condition: str, description: str) -> None: ...  # no primary: detach the client


class OwnerConnection:
    """The connection to one shard's primary and the links relayed over it."""

    def __init__(self, relay: "Relay", shard: int) -> None:
        self.relay = relay
        self.shard = shard
        self.conn: Connection | None = None
        self.opened = False
        self.links: list[Relayed] = []
        self.down_since: float | None = None  # since when no primary answers (monotonic)

    def add(self, link: Relayed) -> None:
        self.links.append(link)
        if self.opened and self.conn is not None:
            link.attach(self.conn)
        elif self.conn is None:
            self._connect()

    def remove(self, link: Relayed) -> None:
        if link in self.links:
            self.links.remove(link)

    def _connect(self) -> None:
        if self.conn is not None or not self.links:
            return
        host, port = self.relay.directory.primary(self.shard)
        conn = self.conn = self.relay.engine.connect(host, port, self, self.relay.user, self.relay.password,
                                                     idle_timeout=HEARTBEAT)
        self.relay.engine.call_later(HEARTBEAT, lambda: self._open_timeout(conn))

    def _open_timeout(self, conn: Connection) -> None:
        if conn is self.conn and not self.opened and not conn.closed:
            log.debug("relay: shard %d's primary at %s did not answer within %.1fs", self.shard, conn.peer, HEARTBEAT)
            conn.abort()

    # -- ConnectionHandler ------------------------------------------------------------------
    def on_open(self, conn: Connection) -> None:
        if conn is not self.conn:
            return
        if self.down_since is not None:
            log.info("relay: shard %d's primary answers again at %s", self.shard, conn.peer)
        self.opened, self.down_since = True, None
        for link in list(self.links):
            link.attach(conn)

    def on_closed(self, conn: Connection, reason: str) -> None:
        if conn is not self.conn:
            return
        self.conn, self.opened = None, False
        for link in list(self.links):
            link.owner_lost()
        if not self.links:
            return  # made again when a link needs it
        now = time.monotonic()
        if self.down_since is None:
            self.down_since = now
            log.info("relay: lost shard %d's primary (%s); looking for it", self.shard, reason)
        if now - self.down_since > self.relay.timeout:
            description = f"no primary of shard {self.shard} for {self.relay.timeout:g} s (shard.relay_timeout)"
            log.warning("relay: %s; detaching its %d relayed links", description, len(self.links))
            links, self.links, self.down_since = self.links, [], None
            for link in links:
                link.give_up(DETACH_FORCED, description)
            return
        self.relay.engine.call_later(RETRY_INTERVAL, self._connect)


class Relay:
    """Every shard's owner connection of this process."""

    def __init__(self, engine: Engine, directory: ShardDirectory, user: str, password: str,
                 timeout: float) -> None:
        self.engine = engine
        self.directory = directory
        self.user, self.password = user, password
        self.timeout = timeout  # seconds without a shard's primary before its relayed links are detached
        self._owners: dict[int, OwnerConnection] = {}
        self._names = itertools.count(1)

    def owner(self, shard: int) -> OwnerConnection:
        if shard not in self._owners:
            self._owners[shard] = OwnerConnection(self, shard)
        return self._owners[shard]

    def link_name(self, client_name: str) -> str:
        """A name for a mirror link, unique on its connection."""
        return f"{client_name}/relay-{next(self._names)}"
