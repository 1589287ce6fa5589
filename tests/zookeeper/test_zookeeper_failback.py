"""Preferred-primary re-election under ZooKeeper (design/zookeeper.md, "Preferred primary"), against a real
3-server ensemble: b0 is preferred; killed, another broker takes over; back and ready, it is primary again
after `failback_delay`, with a producer running throughout and no confirmed message lost."""
from __future__ import annotations

import time

import pytest

from harness import wait_for
from zk_cluster import Producer, drain


def preferred_cluster(zk_cluster, failback_delay: float):
    c = zk_cluster()
    for b in c.brokers:
        b.config["ha"]["zookeeper"]["failback_delay"] = failback_delay
    c.brokers[0].config["ha"]["zookeeper"]["preferred"] = True
    c.start()
    return c


def kill_preferred_under_load(c, producer: Producer):
    """The preferred primary (a new cluster elects it first) is killed -9: another broker takes over; the
    preferred one comes back and is ready again. Returns (preferred, the broker that took over)."""
    preferred = c.brokers[0]
    assert c.wait_primary() is preferred
    c.wait_ready_backups(preferred)
    producer.start()
    wait_for(lambda: producer.count() >= 300, 30, message="300 confirmed before the kill")
    preferred.kill()
    other = c.wait_primary(timeout=c.session_timeout + 10, exclude=(preferred,))
    base = producer.count()
    wait_for(lambda: producer.count() >= base + 300, 30, message="300 confirmed by the broker that took over")
    preferred.start()
    return preferred, other


def confirmed_by(producer: Producer, address: str, after: float) -> int:
    return sum(1 for t, a in producer.snapshot().values() if a == address and t > after)


@pytest.mark.slow
def test_the_preferred_primary_returns_and_is_primary_again_after_failback_delay(zk_cluster):
    c = preferred_cluster(zk_cluster, failback_delay=2.0)
    producer = Producer(c.addresses, "load")
    try:
        preferred, other = kill_preferred_under_load(c, producer)
        ready = c.wait_state(preferred, "backup", "ready", timeout=30)
        assert ready["zookeeper"]["members"]["b0"]["preferred"] is True
        ready_at = time.monotonic()
        assert c.wait_primary(timeout=20, exclude=(other,)) is preferred
        failed_back = time.monotonic() - ready_at
        c.wait_state(other, "backup", "ready", timeout=30)  # it resigned, restarted and caught up
        assert c.primaries() == [preferred]
        wait_for(lambda: confirmed_by(producer, preferred.address, ready_at) >= 300, 30,
                 message="300 confirmed by the preferred primary after the failback")
    finally:
        producer.stop()
    confirmed = producer.snapshot()
    got = drain([preferred.address], "load", set(confirmed))
    lost = sorted(set(confirmed) - set(got))
    print(f"failback: primary again {failed_back:.2f}s after it was seen ready (failback_delay 2s); "
          f"{len(confirmed)} confirmed, {len(got)} received, {len(got) - len(set(got))} duplicates, lost {lost[:10]}")
    assert lost == []
    assert failed_back >= 2.0
    status = c.status(preferred)
    assert status["epoch"] == 3 and status["zookeeper"]["primary"] == "b0"  # two failovers: the kill, the failback


@pytest.mark.slow
def test_failback_delay_zero_keeps_the_current_primary(zk_cluster):
    c = preferred_cluster(zk_cluster, failback_delay=0)
    producer = Producer(c.addresses, "load")
    try:
        preferred, other = kill_preferred_under_load(c, producer)
        c.wait_state(preferred, "backup", "ready", timeout=30)
        watched_until = time.monotonic() + 4.0  # twice the delay the other test fails back after
        while time.monotonic() < watched_until:
            assert c.primaries() == [other]
        base = producer.count()
        wait_for(lambda: producer.count() >= base + 100, 30, message="100 more confirmed")
    finally:
        producer.stop()
    confirmed = producer.snapshot()
    got = drain([other.address], "load", set(confirmed))
    assert sorted(set(confirmed) - set(got)) == []
