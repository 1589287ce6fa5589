"""The messaging semantics of haqueue/messaging/ across a failover: what a queue's arguments ask for holds on
the promoted backup as it did on the primary (priority order, last values, groups, scheduled times), what they
moved (a poison message to the dead-letter address, a replaced value) was replicated as it moved, and a load
on a grouped or priority queue loses nothing across kill -9 of the primary."""
from __future__ import annotations

import time
from typing import Any

import pytest
from proton import Message, symbol

from ha_harness import HaCluster, Load, connect, receive, send_all, wait_for

DELAY = symbol("x-opt-delivery-delay")

pytestmark = pytest.mark.slow


def fail_delivery(address: str, queue: str, times: int) -> list[str]:
    """`times` consumers each take the queue's first message and go away holding it; the bodies they saw."""
    seen = []
    for _ in range(times):
        conn = connect(address)
        try:
            seen.append(conn.create_receiver(queue, credit=1).receive(timeout=10).body)
        finally:
            conn.close()
    return seen


def test_a_poison_message_is_dead_lettered_on_every_broker_and_the_limit_holds_after_failover(ha_cluster):
    c: HaCluster = ha_cluster()
    p = c.start_cluster()
    c.request(p, "CREATE", "queue", "work", body={"x-max-deliveries": 2, "dead_letter_address": "dlq"})
    send_all(c.public, "work", [Message(id="poison", body="poison", durable=True),
                                Message(id="next", body="next", durable=True)])
    assert fail_delivery(c.public, "work", 2) == ["poison", "poison"]
    for b in c.brokers[1:]:  # the move reached the backups: off the queue, onto the dead-letter address
        c.wait_depth(b, "work", 1)
        c.wait_depth(b, "dlq", 1)

    c.kill(p)
    new = c.best_backup(exclude=[p])
    c.promote(new)
    [dead] = receive(c.public, "dlq", 1)
    assert dead.id == "poison" and dead.annotations["x-opt-dead-letter-reason"] == \
        "delivery-count 2 reached x-max-deliveries 2"
    # The promoted backup applies the queue's limit too: "next" (never delivered before) fails twice and follows.
    assert fail_delivery(c.public, "work", 2) == ["next", "next"]
    assert [m.id for m in receive(c.public, "dlq", 1)] == ["next"]
    assert c.queues(new)["work"]["depth"] == 0


def _delivery_count(c: HaCluster, b: Any, queue: str) -> int:
    """The delivery-count of the first message `b` holds on `queue`, -1 if it holds none."""
    peeked = c.request(b, "PEEK", "queue", queue, {"count": 1})
    if not peeked:
        return -1
    message = Message()
    message.decode(peeked[0]["message"])
    return message.delivery_count


def test_failed_deliveries_reach_the_backups_and_count_toward_the_limit_after_failover(ha_cluster):
    c: HaCluster = ha_cluster()
    p = c.start_cluster()
    c.request(p, "CREATE", "queue", "work", body={"x-max-deliveries": 3, "dead_letter_address": "dlq"})
    send_all(c.public, "work", [Message(id="poison", body="poison", durable=True)])
    assert fail_delivery(c.public, "work", 2) == ["poison", "poison"]
    for b in c.brokers[1:]:  # each backup's copy counts the two failed deliveries
        wait_for(lambda: _delivery_count(c, b, "work") == 2, 10, message=f"{b.name}'s copy counting 2")
    c.kill(p)
    new = c.best_backup(exclude=[p])
    c.promote(new)
    assert _delivery_count(c, new, "work") == 2  # not held at the failover: nothing added
    # the third failed delivery, the first on the new primary, reaches the limit
    assert fail_delivery(c.public, "work", 1) == ["poison"]
    [dead] = receive(c.public, "dlq", 1)
    assert dead.id == "poison" and dead.annotations["x-opt-dead-letter-reason"] == \
        "delivery-count 3 reached x-max-deliveries 3"


class GroupedLoad(Load):
    """The failover load with each message in one of three groups and of one of ten priorities."""

    def _send_next(self, sender: Any) -> None:
        i = self.next
        sender.send(Message(body=i, durable=True, group_id=f"g{i % 3}", priority=i % 10), timeout=self.send_timeout)
        with self._lock:
            self.confirmed[i] = time.monotonic()
        self.next += 1


def fail_over(c: HaCluster, old: Any) -> Any:
    c.kill(old)
    new = wait_for(lambda: c.best_backup(exclude=[old]), 10, message="a ready backup")
    c.promote(new)
    return new


@pytest.mark.parametrize("args", [{"x-group-header": True}, {"x-priorities": 10}])
def test_grouped_and_priority_queues_lose_nothing_across_kill9_of_the_primary(ha_cluster, args):
    c: HaCluster = ha_cluster()
    p = c.start_cluster()
    c.request(p, "CREATE", "queue", "load", body=args)
    load = GroupedLoad(c.public, "load")
    _, report = load.across(lambda: fail_over(c, p))
    assert report["lost"] == [], report
    if "x-group-header" in args:  # one consumer: each group's messages in order (a redelivery may repeat one)
        for g in range(3):
            firsts = list(dict.fromkeys(b for b in load.received if b % 3 == g))
            assert firsts == sorted(firsts), f"group g{g} out of order"


def test_priority_last_value_and_schedule_hold_on_the_promoted_backup(ha_cluster):
    c: HaCluster = ha_cluster()
    p = c.start_cluster()
    c.request(p, "CREATE", "queue", "prio", body={"x-priorities": 10})
    c.request(p, "CREATE", "queue", "prices", body={"x-last-value-key": "symbol"})
    send_all(c.public, "prio", [Message(body=i, priority=i % 10, durable=True) for i in range(30)])
    send_all(c.public, "prices", [Message(body=f"{s}={v}", properties={"symbol": s}, durable=True)
                                  for v in range(3) for s in ("IBM", "RHT", "ACME")])
    send_all(c.public, "timed", [Message(body="soon", durable=True, annotations={DELAY: 3000}),
                                 Message(body="tomorrow", durable=True, annotations={DELAY: 86_400_000})])
    due = time.time() + 3
    for b in c.brokers[1:]:
        c.wait_depth(b, "prio", 30)
        c.wait_depth(b, "prices", 3)  # the primary's replacements reached the backups as dequeues
        c.wait_depth(b, "timed", 2)

    new = fail_over(c, p)
    got = [m.body for m in receive(c.public, "prio", 30)]
    assert got == sorted(range(30), key=lambda i: (-(i % 10), i))
    send_all(c.public, "prices", [Message(body="RHT=9", properties={"symbol": "RHT"}, durable=True)])
    assert sorted(m.body for m in receive(c.public, "prices", 3)) == ["ACME=2", "IBM=2", "RHT=9"]
    assert c.queues(new)["timed"]["depth"] == 2  # "soon" may be due by now (a loaded machine): held, not counted
    [soon] = receive(c.public, "timed", 1, timeout=15)
    assert soon.body == "soon" and time.time() >= due - 0.05
    assert (c.queues(new)["timed"]["depth"], c.queues(new)["timed"]["scheduled"]) == (1, 1)
