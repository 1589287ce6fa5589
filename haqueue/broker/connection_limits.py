"""How many connections the broker takes: client connections in all (`limits.max_connections`, else as many as
its file descriptors allow), per source address (`max_connections_per_address`, counted from accept, so a
client stalling its handshake counts too) and per user (`max_connections_per_user`), and how many sockets
it accepts at all. A plug-in's own peers (`exempt_users`: HA's user) count against none of the clients'
limits, nor against `max_sessions_per_connection` and `max_links_per_connection`. Each check says why a
connection is refused; the engine refuses it with amqp:resource-limit-exceeded when it opens, or, past
`max_sockets`, closes it at once (design/security.md).
"""
from __future__ import annotations

import logging
import resource
from collections import Counter

from ..config import LimitsConfig

log = logging.getLogger("haqueue.engine")

ANONYMOUS = "anonymous"  # not one user: anonymous clients are limited per address only
FILES_SHARE = 10  # a tenth of the descriptors stays for the broker's own files (journal segments, the audit log...)
PEER_ROOM = 100  # sockets beyond the clients' limit: peers, the ha user's admin tools, handshakes in progress


class ConnectionLimits:
    def __init__(self, limits: LimitsConfig, descriptors: int) -> None:
        self.limits = limits
        self.descriptors = descriptors
        sockets = descriptors - descriptors // FILES_SHARE
        self.max_clients = min(limits.max_connections or sockets, sockets - PEER_ROOM)
        self.max_sockets = self.max_clients + PEER_ROOM  # over it, an accepted socket is closed at once
        self.clients = 0  # connections opened and counted against max_clients
        self.by_address: Counter[str] = Counter()
        self.by_user: Counter[str] = Counter()
        self.exempt_users: set[str] = set()  # a plug-in's own peers (HA's user): no client limit applies to them
        self._log_room()

    def exempt(self, user: str | None) -> bool:
        """Is a connection logged in as `user` free of the clients' limits?"""
        return user in self.exempt_users

    def accepted(self, host: str) -> str | None:
        """A connection from `host` was accepted; why to refuse it when it opens, if so (an exempt user's is not)."""
        self.by_address[host] += 1
        limit = self.limits.max_connections_per_address
        if limit and self.by_address[host] > limit:
            return f"too many connections from {host} (limits.max_connections_per_address {limit})"
        return None

    def opened(self, host: str, user: str, refusal: str | None) -> str | None:
        """A connection accepted from `host` opens, logged in as `user`, with `accepted`'s `refusal`; why to refuse
        it, if so (else it is counted until `closed`). An exempt user's is counted nowhere, not even per address."""
        if self.exempt(user):
            _decrement(self.by_address, host)
            return None
        if refusal is not None:
            return refusal
        if self.clients >= self.max_clients:
            return f"too many connections ({self.clients_limit()})"
        limit = self.limits.max_connections_per_user
        if user != ANONYMOUS and limit and self.by_user[user] >= limit:
            return f"too many connections for user '{user}' (limits.max_connections_per_user {limit})"
        self.clients += 1
        if user != ANONYMOUS:
            self.by_user[user] += 1
        return None

    def closed(self, host: str, user: str | None) -> None:
        """A connection accepted from `host` is gone; `user` if `opened` admitted it."""
        if user is not None and self.exempt(user):
            return
        _decrement(self.by_address, host)
        if user is not None:
            self.clients -= 1
            if user != ANONYMOUS:
                _decrement(self.by_user, user)

    def clients_limit(self) -> str:
        """Which limit bounds the clients, for a refusal or a log line."""
        if self.max_clients == self.limits.max_connections:
            return f"limits.max_connections {self.max_clients}"
        return f"{self.max_clients}, what RLIMIT_NOFILE {self.descriptors} allows"

    def _log_room(self) -> None:
        configured = self.limits.max_connections
        if configured > self.max_clients:
            log.warning("limits.max_connections %d is more than RLIMIT_NOFILE %d allows: clients beyond %d are "
                        "refused; raise its hard limit (ulimit -Hn, systemd LimitNOFILE=)", configured,
                        self.descriptors, self.max_clients)
        else:
            log.info("client connections: at most %s", self.clients_limit())


def raise_descriptor_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (every connection holds a descriptor); the descriptors
    this process may now open."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as e:
        log.warning("cannot raise the file descriptor limit (RLIMIT_NOFILE) from %d to its hard limit %d: %s",
                    soft, hard, e)
        return soft
    log.info("file descriptor limit (RLIMIT_NOFILE) raised from %d to its hard limit %d", soft, hard)
    return hard


def _decrement(counter: Counter[str], key: str) -> None:
    if counter[key] <= 1:
        counter.pop(key, None)  # a counter per address ever seen would only grow
    else:
        counter[key] -= 1
