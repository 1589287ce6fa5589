"""Paging: a queue larger than the memory allowed for durable bodies keeps them in the journal, not in RAM,
and hands every message out in order."""
from __future__ import annotations

import threading

import pytest
from proton import Message

from clients import Client
from ha_harness import receive, send_all
from harness import peak_rss, rss, wait_for

BODY = "x" * 1000
COUNT = 30_000  # 30 MB of bodies
PAGE_ABOVE = 3_000_000


def _flood(b) -> int:
    """RSS growth while COUNT durable 1 KB messages go onto a queue nobody consumes."""
    send_all(b.address, "warm", [Message(body=BODY, durable=True) for _ in range(2000)])
    receive(b.address, "warm", 2000)
    before = rss(b.pid)
    send_all(b.address, "big", [Message(body={"i": i, "pad": BODY}, durable=True) for i in range(COUNT)],
             timeout=120)
    return rss(b.pid) - before


@pytest.mark.slow
def test_a_queue_larger_than_memory_pages_and_stays_in_order(broker_factory):
    """Paged bodies are not in RAM, so they do not hold the memory alarm on: the flood of 30 MB is taken
    under a memory_limit of 10 MB (flow control would block it for good otherwise)."""
    b = broker_factory(store={"page_above": PAGE_ABOVE, "segment_bytes": 4 * 1024 * 1024},
                       limits={"memory_limit": 10_000_000})
    growth = _flood(b)
    with Client(b) as c:
        status = wait_for(lambda: (s := c.mgmt("READ", "store").body)["memory_bytes"] <= PAGE_ABOVE and s, 10,
                          message="paging")
        assert status["paged_messages"] > COUNT * 0.8, status
        assert c.queue_depth("big") == COUNT
        assert c.mgmt("READ", "broker").body["memory_alarm"] is False
    print(f"RSS growth for {COUNT} durable 1 KB messages, paging above {PAGE_ABOVE}: {growth / 1e6:.1f} MB")
    assert growth < 12_000_000  # the bodies alone are 30 MB
    assert "queue big pages" in b.log()
    got = [m.body["i"] for m in receive(b.address, "big", COUNT // 2, timeout=30)]
    assert got == list(range(COUNT // 2))
    b.kill()  # half consumed, half still paged: all of it comes back from the journal
    b.start()
    with Client(b) as c:  # a journal larger than page_above is located at recovery, not read into memory
        status = c.mgmt("READ", "store").body
        assert status["memory_bytes"] <= PAGE_ABOVE and status["paged_messages"] > COUNT // 3, status
        assert c.queue_depth("big") == COUNT - COUNT // 2
    got = [m.body["i"] for m in receive(b.address, "big", COUNT - COUNT // 2, timeout=30)]
    assert got == list(range(COUNT // 2, COUNT))
    with Client(b) as c:
        assert c.queue_depth("big") == 0


@pytest.mark.slow
def test_a_purge_reads_paged_messages_back_a_batch_at_a_time_and_is_journalled(broker_factory):
    """PURGE drops the paged messages too without ever holding them in memory together: the broker's peak
    memory hardly moves (the 30 MB of bodies would come back whole otherwise). What a consumer holds stays,
    and so does what a producer sends meanwhile: the purge takes the oldest, counted, and the rest is there,
    in order, after a restart (the purge is journalled)."""
    b = broker_factory(store={"page_above": PAGE_ABOVE, "segment_bytes": 4 * 1024 * 1024},
                       limits={"memory_limit": 10_000_000})
    _flood(b)
    extra = [Message(body={"i": COUNT + i, "pad": BODY}, durable=True) for i in range(3000)]
    with Client(b) as c:
        wait_for(lambda: c.mgmt("READ", "store").body["paged_messages"] > COUNT * 0.8, 10, message="paging")
        held = c.receiver("big").receive(timeout=10)  # acquired, not settled: the purge leaves it
        assert held.body["i"] == 0
        peak = peak_rss(b.pid)
        producer = threading.Thread(target=send_all, args=(b.address, "big", extra), kwargs={"timeout": 60})
        producer.start()
        purged = c.mgmt("PURGE", "queue", "big", timeout=60).body["purged"]
        growth = peak_rss(b.pid) - peak
        producer.join(timeout=90)
        assert purged >= COUNT - 1 and c.queue_depth("big") == COUNT + len(extra) - purged
    print(f"peak RSS growth while purging {purged} of {COUNT} paged 1 KB messages: {growth / 1e6:.1f} MB")
    assert growth < 10_000_000
    b.kill()
    b.start()
    left = COUNT + len(extra) - purged
    assert [m.body["i"] for m in receive(b.address, "big", left, timeout=30)] == [0, *range(purged + 1, COUNT + 3000)]
    with Client(b) as c:
        assert c.queue_depth("big") == 0


@pytest.mark.slow
def test_large_paged_messages_come_back_a_quarter_of_page_above_at_a_time(broker_factory):
    """A consumer of a paging queue of 100 KB messages has them read back a quarter of page_above at a time,
    not up to a thousand at once (all 27 MB paged here; 100 MB of such messages): the broker's peak memory
    grows by less than page_above while a slow consumer takes half the queue, and a consumer with more credit
    than a read-back brings still gets the rest, in order."""
    b = broker_factory(store={"page_above": PAGE_ABOVE, "segment_bytes": 4 * 1024 * 1024})
    n, pad = 300, "x" * 100_000  # 30 MB
    send_all(b.address, "large", [Message(body={"i": i, "pad": pad}, durable=True) for i in range(n)], timeout=60)
    with Client(b) as c:
        wait_for(lambda: c.mgmt("READ", "store").body["paged_messages"] > n // 2, 10, message="paging")
        peak = peak_rss(b.pid)
        slow = c.receiver("large")
        got = [r.body["i"] for _ in range(n // 20) for r in slow.receive_n(10)]  # 10 in flight at a time
        growth = peak_rss(b.pid) - peak
    print(f"peak RSS growth while a consumer took {n // 2} of {n} paged 100 KB messages: {growth / 1e6:.1f} MB")
    assert growth < PAGE_ABOVE
    got += [m.body["i"] for m in receive(b.address, "large", n - n // 2, timeout=30)]  # credit for all of them
    assert got == list(range(n))


@pytest.mark.slow
def test_without_paging_the_same_flood_holds_the_bodies(broker_factory):
    """The control: the bound above means something."""
    b = broker_factory()
    assert _flood(b) > 30_000_000


@pytest.mark.slow
def test_backups_page_too_and_a_promoted_backup_serves_its_paged_messages_in_order(ha_cluster):
    c = ha_cluster(size=3, extra={"store": {"page_above": PAGE_ABOVE, "segment_bytes": 4 * 1024 * 1024}})
    p = c.start_cluster()
    n = COUNT // 2
    send_all(c.public, "big", [Message(body={"i": i, "pad": BODY}, durable=True) for i in range(n)], timeout=120)
    for b in (c[1], c[2]):
        status = wait_for(lambda: (s := c.request(b, "READ", "store"))["paged_messages"] > n * 0.7 and s, 15,
                          message=f"{b.name} paging")
        assert status["memory_bytes"] <= PAGE_ABOVE, status
    first = [m.body["i"] for m in receive(c.public, "big", n // 3, timeout=30)]  # dequeues reach paged copies
    assert first == list(range(n // 3))
    for b in (c[1], c[2]):
        c.wait_depth(b, "big", n - n // 3)
    c.kill(p)
    c.promote(c[1])
    rest = [m.body["i"] for m in receive(c.public, "big", n - n // 3, timeout=30)]
    assert rest == list(range(n // 3, n))


def test_browsers_and_selector_consumers_reach_paged_messages(broker_factory):
    """A browser, or a selector consumer, that reaches the end of what a paging queue holds in memory reads
    the paged messages back: it sees every message, and a drain is answered only at the real end."""
    from proton.reactor import Copy, Selector
    n = 4000
    b = broker_factory(store={"page_above": 300_000, "segment_bytes": 1024 * 1024})
    send_all(b.address, "paged", [Message(body={"i": i, "pad": BODY}, durable=True, properties={"i": i})
                                  for i in range(n)], timeout=60)
    with Client(b) as c:
        wait_for(lambda: c.mgmt("READ", "store").body["paged_messages"] > n // 2, 10, message="paging")
        browser = c.receiver("paged", options=Copy())
        assert [r.body["i"] for r in browser.drain(n + 10, timeout=30)] == list(range(n))
        last = c.receiver("paged", options=Selector(f"i >= {n - 2}"))
        assert [r.body["i"] for r in last.drain(10, timeout=30)] == [n - 2, n - 1]
        assert c.queue_depth("paged") == n
    # the selector consumer's two went back with its connection, to their place
    assert [m.body["i"] for m in receive(b.address, "paged", n, timeout=30)] == list(range(n))


def test_consumers_holding_a_thousand_unsettled_still_get_the_paged_messages(broker_factory):
    """Messages a consumer holds unsettled stay in memory but are not available to anyone: a paging queue
    reads the paged ones back for the credit left, however many are held. A consumer granting 1500 gets
    1500, and another's drain gets the next ones, not an empty answer while thousands are on the queue."""
    n = 4000
    b = broker_factory(store={"page_above": 300_000, "segment_bytes": 1024 * 1024})
    send_all(b.address, "paged", [Message(body={"i": i, "pad": BODY}, durable=True) for i in range(n)], timeout=60)
    with Client(b) as c:
        wait_for(lambda: c.mgmt("READ", "store").body["paged_messages"] > n // 2, 10, message="paging")
        holder = c.receiver("paged")
        held = holder.receive_n(1500, timeout=30, settle=None)
        assert [r.body["i"] for r in held] == list(range(1500))
        other = c.receiver("paged")
        assert [r.body["i"] for r in other.drain(10, timeout=30)] == list(range(1500, 1510))
        assert c.queue_depth("paged") == n
