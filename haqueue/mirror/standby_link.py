"""The source primary's one connection to the standby cluster (design/mirroring.md): made as an ordinary client of
the standby's client address (its `mirror.to`, tried in turn), logged in as a user of the standby's. Once it is
open, the source attaches `$mirror.state` and reads what the standby holds of each of its queues; only then does
each queue's mirror attach, resuming from there. When the connection drops, every queue's mirror is told, and it
is made again every RETRY_INTERVAL, to the next address.

As the shard relay's connections, it has AMQP heartbeats (HEARTBEAT), and one that has not opened within
HEARTBEAT is given up: a standby site that went silent is noticed, not waited on. (The standby's state may take
longer: it is waited for as long as the heartbeats say the standby is there.)
"""
from __future__ import annotations

import logging
import ssl
from typing import Any, Callable, Protocol

from ..broker.connection import Connection
from ..broker.engine import Engine
from ..broker.proton_adapter import ACCEPTED, Link, LinkHandler
from ..config import MirrorConfig
from ..ha.protocol import decode_map, message_tag, unflatten
from . import protocol

log = logging.getLogger("haqueue.mirror")

RETRY_INTERVAL = 1.0  # seconds between attempts to reach the standby
HEARTBEAT = 2.0  # idle timeout of the connection, and how long it may take to open

Runs = list[tuple[int, int]]


class Mirrored(Protocol):
    """One queue's mirror (queue_mirror.py), as the connection sees it."""

    name: str  # its queue's
    def attach(self, conn: Connection, held: dict[str, Any] | None) -> None: ...  # what the standby holds of it
    def lost(self) -> None: ...  # the connection dropped: its link is gone


