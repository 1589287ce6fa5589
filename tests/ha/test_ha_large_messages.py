"""Message sizes through a replicated queue: 64 KB, 1 MB and 10 MB messages go from publisher to backups
to a consumer of the primary and of the promoted backup intact, and `limits.max_message_size` bounds
clients' messages, never what a primary sends its backups (batches of many small messages, event lists)."""
from __future__ import annotations

import hashlib

import pytest
from proton import Message

from ha_harness import HaCluster, receive, send_all, wait_for

pytestmark = pytest.mark.timeout(180)

MB = 1024 * 1024


def body(i: int, size: int) -> bytes:
    """`size` bytes that differ for each i and all along (a misplaced piece would show)."""
    seed = hashlib.sha256(str(i).encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def fail_over(c: HaCluster, old):
    c.kill(old)
    new = wait_for(lambda: c.best_backup(exclude=[old]), 15, message="a ready backup")
    c.promote(new)
    return new


@pytest.mark.parametrize("size", [64 * 1024, MB, 10 * MB], ids=["64KB", "1MB", "10MB"])
def test_large_messages_through_a_replicated_queue_and_a_failover(ha_cluster, size):
    """The first consumed from the primary, the others from the backup promoted after it is killed."""
    c = ha_cluster(extra={"limits": {"max_message_size": 12 * MB}})
    p = c.start_cluster()
    c.request(p, "CREATE", "queue", "big")
    send_all(c.public, "big", [Message(body=body(i, size), durable=True) for i in range(3)], timeout=60)
    for b in c.brokers[1:]:
        c.wait_depth(b, "big", 3, timeout=30)
    [first] = receive(c.public, "big", 1, timeout=30)
    assert first.body == body(0, size)
    for b in c.brokers[1:]:
        c.wait_depth(b, "big", 2, timeout=30)
    fail_over(c, p)
    rest = receive(c.public, "big", 2, timeout=60)
    assert [m.body == body(i, size) for i, m in enumerate(rest, 1)] == [True, True]


def test_replication_is_not_limited_by_max_message_size(ha_cluster):
    """Small messages published together go to the backups many to a transfer, larger than the limit:
    a backup must take them all, or a failover loses what the primary confirmed."""
    c = ha_cluster(extra={"limits": {"max_message_size": 4096}})
    p = c.start_cluster()
    c.request(p, "CREATE", "queue", "small")
    messages = [Message(body=body(i, 3000), durable=True) for i in range(200)]
    send_all(c.public, "small", messages)
    for b in c.brokers[1:]:
        c.wait_depth(b, "small", 200)
    fail_over(c, p)
    got = receive(c.public, "small", 200)
    assert [m.body for m in got] == [m.body for m in messages]
