"""A durable subscription across a failover (haqueue/messaging/subscriptions.py): its queue, binding and selector are
ordinary replicated wiring, so a client that re-attaches with the same container-id and link name at the promoted
backup resumes it with every message confirmed while it was away, and the selector still applies there; a
subscriber under load loses nothing across kill -9 of the primary; and a total outage of the cluster keeps it,
with the other durable state of haqueue/messaging/ (priority order, last values, scheduled times)."""
from __future__ import annotations

from typing import Any

import pytest
from proton import Message, symbol
from proton.reactor import Container, DurableSubscription, Selector
from proton.utils import BlockingConnection

from ha_harness import HaCluster, Load, connect, receive, send_all, wait_for

pytestmark = pytest.mark.slow

SUBSCRIPTION = "app1:ticks"
KEEP = Selector("kind = 'keep'")
DELAY = symbol("x-opt-delivery-delay")


def subscriber(address: str) -> tuple[BlockingConnection, object]:
    """Container app1's durable subscription `ticks` to the exchange `prices`, with no credit yet."""
    conn = BlockingConnection(f"amqp://{address}", timeout=10, reconnect=False, sasl_enabled=False,
                              container=Container(container_id="app1"))
    return conn, conn.create_receiver("prices", name="ticks", credit=0, options=[DurableSubscription(), KEEP])


def ticks(first: int, n: int) -> list[Message]:
    """n messages for the subscription, each followed by one its selector does not take."""
    return [Message(body=f"{kind}-{i}", subject="eur.usd", durable=True, properties={"kind": kind})
            for i in range(first, first + n) for kind in ("keep", "skip")]


def test_a_durable_subscription_resumes_at_the_promoted_backup_with_every_confirmed_message(ha_cluster):
    c: HaCluster = ha_cluster()
    p = c.start_cluster()
    c.request(p, "CREATE", "exchange", "prices", body={"type": "topic"})
    conn, _ = subscriber(c.public)
    conn.close()  # the connection's end is not the subscription's
    send_all(c.public, "prices", ticks(0, 100))  # confirmed while no one is attached
    assert c.queues(p)[SUBSCRIPTION]["depth"] == 100  # only what the selector takes

    c.kill(p)
    new = c.best_backup(exclude=[p])
    c.promote(new)
    conn, r = subscriber(c.public)
    try:
        r.flow(200)
        got = []
        for _ in range(100):
            got.append(r.receive(timeout=10).body)
            r.accept()
        assert got == [f"keep-{i}" for i in range(100)]  # none lost, in order
        conn.create_sender("prices").close()  # its attach is answered once the broker has taken the accepts
        send_all(c.public, "prices", ticks(100, 1))  # the binding and its selector hold here too
        assert c.queues(new)[SUBSCRIPTION]["depth"] == 1
        assert r.receive(timeout=10).body == "keep-100"
        r.accept()
        r.close()  # unsubscribe: gone here and from the backup
    finally:
        conn.close()
    assert SUBSCRIPTION not in c.queues(new)
    backup = next(b for b in c.brokers if b not in (p, new))
    wait_for(lambda: SUBSCRIPTION not in c.queues(backup), 15, message="the backup to delete the subscription")


class SubscriptionLoad(Load):
    """The failover load through a fanout exchange, consumed by container app1's durable subscription `feed`."""

    consumer_container = "app1"

    def _open_consumer(self, conn: BlockingConnection) -> Any:
        return conn.create_receiver(self.queue, name="feed", credit=20, options=[DurableSubscription()])


def test_a_durable_subscription_under_load_loses_nothing_across_kill9_of_the_primary(ha_cluster):
    c: HaCluster = ha_cluster()
    p = c.start_cluster()
    c.request(p, "CREATE", "exchange", "fan", body={"type": "fanout"})

    def fail_over() -> Any:
        c.kill(p)
        new = wait_for(lambda: c.best_backup(exclude=[p]), 10, message="a ready backup")
        c.promote(new)
        return new

    load = SubscriptionLoad(c.public, "fan")
    load._open_consumer(connect(c.public, container_id="app1")).connection.close()  # subscribed before any publish
    new, report = load.across(fail_over)
    assert report["lost"] == [], report
    assert "app1:feed" in c.queues(new)


def test_a_total_outage_keeps_subscriptions_priorities_last_values_and_schedules(ha_cluster):
    """Every broker killed at once, then started again: the freshest store is promoted and each feature's state
    is what it was (a durable subscription's backlog, priority order, last values, a scheduled message's time)."""
    c: HaCluster = ha_cluster()
    p = c.start_cluster()
    c.request(p, "CREATE", "exchange", "prices", body={"type": "topic"})
    c.request(p, "CREATE", "queue", "prio", body={"x-priorities": 10})
    c.request(p, "CREATE", "queue", "last", body={"x-last-value-key": "symbol"})
    subscriber(c.public)[0].close()
    send_all(c.public, "prices", ticks(0, 20))
    send_all(c.public, "prio", [Message(body=i, priority=i % 10, durable=True) for i in range(20)])
    send_all(c.public, "last", [Message(body=f"{s}={v}", properties={"symbol": s}, durable=True)
                                for v in range(3) for s in ("IBM", "RHT")])
    send_all(c.public, "timed", [Message(body="later", durable=True, annotations={DELAY: 86_400_000})])
    for b in c.brokers[1:]:
        c.wait_ready(b, queues=[SUBSCRIPTION, "prio", "last", "timed"])
    for b in c.brokers:
        c.kill(b)
    c.start(0, 1, 2)
    wait_for(lambda: c.cli(c[0], "ha", "promote").returncode == 0, 20, message="b0 promoted")
    p = c[0]
    queues = c.queues(p)
    assert (queues["timed"]["depth"], queues["timed"]["scheduled"]) == (1, 1)
    assert [m.body for m in receive(c.public, "prio", 20)] == sorted(range(20), key=lambda i: (-(i % 10), i))
    send_all(c.public, "last", [Message(body="IBM=9", properties={"symbol": "IBM"}, durable=True)])
    assert sorted(m.body for m in receive(c.public, "last", 2)) == ["IBM=9", "RHT=2"]
    conn, r = subscriber(c.public)
    try:
        r.flow(20)
        assert [r.receive(timeout=10).body for _ in range(20)] == [f"keep-{i}" for i in range(20)]
        r.accept()
    finally:
        conn.close()
