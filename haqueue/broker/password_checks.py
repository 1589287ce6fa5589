"""Logins checked without stalling the loop.

A `password_hash:` costs one scrypt computation to check (tens of milliseconds, design/permissions.md):
on the loop's thread, a client sending wrong passwords would stall every connection for that long at
each try. Here a check that needs it runs on one worker thread (hashlib's scrypt releases the GIL), and
its answer comes back through the loop; everything else (plain passwords, a hashed one accepted
before, anonymous) is answered at once.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable, Protocol

Answer = Callable[[bool], None]


class Logins(Protocol):
    def quick_check(self, mechanism: str, user: str, password: str) -> bool | None:
        """The answer if it is cheap to give, else None."""

    def authenticate(self, mechanism: str, user: str, password: str) -> bool: ...


class PasswordChecks:
    def __init__(self, logins: Logins, post: Callable[[Callable[[], None]], None]) -> None:
        self.logins = logins
        self.post = post  # runs a callback on the loop's thread
        self._queue: queue.SimpleQueue[tuple[str, str, str, Answer]] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None

    def check(self, mechanism: str, user: str, password: str, now: Answer, later: Answer) -> None:
        """Calls `now(ok)` before returning if the answer is cheap, else `later(ok)` on the loop's thread
        once the worker has it (checks wait their turn: one scrypt at a time bounds its memory)."""
        quick = self.logins.quick_check(mechanism, user, password)
        if quick is not None:
            now(quick)
            return
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="password-checks", daemon=True)
            self._worker.start()
        self._queue.put((mechanism, user, password, later))

    def _work(self) -> None:
        while True:
            mechanism, user, password, later = self._queue.get()
            ok = self.logins.authenticate(mechanism, user, password)
            self.post(lambda: later(ok))
