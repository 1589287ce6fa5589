"""The event loop's timers: precise ones and lazy ones (run at the first pass from their time on, waking the loop
themselves only LAZY_SLACK late), as a broker's pass runs them (broker/engine.py: wait, then timers_due/run_timers)."""
from __future__ import annotations

from haqueue.broker.loop import Loop


def one_pass(loop: Loop) -> None:
    loop.wait(False)
    loop.run_thread_callbacks()
    if loop.timers_due():
        loop.run_timers()


def test_a_lazy_timer_runs_alone_with_nothing_else_waking_the_loop() -> None:
    loop = Loop()
    ran: list[str] = []
    loop.call_later(0.005, lambda: ran.append("lazy"), lazy=True)
    for _ in range(100):  # each wait ends at the lazy timer's time + LAZY_SLACK at the latest
        one_pass(loop)
        if ran:
            break
    assert ran == ["lazy"]
    assert not loop.timers_due()


def test_a_lazy_timer_due_runs_at_a_pass_another_cause_wakes() -> None:
    loop = Loop()
    ran: list[str] = []
    loop.call_later(0.0, lambda: ran.append("lazy"), lazy=True)
    loop.call_later(3600.0, lambda: ran.append("late"))  # a precise timer far off does not hold it back
    loop.call_soon_threadsafe(lambda: ran.append("woken"))  # the wake-up a socket or another thread gives
    one_pass(loop)
    assert ran == ["woken", "lazy"]


def test_precise_and_lazy_timers_run_once_each_when_due() -> None:
    loop = Loop()
    ran: list[str] = []
    loop.call_later(0.0, lambda: ran.append("precise"))
    loop.call_later(0.0, lambda: ran.append("lazy"), lazy=True)
    for _ in range(100):
        one_pass(loop)
        if len(ran) == 2:
            break
    assert sorted(ran) == ["lazy", "precise"]
    assert not loop.timers_due()
