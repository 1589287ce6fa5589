"""Reading or changing the broker from a thread of its own (an HTTP server's: the metrics, the console).

The broker's values belong to its event loop, which changes them without locks, often several at once. So a
thread hands the loop a function (Engine.call_soon_threadsafe), which runs between two passes, and waits for
what it gives: the values copied, consistent with each other, or an operation's answer. The loop pays only for
the function, and only when asked (design/metrics.md has the other ways, and why not them).
"""
from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

T = TypeVar("T")
CallSoon = Callable[[Callable[[], None]], None]  # Engine.call_soon_threadsafe


class LoopUnresponsive(Exception):
    """The broker's loop did not answer in time (hung, or busy with a long recovery)."""


class _Answer(Generic[T]):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None

    def give(self, value: T) -> None:
        self.value = value
        self.done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


def answer_from_loop(call_soon: CallSoon, begin: Callable[[Callable[[T], None]], None], timeout: float) -> T:
    """Run `begin(give)` on the loop's thread and wait for `give(value)`, which it calls then or later (on the
    loop); what `begin` raises is raised here. Raises LoopUnresponsive after `timeout` seconds."""
    answer: _Answer[T] = _Answer()

    def run() -> None:  # on the broker's thread
        try:
            begin(answer.give)
        except Exception as e:  # noqa: BLE001 - handed to the waiting thread, which raises it
            answer.fail(e)
    call_soon(run)
    if not answer.done.wait(timeout):
        raise LoopUnresponsive(f"the broker's loop did not answer within {timeout:g} s")
    if answer.error is not None:
        raise answer.error
    return answer.value  # type: ignore[return-value]  # set by give


def on_loop(call_soon: CallSoon, function: Callable[[], T], timeout: float) -> T:
    """`function()` run on the loop's thread, between two passes."""
    def begin(give: Callable[[T], None]) -> None:
        give(function())
    return answer_from_loop(call_soon, begin, timeout)
