"""Who may do what: the users, their passwords and their permissions (design/permissions.md).

A permission is an action on an address glob: `send`, `receive` (and browse), `manage` (declare
and delete through `$management`), plus `admin` (the broker-wide operations). It is decided once
per link at attach and once per management request, never per message; the anonymous relay,
whose addresses come with its messages, decides once per link and address.
"""
from __future__ import annotations

import fnmatch
import hashlib
import hmac
import logging
import os
import re
from typing import Callable

from ..config import ANONYMOUS_USER, AllowConfig, UserConfig
from ..passwords import verify
from .errors import BrokerError, UNAUTHORIZED

log = logging.getLogger("haqueue.access")

SEND, RECEIVE, MANAGE, ADMIN = "send", "receive", "manage", "admin"
SEE = "see"  # read an object's attributes: any of send, receive or manage on its name, or admin

_VERBS = {SEND: "send to", RECEIVE: "receive from", MANAGE: "manage", SEE: "see"}
_RELAY_MEMORY = 1024  # addresses an anonymous-relay link remembers its answers for


def _globs(patterns: list[str]) -> re.Pattern[str] | None:
    """One regex for a list of fnmatch globs (as `auto_create`: `*` matches dots too); None for none."""
    return re.compile("|".join(fnmatch.translate(p) for p in patterns)) if patterns else None


class Permissions:
    """What one user may do."""

    __slots__ = ("send", "receive", "manage", "admin", "sends_anywhere")

    def __init__(self, allow: AllowConfig) -> None:
        self.send = _globs(allow.send)
        self.receive = _globs(allow.receive)
        self.manage = _globs(allow.manage)
        self.admin = allow.admin
        self.sends_anywhere = "*" in allow.send

    def may(self, action: str, address: str | None) -> bool:
        if action == ADMIN:
            return self.admin
        assert address is not None
        if action == SEE:
            return self.admin or any(self._matches(a, address) for a in (SEND, RECEIVE, MANAGE))
        return self._matches(action, address)

    def _matches(self, action: str, address: str) -> bool:
        pattern = self.send if action == SEND else self.receive if action == RECEIVE else self.manage
        return pattern is not None and pattern.match(address) is not None


NOTHING = Permissions(AllowConfig())


class _Login:
    """A user's password, plain or hashed. A hashed one that was accepted is remembered as a keyed digest,
    so a client reconnecting with it costs a microsecond instead of an scrypt computation."""

    __slots__ = ("password", "password_hash", "_accepted")
    _key = os.urandom(32)  # per process: the remembered digest is useless outside it

    def __init__(self, password: str | None, password_hash: str | None) -> None:
        self.password = password
        self.password_hash = password_hash
        self._accepted: bytes | None = None

    def quick_check(self, password: str) -> bool | None:
        """The answer, unless only the slow check of a hash can give it (None)."""
        if self.password is not None:
            return hmac.compare_digest(self.password.encode(), password.encode())
        if self.password_hash is None:  # a user who logs in only with a client certificate
            return False
        if self._accepted is not None and hmac.compare_digest(self._digest(password), self._accepted):
            return True
        return None

    def check(self, password: str) -> bool:
        quick = self.quick_check(password)
        if quick is not None:
            return quick
        assert self.password_hash is not None
        if verify(self.password_hash, password):
            self._accepted = self._digest(password)
            return True
        return False

    def _digest(self, password: str) -> bytes:
        return hmac.new(self._key, password.encode(), hashlib.sha256).digest()


class Access:
    """The users of one broker (from its config, plus those plug-ins add) and what each may do."""

    def __init__(self, users: dict[str, UserConfig], anonymous: AllowConfig | None) -> None:
        self._logins = {name: _Login(u.password, u.password_hash) for name, u in users.items()}
        self._permissions = {name: Permissions(u.allow) for name, u in users.items()}
        self.anonymous = anonymous is not None  # whether clients without a user are let in
        if anonymous is not None:
            self._permissions[ANONYMOUS_USER] = Permissions(anonymous)

    def add_user(self, name: str, password: str, permissions: Permissions) -> None:
        """A user a plug-in needs (HA's peer user); the config has checked that the name is free."""
        self._logins[name] = _Login(password, None)
        self._permissions[name] = permissions

    def authenticate(self, mechanism: str, user: str, password: str) -> bool:
        """Whether to admit; may take an scrypt computation (PasswordChecks keeps it off the loop)."""
        if mechanism == "ANONYMOUS":
            return self.anonymous
        login = self._logins.get(user)
        return login is not None and login.check(password)

    def quick_check(self, mechanism: str, user: str, password: str) -> bool | None:
        """authenticate's answer when it is cheap; None when a password hash must be computed."""
        if mechanism == "ANONYMOUS":
            return self.anonymous
        login = self._logins.get(user)
        return False if login is None else login.quick_check(password)

    def may(self, user: str | None, action: str, address: str | None = None) -> bool:
        return self._permissions.get(user or "", NOTHING).may(action, address)

    def check(self, user: str | None, action: str, address: str) -> None:
        """Raise BrokerError(amqp:unauthorized-access) naming the user, the action and the address (for ADMIN:
        the operation), and log it, unless the user may."""
        if not self.may(user, action, address):
            raise BrokerError(UNAUTHORIZED, _refuse(user, action, address))

    def relay(self, user: str | None) -> Callable[[str], None] | None:
        """The check of an anonymous-relay link's `to` addresses: None if `user` may send anywhere; else
        a check that remembers its answers, so each address costs one decision (and one log line)."""
        permissions = self._permissions.get(user or "", NOTHING)
        if permissions.sends_anywhere:
            return None
        decided: dict[str, str | None] = {}  # address -> why refused, or None: allowed

        def check(address: str) -> None:
            if address not in decided:
                if len(decided) >= _RELAY_MEMORY:
                    decided.clear()
                decided[address] = None if permissions.may(SEND, address) else _refuse(user, SEND, address)
            refusal = decided[address]
            if refusal is not None:
                raise BrokerError(UNAUTHORIZED, refusal)
        return check


def _refuse(user: str | None, action: str, address: str) -> str:
    """The refusal's description, logged."""
    if action == ADMIN:
        description = f"user '{user}' may not run admin operations ({address})"
    else:
        description = f"user '{user}' may not {_VERBS[action]} '{address}'"
    log.warning("refused: %s", description)
    return description
