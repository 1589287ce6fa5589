"""The messaging semantics of haqueue/messaging/ across a failover: what a queue's arguments ask for holds on
the promoted backup as it did on the primary, and what they moved (a poison message to the dead-letter
address) was replicated as it moved."""
from __future__ import annotations

import pytest
from proton import Message

from ha_harness import HaCluster, connect, receive, send_all

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
