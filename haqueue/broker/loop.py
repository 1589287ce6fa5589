"""The event loop's own machinery: one epoll object, timers, callbacks from other threads, and the
wake-ups that cut a wait short (those callbacks, `stop`, signals). What a pass does with the sockets
it reports is the engine's (engine.py, `Engine._one_pass`).
"""
from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
import select
import signal
import socket
import time
from typing import Callable, Final

log = logging.getLogger("haqueue.engine")

# Sockets a wait reports at most; the rest, still ready, come with the next pass. epoll.poll allocates room
# for this many events at every call: its default (1,023) is a request large enough that glibc's malloc
# first consolidates every small freed chunk, which with ten busy connections was 1.9 % of the broker's
# samples; 32 fit in Python's own small-object allocator.
_MAX_EVENTS: Final = 32
# Seconds a lazy timer (`call_later(..., lazy=True)`) may run late: it runs at the first pass at or after its time,
# and wakes the loop itself only this much later. A busy broker passes every few milliseconds anyway, so such a
# timer (a site mirror's 20 ms gathering, at 1,000 msg/s) costs no wake-up of its own; an idle one waits this more.
LAZY_SLACK: Final = 0.010


class Loop:
    """Waits for sockets and timers; runs what other threads and timers scheduled."""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._lazy: list[tuple[float, int, Callable[[], None]]] = []  # as _timers; the wait allows LAZY_SLACK more
        self._timer_ids = itertools.count()
        self._running = False
        self._from_threads: collections.deque[Callable[[], None]] = collections.deque()
        self._wakeup_r, self._wakeup_w = socket.socketpair()
        self._wakeup_r.setblocking(False)
        self._wakeup_w.setblocking(False)

    def call_later(self, delay: float, callback: Callable[[], None], lazy: bool = False) -> None:
        """callback() after `delay` seconds; `lazy`: at the first pass from then on, waking for it LAZY_SLACK late."""
        self.call_at(time.monotonic() + delay, callback, lazy)

    def call_at(self, when: float, callback: Callable[[], None], lazy: bool = False) -> None:
        """callback() at time.monotonic() `when` (call_later's)."""
        heapq.heappush(self._lazy if lazy else self._timers, (when, next(self._timer_ids), callback))

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        """Run callback on the loop's thread (for coordinators with threads of their own, e.g. kazoo)."""
        self._from_threads.append(callback)
        try:
            self._wakeup_w.send(b"\0")
        except OSError:
            pass

    def every(self, interval: float, callback: Callable[[], None]) -> None:
        def repeat() -> None:
            callback()
            self.call_later(interval, repeat)
        self.call_later(interval, repeat)

    def stop(self) -> None:
        self._running = False
        try:
            self._wakeup_w.send(b"\0")
        except OSError:
            pass

    def serve(self, one_pass: Callable[[], None]) -> None:
        """Run passes until `stop`; a signal wakes the wait so that its handler runs at once."""
        self._running = True
        self.epoll.register(self._wakeup_r.fileno(), select.EPOLLIN)
        old_wakeup = signal.set_wakeup_fd(self._wakeup_w.fileno())
        try:
            while self._running:
                one_pass()
        finally:
            signal.set_wakeup_fd(old_wakeup)

    def wait(self, busy: bool) -> list[tuple[int, int]]:
        """The sockets ready (fd, epoll mask), waiting at most until the next timer, not at all when `busy`.
        A wake-up's bytes are read here and it is left out."""
        timeout = -1.0
        if busy:
            timeout = 0.0
        elif self._timers or self._lazy:
            wake = min(self._timers[0][0] if self._timers else math.inf,
                       self._lazy[0][0] + LAZY_SLACK if self._lazy else math.inf)
            timeout = max(wake - time.monotonic(), 0.0)
        try:
            events = self.epoll.poll(timeout, _MAX_EVENTS)
        except InterruptedError:
            return []
        wakeup = self._wakeup_r.fileno()
        ready = []
        for fd, mask in events:
            if fd != wakeup:
                ready.append((fd, mask))
                continue
            try:
                while self._wakeup_r.recv(4096):
                    pass
            except BlockingIOError:
                pass
        return ready

    def run_thread_callbacks(self) -> None:
        while self._from_threads:
            callback = self._from_threads.popleft()
            try:
                callback()
            except Exception:
                log.exception("callback from another thread failed")

    def timers_due(self) -> bool:
        if not (self._timers or self._lazy):
            return False
        now = time.monotonic()
        return bool(self._timers) and self._timers[0][0] <= now or bool(self._lazy) and self._lazy[0][0] <= now

    def run_timers(self) -> None:
        now = time.monotonic()
        for timers in (self._timers, self._lazy):
            while timers and timers[0][0] <= now:
                _, _, callback = heapq.heappop(timers)
                try:
                    callback()
                except Exception:
                    log.exception("timer callback failed")
