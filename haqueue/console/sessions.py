"""Who a console request is: a login with the broker's own users, kept as a signed session token.

A token names its user and when it expires, signed with HMAC-SHA256. In a cluster the key is derived from
`ha.password`, which every broker shares, so a token one broker gave is good at every other: when the broker
that served the page dies, the page goes on with the others without a new login (design/console.md). Without
HA the key is drawn at start. Nothing is stored per session but the ids of those logged out, which every broker
of the cluster is told (logouts.py).

A state-changing request must also carry the token's CSRF token (an HMAC of the token) in a header: a form
another site makes the browser send carries the cookie but cannot know the header.

The HA peer user (`ha.username`) is refused, at the login and in a token: its password is in every broker's
config file for brokers talking to brokers, and a person must not use it to act on clients here.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..config import ANONYMOUS_USER

SESSION_SECONDS = 8 * 3600  # a login lasts this long
COOKIE = "haqueue_session"
CSRF_HEADER = "X-CSRF-Token"
KEY_LABEL = b"haqueue console sessions"


@dataclass(frozen=True)
class Session:
    user: str
    token: str | None  # None: an anonymous client, where the config lets those in
    expires: float
    id: str = ""  # the token's own random part: what a logout ends

    @property
    def anonymous(self) -> bool:
        return self.token is None


class PeerUser(Exception):
    """A login as the HA peer user, or a token naming it: refused, whatever the password or signature."""

    def __init__(self, user: str) -> None:
        super().__init__(f"'{user}' is the HA peer user (ha.username), which brokers use to talk to each other; "
                         f"it may not use the console (log in as one of the config's users)")


class Sessions:
    """Gives and checks tokens; `authenticate(user, password)` is the broker's own check (Access.authenticate);
    `peer_user`: ha.username, refused."""

    def __init__(self, authenticate: Callable[[str, str], bool], anonymous_allowed: bool,
                 shared_secret: str | None, ended: Callable[[str], bool], peer_user: str | None = None) -> None:
        self._authenticate = authenticate
        self._ended = ended  # whether a session id was logged out
        self._peer_user = peer_user
        self.anonymous_allowed = anonymous_allowed
        secret = shared_secret.encode() if shared_secret is not None else os.urandom(32)
        self._key = hmac.new(secret, KEY_LABEL, hashlib.sha256).digest()
        # One password check at a time: a hashed one costs an scrypt computation (16 MiB, tens of ms), and a
        # flood of logins must not multiply that (as the broker's own password checks, design/permissions.md).
        self._checking = threading.Lock()

    def login(self, user: str, password: str) -> Session | None:
        """A new session if the password is the user's; None if not. Raises PeerUser before any password check:
        the answer says nothing of the peer password."""
        if not user or user == ANONYMOUS_USER:
            return None
        if user == self._peer_user:
            raise PeerUser(user)
        with self._checking:
            if not self._authenticate(user, password):
                return None
        expires = float(int(time.time()) + SESSION_SECONDS)  # whole seconds, as the token holds it
        session_id = _b64(os.urandom(9))
        payload = _b64(json.dumps({"u": user, "e": int(expires), "n": session_id}).encode())
        return Session(user, f"{payload}.{self._sign(payload)}", expires, session_id)

    def session(self, token: str | None) -> Session | None:
        """The session a token is, if it is one of ours, unexpired and not logged out; else the anonymous
        client's where those are let in; else None. Raises PeerUser for a valid token naming the peer user (one
        signed with the key that ha.password gives)."""
        if token:
            found = self._check(token)
            if found is not None:
                return found
        return Session(ANONYMOUS_USER, None, 0.0) if self.anonymous_allowed else None

    def csrf(self, session: Session) -> str:
        """The CSRF token of a session (the anonymous client's is the same for every page of this broker)."""
        return self._sign("csrf:" + (session.token or ANONYMOUS_USER))

    def csrf_ok(self, session: Session, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.csrf(session).encode())

    def _check(self, token: str) -> Session | None:
        payload, _, signature = token.partition(".")
        if not hmac.compare_digest(signature.encode(), self._sign(payload).encode()):
            return None
        try:
            fields = json.loads(_unb64(payload))
            user, expires, session_id = str(fields["u"]), float(fields["e"]), str(fields["n"])
        except (ValueError, KeyError, TypeError, binascii.Error):
            return None
        if expires <= time.time() or self._ended(session_id):
            return None
        if user == self._peer_user:
            raise PeerUser(user)
        return Session(user, token, expires, session_id)

    def _sign(self, text: str) -> str:
        return _b64(hmac.new(self._key, text.encode(), hashlib.sha256).digest())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
