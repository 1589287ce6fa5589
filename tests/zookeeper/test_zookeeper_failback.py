"""Preferred-primary re-election under ZooKeeper (design/zookeeper.md, "Preferred primary"), against a real
3-server ensemble: b0 is preferred; killed, another broker takes over; back and ready, it is primary again
after `failback_delay`, with a producer running throughout and no confirmed message lost."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import pytest

from harness import wait_for
from zk_cluster import Producer, received_of_confirmed


@contextmanager
def preferred_failed_over(zk_cluster, failback_delay: float) -> Iterator[tuple[Any, Any, Any, Producer]]:
    """b0, preferred (a new cluster elects it first), is killed -9 while a producer publishes: another broker
    takes over; b0 comes back and is ready again. Yields (the cluster, b0, the broker that took over, the
    producer), which goes on publishing until the block ends."""
    c = zk_cluster()
    for b in c.brokers:
        b.config["ha"]["zookeeper"]["failback_delay"] = failback_delay
    preferred = c.brokers[0]
    preferred.config["ha"]["zookeeper"]["preferred"] = True
    # A new cluster's first election ranks the members present then: b0 starts first and is elected alone. Started
    # with the others at once, whichever registered first could win it (seen at load 14: b1, b2 won twice).
    c.start(0)
    assert c.wait_primary() is preferred
    c.start()
    c.wait_ready_backups(preferred)
    producer = Producer(c.addresses, "load").start()
    try:
        wait_for(lambda: producer.count() >= 300, 30, message="300 confirmed before the kill")
        preferred.kill()
        other = c.wait_primary(timeout=c.session_timeout + 10, exclude=(preferred,))
        base = producer.count()
        wait_for(lambda: producer.count() >= base + 300, 30, message="300 confirmed by the broker that took over")
        preferred.start()
        ready = c.wait_state(preferred, "backup", "ready", timeout=30)
        assert ready["zookeeper"]["members"]["b0"]["preferred"] is True
        yield c, preferred, other, producer
    finally:
        producer.stop()


def confirmed_by(producer: Producer, address: str, after: float) -> int:
    return sum(1 for t, a in producer.snapshot().values() if a == address and t > after)


@pytest.mark.slow
def test_the_preferred_primary_returns_and_is_primary_again_after_failback_delay(zk_cluster):
    with preferred_failed_over(zk_cluster, 2.0) as (c, preferred, other, producer):
        ready_at = time.monotonic()
        assert c.wait_primary(timeout=20, exclude=(other,)) is preferred
        failed_back = time.monotonic() - ready_at
        c.wait_state(other, "backup", "ready", timeout=30)  # it resigned, restarted and caught up
        assert c.primaries() == [preferred]
        wait_for(lambda: confirmed_by(producer, preferred.address, ready_at) >= 300, 30,
                 message="300 confirmed by the preferred primary after the failback")
    confirmed, got, lost = received_of_confirmed(producer, preferred.address)
    print(f"failback: primary again {failed_back:.2f}s after it was seen ready (failback_delay 2s); "
          f"{len(confirmed)} confirmed, {len(got)} received, {len(got) - len(set(got))} duplicates, lost {lost[:10]}")
    assert lost == []
    assert failed_back >= 2.0
    status = c.status(preferred)
    assert status["epoch"] == 3 and status["zookeeper"]["primary"] == "b0"  # two failovers: the kill, the failback


@pytest.mark.slow
def test_failback_delay_zero_keeps_the_current_primary(zk_cluster):
    with preferred_failed_over(zk_cluster, 0) as (c, preferred, other, producer):
        watched_until = time.monotonic() + 4.0  # twice the delay the other test fails back after
        while time.monotonic() < watched_until:
            assert c.primaries() == [other]
        base = producer.count()
        wait_for(lambda: producer.count() >= base + 100, 30, message="100 more confirmed")
    assert received_of_confirmed(producer, other.address)[2] == []
