"""Refused connections are logged once per host and reason a minute, then with the count of repeats."""
from __future__ import annotations

import logging

from haqueue.broker.refusal_log import WINDOW, RefusalLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_repeated_refusal_is_counted_and_the_next_one_logged_says_how_many(caplog):
    clock = Clock()
    refusals = RefusalLog(logging.getLogger("test.refusals"), clock)
    with caplog.at_level(logging.INFO, logger="test.refusals"):
        for port in range(5000, 5010):  # a client reconnecting from new ports
            refusals(logging.WARNING, f"10.0.0.7:{port}", "wrong password", "refused %s", port)
            clock.now += 1
        refusals(logging.WARNING, "10.0.0.8:1", "wrong password", "refused %s", "other host")
        refusals(logging.WARNING, "10.0.0.7:1", "bad header", "refused %s", "other reason")
        clock.now += WINDOW
        refusals(logging.WARNING, "10.0.0.7:6000", "wrong password", "refused %s", 6000)
    assert [r.getMessage() for r in caplog.records] == [
        "refused 5000", "refused other host", "refused other reason",
        "refused 6000 (and 9 more like it from 10.0.0.7 in the last 70 s, not logged)"]