class StandbyLink:
    def __init__(self, engine: Engine, config: MirrorConfig, tls: ssl.SSLContext | None,
                 gone: Callable[[str], bool], wire: Callable[[Connection], None]) -> None:
        self.engine = engine
        self.config = config
        self.tls = tls
        self.gone = gone  # was the queue of this name deleted at the source (source.py)
        self.wire = wire  # the connection takes the mirror (protocol 2): the source sends its wiring on it
        self.conn: Connection | None = None
        self.opened = False
        self.held: dict[str, dict[str, Any]] | None = None  # the standby's state, once read on this connection
        self.protocol = protocol.OLDEST_PROTOCOL  # the mirror protocol the standby chose (its state says)
        self.epoch = protocol.FIRST_EPOCH  # the source's (source.py sets them after a reverse)
        self.reverses: str | None = None  # the cluster it reverses onto
        self.applied: dict[str, int] = {}  # ... and per queue the newest seq of that cluster's it held when promoted
        self.mirrors: list[Mirrored] = []
        self.attempt = 0  # which of mirror.to is tried next
        self.down_reason: str | None = "not connected yet"  # why there is no open connection now (logged once)
        self.refusal: str | None = None  # the standby refused the mirror (its $mirror.state link): why

    @property
    def address(self) -> str:
        host, port = self.config.to[(self.attempt - 1) % len(self.config.to)]
        return f"{host}:{port}"

    def add(self, mirror: Mirrored) -> None:
        self.mirrors.append(mirror)
        if self.conn is not None and self.held is not None:
            mirror.attach(self.conn, None)  # a queue the standby's state did not name: it holds none of it
        elif self.conn is None:
            self._connect()

    def remove(self, mirror: Mirrored) -> None:
        if mirror in self.mirrors:
            self.mirrors.remove(mirror)

    def _connect(self) -> None:
        if self.conn is not None or not self.mirrors:
            return
        host, port = self.config.to[self.attempt % len(self.config.to)]
        self.attempt += 1
        conn = self.conn = self.engine.connect(host, port, self, self.config.username, self.config.password,
                                               idle_timeout=HEARTBEAT, tls=self.tls)
        self.engine.call_later(HEARTBEAT, lambda: self._open_timeout(conn))

    def _open_timeout(self, conn: Connection) -> None:
        if conn is self.conn and not self.opened and not conn.closed:
            conn.abort()  # on_closed follows

    # -- ConnectionHandler ------------------------------------------------------------------------
    def on_open(self, conn: Connection) -> None:
        if conn is not self.conn:
            return
        self.opened = True
        reader = _StateReader(self, conn)
        reader.link = conn.open_link(False, protocol.STATE, f"{protocol.STATE}/{self.config.cluster}", reader,
                                     properties=self.link_properties(), credit=1)

    def link_properties(self, queue: str | None = None) -> dict[str, Any]:
        """Every link's properties (and a reverse's queue link's APPLIED, with `queue`)."""
        props: dict[str, Any] = {protocol.CLUSTER: self.config.cluster, protocol.EPOCH: self.epoch,
                                 protocol.PROTOCOLS: list(protocol.spoken())}
        if self.reverses is not None:
            props[protocol.REVERSES] = self.reverses
            if queue is not None:
                props[protocol.APPLIED] = self.applied.get(queue, 0)
        return props

    def state_read(self, conn: Connection, state: dict[str, Any]) -> None:
        if conn is not self.conn:
            return
        queues = state.get("queues")
        self.held = queues if isinstance(queues, dict) else {}
        chosen = state.get(protocol.STATE_PROTOCOL)  # a standby of protocol 1 names none
        own = protocol.spoken()
        self.protocol = chosen if isinstance(chosen, int) and chosen <= own[1] else own[0]
        if self.down_reason is not None or self.refusal is not None:
            log.info("mirror: standby at %s takes the mirror of %d queues", conn.peer, len(self.mirrors))
        self.down_reason = self.refusal = None
        for mirror in list(self.mirrors):
            mirror.attach(conn, self.held.get(mirror.name))
        if self.protocol >= protocol.BATCH_PROTOCOL:
            self.wire(conn)
            mirrored = {mirror.name for mirror in self.mirrors}
            for name, held in self.held.items():
                if name not in mirrored and self.gone(name):
                    self._delete(conn, name, held.get("uid"))

    def _delete(self, conn: Connection, name: str, uid: Any) -> None:
        """Tell the standby a queue it mirrors was deleted here while it was away: on a link of its own."""
        deletion = Deletion()
        deletion.link = conn.open_link(True, f"{protocol.QUEUE}/{name}", f"{protocol.QUEUE}/{name}", deletion,
                                       properties={**self.link_properties(name), protocol.UID: uid,
                                                   protocol.ARGS: {}})
        log.info("mirror: queue %s was deleted here while the standby was away: it deletes its copy", name)

    def state_refused(self, conn: Connection, reason: str) -> None:
        """The standby refused `$mirror.state`: it will not take this mirror (a user it does not accept, a
        protocol it does not speak, a backup): said once, tried again later."""
        if conn is not self.conn:
            return
        if reason != self.refusal:
            log.warning("mirror: the standby at %s refuses the mirror: %s", conn.peer, reason)
        self.refusal = reason
        conn.close()

    def on_closed(self, conn: Connection, reason: str) -> None:
        if conn is not self.conn:
            return
        self.conn, self.opened, self.held = None, False, None
        for mirror in list(self.mirrors):
            mirror.lost()
        if self.down_reason is None and self.refusal is None:
            log.warning("mirror: lost the standby at %s (%s); connecting again", conn.peer, reason)
        self.down_reason = reason
        self.engine.call_later(RETRY_INTERVAL, self._connect)

    def status(self) -> dict[str, Any]:
        return {"to": [f"{h}:{p}" for h, p in self.config.to], "connected": self.held is not None,
                "protocol": self.protocol if self.held is not None else None,
                "address": self.address if self.conn is not None else None,
                "down": None if self.held is not None else self.refusal or self.down_reason}


class Deletion(LinkHandler):
    """A queue deleted at the source: DELETED on its link, the last transfer, once the standby grants credit (a
    pre-settled transfer waits for credit too), then the link is closed."""

    link: Link | None = None

    def on_credit(self) -> None:
        link = self.link
        if link is not None and link.credit() > 0:
            self.link = None
            link.send(b"", settled=True, tag=message_tag(protocol.DELETED, 0, 0))
            link.close()


class _StateReader(LinkHandler):
    """The source's end of `$mirror.state`: one message, the standby's holdings."""

    link: Link | None = None

    def __init__(self, standby: StandbyLink, conn: Connection) -> None:
        self.standby = standby
        self.conn = conn
        self.read = False

    def on_message(self, delivery: Any, data: bytes, settled: bool) -> None:
        self.read = True
        if self.link is not None:
            self.link.settle(delivery, 0 if settled else ACCEPTED)
        self.standby.state_read(self.conn, decode_map(data))

    def on_detach(self) -> None:
        if not self.read and not self.conn.closed:
            reason = self.link.remote_error() if self.link is not None else None
            self.standby.state_refused(self.conn, reason or "it detached $mirror.state")


def runs(held: dict[str, Any] | None) -> Runs:
    """The standby's seq ranges of one queue, from its state."""
    have = held.get("have") if held else None
    return unflatten(have) if isinstance(have, list) else []
