"""Scheduled delivery (haqueue/messaging/scheduled.py): a message annotated x-opt-delivery-time (ms since the
epoch) or x-opt-delivery-delay (ms) is counted and kept but handed to no consumer or browser before then, on
any queue; a delay is made a time on arrival, so a restart keeps the time rather than starting it again."""
from __future__ import annotations

import time

import pytest
from proton import Message, symbol
from proton.reactor import Copy

from clients import Client, bodies

pytestmark = pytest.mark.timeout(60)

DELAY = symbol("x-opt-delivery-delay")
TIME = symbol("x-opt-delivery-time")


def _at(seconds_from_now: float) -> int:
    return int((time.time() + seconds_from_now) * 1000)


def test_a_delayed_message_waits_behind_later_ones_and_comes_when_due(broker):
    with Client(broker) as c:
        c.send("jobs", [Message(body="later", annotations={DELAY: 1500}), Message(body="now"),
                        Message(body="at", annotations={TIME: _at(1.0)}),
                        Message(body="past", annotations={TIME: _at(-60)}),
                        Message(body="bad", annotations={DELAY: "soon"})])  # not a number: not deferred
        sent = time.time()
        info = c.mgmt("READ", "queue", "jobs").body
        assert (info["depth"], info["scheduled"]) == (5, 2), info
        r = c.receiver("jobs", credit=10)
        assert bodies(r.receive_n(3)) == ["now", "past", "bad"]
        assert bodies(c.receiver("jobs", options=Copy(), credit=10).drain(10)) == []  # nor to a browser
        r.expect_nothing(0.5)
        got = r.receive_n(2, timeout=10)
        waited = time.time() - sent
    assert bodies(got) == ["at", "later"]
    assert waited >= 1.4  # never before its time (the test's only bound on time is this lower one)
    assert got[1].message.annotations[TIME] >= int(sent * 1000)  # the delay, made a time on arrival


def test_a_scheduled_message_keeps_its_time_across_a_restart(broker):
    with Client(broker) as c:
        c.send("jobs", [Message(body="tomorrow", durable=True, annotations={DELAY: 86_400_000}),
                        Message(body="soon", durable=True, annotations={DELAY: 2000})])
        due = time.time() + 2
    broker.kill()
    broker.start()
    with Client(broker) as c:
        info = c.mgmt("READ", "queue", "jobs").body
        assert (info["depth"], info["scheduled"]) == (2, 2), info
        r = c.receiver("jobs", credit=10)
        [m] = r.receive_n(1, timeout=10)
        assert m.body == "soon" and time.time() >= due - 0.05
        r.expect_nothing(0.3)
        assert c.queue_depth("jobs") == 1


def test_many_messages_due_at_once(broker):
    n = 2000
    with Client(broker) as c:
        when = _at(1.0)
        c.send("batch", [Message(body=i, annotations={TIME: when}) for i in range(n)])
        r = c.receiver("batch", credit=n)
        got = r.receive_n(n, timeout=20)
    assert [m.body for m in got] == list(range(n))  # in their order
