"""A logout holds at every broker of the cluster (design/console.md, "Logging out").

A session token is good at every broker sharing its key, so ending one at the broker a logout reached is not
enough. That broker keeps the session's id in a file of its data directory (a restart forgets nothing) until the
token would have expired, and passes it on to every other broker of the cluster (its `ha.brokers`; for a shard's
process every process of the cluster file) as the management request `DELETE console-session`, made as the HA peer
user. The logout is answered once every broker has taken it or failed to (at most PASS_ON_WAIT), naming those that
have not taken it: a broker that did not is told again every RETRY_EVERY seconds until it does or the token expires.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from ..admin import AdminClient, AdminError

if TYPE_CHECKING:
    from ..broker.management import Management
    from ..config import HaConfig

log = logging.getLogger("haqueue.console")

FILE = "console-logouts.json"  # in the broker's data_dir: {session id: when its token expires}
TYPE = "console-session"  # the management type of the operation DELETE a broker is told a logout with
PEER_TIMEOUT = 1.0  # seconds a broker has to answer
PASS_ON_WAIT = 2.0  # seconds a logout waits for the others (within the page's 3 s for an answer)
RETRY_EVERY = 2.0  # seconds between two tries to tell a broker that did not answer (a refused connect, if down)
NOT_IMPLEMENTED = 501  # a broker without a console takes no session token: nothing to end there


class Logouts:
    def __init__(self, data_dir: str, peers: list[str], ha: "HaConfig | None") -> None:
        self._path = os.path.join(data_dir, FILE)
        self._peers, self._ha = peers, ha
        self._changed = threading.Condition()
        self._ended: dict[str, float] = self._load()  # session id -> when its token expires (then forgotten)
        self._untold: dict[str, dict[str, float]] = {}  # peer address -> the sessions it has not taken yet
        self._retry_at: dict[str, float] = {}  # peer address -> time.monotonic() of its next try
        self._thread: threading.Thread | None = None

    def register(self, management: "Management") -> None:
        """`DELETE console-session` (admin, as the HA peer user is): another broker passing on a logout."""
        def delete(name: str | None, body: dict[str, Any]) -> tuple[int, None]:
            self._record(str(name), float(body["expires"]))
            return 204, None
        management.register(TYPE, "DELETE", delete)

    def ended(self, session_id: str) -> bool:
        with self._changed:
            return session_id in self._ended

    def end(self, session_id: str, expires: float) -> list[str]:
        """A logout here: ended here at once, and at the others; those not told within PASS_ON_WAIT."""
        self._record(session_id, expires)
        with self._changed:
            for peer in self._peers:
                self._untold.setdefault(peer, {})[session_id] = expires
            if self._peers and self._thread is None:
                self._thread = threading.Thread(target=self._run, name="console-logouts", daemon=True)
                self._thread.start()
            self._changed.notify_all()
            started = time.monotonic()
            asked = [p for p in self._peers if self._retry_at.get(p, 0.0) <= started]  # not one known to be down
            self._changed.wait_for(lambda: all(session_id not in self._untold[p] or self._retry_at.get(p, 0.0) > started
                                               for p in asked), PASS_ON_WAIT)
            return [p for p in self._peers if session_id in self._untold[p]]

    def _record(self, session_id: str, expires: float) -> None:
        with self._changed:
            now = time.time()
            self._ended = {i: e for i, e in self._ended.items() if e > now}
            self._ended[session_id] = expires
            try:
                os.makedirs(os.path.dirname(self._path), exist_ok=True)
                with open(self._path + ".new", "w", encoding="utf-8") as f:
                    json.dump(self._ended, f)
                os.replace(self._path + ".new", self._path)
            except OSError as e:  # it holds here until a restart all the same
                log.error("console: cannot keep the logout in %s: %s", self._path, e)

    def _load(self) -> dict[str, float]:
        try:
            with open(self._path, encoding="utf-8") as f:
                ended = json.load(f)
            return {str(i): float(e) for i, e in ended.items() if float(e) > time.time()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError) as e:
            log.error("console: %s is unreadable (%s): the logouts it held are forgotten", self._path, e)
            return {}

    # -- telling the others ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._changed:
                now, soon = time.time(), time.monotonic()
                for sessions in self._untold.values():  # a token that has expired needs no logout
                    for session_id in [i for i, e in sessions.items() if e <= now]:
                        del sessions[session_id]
                due = {p: dict(s) for p, s in self._untold.items() if s and self._retry_at.get(p, 0.0) <= soon}
                if not due:
                    self._changed.wait(RETRY_EVERY if any(self._untold.values()) else None)
                    continue
            for peer, sessions in due.items():
                told = self._tell(peer, sessions)
                with self._changed:
                    if told:
                        for session_id in sessions:
                            self._untold[peer].pop(session_id, None)
                        self._retry_at.pop(peer, None)
                    else:
                        if peer not in self._retry_at:
                            log.warning("console: %s has not taken a logout; telling it again every %.0f s",
                                        peer, RETRY_EVERY)
                        self._retry_at[peer] = time.monotonic() + RETRY_EVERY
                    self._changed.notify_all()

    def _tell(self, peer: str, sessions: dict[str, float]) -> bool:
        assert self._ha is not None  # peers come from the ha section
        try:
            with AdminClient(peer, PEER_TIMEOUT, self._ha.username, self._ha.password, self._ha.tls) as client:
                for session_id, expires in sessions.items():
                    code, description, _ = client.request("DELETE", TYPE, session_id, {"expires": expires})
                    if code >= 400 and code != NOT_IMPLEMENTED:
                        raise AdminError(description)
            return True
        except AdminError as e:
            log.debug("console: %s has not taken a logout: %s", peer, e)
            return False
