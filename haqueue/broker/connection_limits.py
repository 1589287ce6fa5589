"""How many connections the broker takes, in all, from one address and as one user: `limits.max_connections`,
`max_connections_per_address` (counted from accept, so a client stalling its handshake counts too) and
`max_connections_per_user` (counted once the client has logged in and opened). Each check says why a
connection is refused; the engine refuses it with amqp:resource-limit-exceeded when it opens.
"""
from __future__ import annotations

from collections import Counter

from ..config import LimitsConfig

ANONYMOUS = "anonymous"  # not one user: anonymous clients are limited per address only


class ConnectionLimits:
    def __init__(self, limits: LimitsConfig) -> None:
        self.limits = limits
        self.by_address: Counter[str] = Counter()
        self.by_user: Counter[str] = Counter()
        self.exempt_users: set[str] = set()  # a plug-in's own peers (HA's user): never refused per user

    def accepted(self, host: str, others: int) -> str | None:
        """A connection from `host` was accepted while the broker had `others`; why to refuse it, if so."""
        self.by_address[host] += 1
        if others >= self.limits.max_connections:
            return f"too many connections (limits.max_connections {self.limits.max_connections})"
        limit = self.limits.max_connections_per_address
        if limit and self.by_address[host] > limit:
            return f"too many connections from {host} (limits.max_connections_per_address {limit})"
        return None

    def logged_in(self, user: str) -> str | None:
        """A client logged in as `user` opens; why to refuse it, if so (else it is counted until `closed`)."""
        if user == ANONYMOUS or user in self.exempt_users:
            return None
        limit = self.limits.max_connections_per_user
        if limit and self.by_user[user] >= limit:
            return f"too many connections for user '{user}' (limits.max_connections_per_user {limit})"
        self.by_user[user] += 1
        return None

    def closed(self, host: str, user: str | None) -> None:
        """A connection accepted from `host` is gone; `user` if `logged_in` admitted it."""
        _decrement(self.by_address, host)
        if user is not None:
            _decrement(self.by_user, user)


def _decrement(counter: Counter[str], key: str) -> None:
    if counter[key] <= 1:
        counter.pop(key, None)  # a counter per address ever seen would only grow
    else:
        counter[key] -= 1
