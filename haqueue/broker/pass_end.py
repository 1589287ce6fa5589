"""What runs at the end of a loop pass: the dispatch of what changed during it (queues, plug-ins' senders) and
the hooks that run before its output leaves. Compiled with the hot path (setup.py): the engine calls it in
every pass and queues at every enqueue, and each call into the interpreted server.py cost a frame of the
interpreter, which at 1,000 msg/s runs cold after every wake-up (design/performance.md)."""
from __future__ import annotations

from typing import Callable, Protocol


class Dispatchable(Protocol):
    @property
    def deleted(self) -> bool: ...

    def dispatch(self) -> None: ...


class PassEnd:
    def __init__(self) -> None:
        self._dirty: set[Dispatchable] = set()
        # Called before the engine writes a pass's output (confirmations, settlements, messages) to the
        # sockets: what must reach the OS before any of it leaves (the audit log's events of the pass).
        self.flush_hooks: list[Callable[[], None]] = []

    def schedule(self, item: Dispatchable) -> None:
        """Ask for item.dispatch() at the end of this pass (a queue, or a plug-in's sender)."""
        self._dirty.add(item)

    def after_pass(self) -> None:
        """Dispatch what changed this pass; what is scheduled meanwhile waits for the next pass."""
        dirty, self._dirty = self._dirty, set()
        for item in dirty:
            if not item.deleted:
                item.dispatch()

    def before_flush(self) -> None:
        for hook in self.flush_hooks:
            hook()

    def pending(self) -> bool:
        """Work scheduled for the next pass."""
        return bool(self._dirty)
