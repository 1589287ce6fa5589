"""A durable subscription across a failover (haqueue/messaging/subscriptions.py): its queue, binding and selector are
ordinary replicated wiring, so a client that re-attaches with the same container-id and link name at the promoted
backup resumes it with every message confirmed while it was away, and the selector still applies there."""
from __future__ import annotations

import pytest
from proton import Message
from proton.reactor import Container, DurableSubscription, Selector
from proton.utils import BlockingConnection

from ha_harness import HaCluster, send_all, wait_for

pytestmark = pytest.mark.slow

SUBSCRIPTION = "app1:ticks"
KEEP = Selector("kind = 'keep'")


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
