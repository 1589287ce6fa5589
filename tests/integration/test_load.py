"""Several clients at once: concurrent producers and consumers lose and duplicate nothing, and a
consumer that stops reading its socket does not stall anyone else."""
from __future__ import annotations

import threading
import time

import pytest
from proton import Endpoint, Message

from clients import Client, RawAmqp, make_messages

pytestmark = pytest.mark.timeout(120)


def test_concurrent_producers_and_consumers(broker):
    producers, per_producer, consumers = 4, 500, 3
    total = producers * per_producer
    received: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    done = threading.Event()

    def produce(p: int) -> None:
        try:
            with Client(broker, timeout=60) as c:
                for start in range(0, per_producer, 100):
                    c.send("q.load", [Message(body=f"p{p}-{i}") for i in range(start, start + 100)], timeout=60)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    def consume() -> None:
        try:
            with Client(broker, timeout=60) as c:
                r = c.receiver("q.load", credit=50)
                while not done.is_set():
                    c.wait(lambda: r.available or done.is_set(), 0.2, None, raise_on_timeout=False)
                    while r.available:
                        got = r.handler.incoming.popleft()
                        r.accept(got)
                        with lock:
                            received.append(got.body)
                            if len(received) >= total:
                                done.set()
                    if r.credit < 25:
                        r.flow(50 - r.credit)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            done.set()

    threads = [threading.Thread(target=consume, daemon=True) for _ in range(consumers)]
    threads += [threading.Thread(target=produce, args=(p,), daemon=True) for p in range(producers)]
    for t in threads:
        t.start()
    done.wait(90)
    done.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(received) == total, f"{len(received)} of {total} received"
    assert len(set(received)) == total, "duplicates"
    with Client(broker) as c:
        assert c.queue_depth("q.load") == 0


def test_consumer_that_stops_reading_does_not_stall_others(broker):
    """A consumer with plenty of credit whose socket is never read again: the broker must stop
    writing to it (output buffer limit) and keep serving everyone else promptly."""
    payload = b"s" * (256 * 1024)
    with RawAmqp(broker.host, broker.port) as stuck:
        stuck.open()
        session = stuck.conn.session()
        session.open()
        rcv = session.receiver("stuck")
        rcv.source.address = "q.stuck"
        rcv.open()
        rcv.flow(10_000)
        assert stuck.pump(lambda: rcv.state & Endpoint.REMOTE_ACTIVE, timeout=10)
        # from here on `stuck` never reads its socket
        with Client(broker, timeout=30) as producer, Client(broker) as other:
            worst = 0.0
            for batch in range(8):  # 8 x 10 x 256 KiB = 20 MiB towards the stuck consumer
                producer.send("q.stuck", [payload] * 10, timeout=30)
                started = time.monotonic()
                other.send("q.other", [f"ping-{batch}"])
                worst = max(worst, time.monotonic() - started)
            assert worst < 2.0, f"a publish to another queue took {worst:.2f} s"
            got = other.receiver("q.other").receive_n(8)
            assert [g.body for g in got] == [f"ping-{i}" for i in range(8)]
            depth = other.queue_depth("q.stuck")
            assert depth > 0, "everything was written to a consumer that reads nothing"


def test_many_queues(broker):
    with Client(broker) as c:
        for i in range(200):
            c.send(f"q.many.{i}", [f"m{i}"])
        names = set(c.queue_names())
        assert {f"q.many.{i}" for i in range(200)} <= names
        for i in (0, 57, 199):
            assert c.receiver(f"q.many.{i}").receive_n(1)[0].body == f"m{i}"


def test_many_messages_sent_without_waiting(broker):
    """A burst of 5,000 unsettled transfers before the first settlement arrives."""
    with Client(broker, timeout=60) as c:
        c.send("q.burst", make_messages(5000, prefix="burst"), timeout=60)
        assert c.queue_depth("q.burst") == 5000


def test_many_connections_each_sending_more_than_a_pass_reads(broker):
    """Twenty connections publish at once, each a burst larger than its share of what the broker reads in
    one pass (at least 16 KiB of 512 KiB between them): what a pass leaves in a socket is read in the
    next ones, and every message arrives once, each producer's in the order it sent them."""
    producers, per_producer = 20, 40
    padding = "x" * 16_000
    errors: list[BaseException] = []
    together = threading.Barrier(producers)

    def produce(p: int) -> None:
        try:
            with Client(broker, timeout=60) as c:
                messages = [Message(body=f"p{p}-{i}-{padding}") for i in range(per_producer)]
                together.wait(30)  # every burst at once: many sockets ready in the same passes
                c.send("q.wide", messages, timeout=60)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(p,), daemon=True) for p in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, errors
    with Client(broker, timeout=60) as c:
        got = c.receiver("q.wide").receive_n(producers * per_producer, timeout=60)
        assert c.queue_depth("q.wide") == 0
    sent_by: dict[str, list[int]] = {}
    for g in got:
        producer, seq, _ = g.body.split("-", 2)
        sent_by.setdefault(producer, []).append(int(seq))
    assert sent_by == {f"p{p}": list(range(per_producer)) for p in range(producers)}


def test_publishers_sending_at_once_share_one_credit_window(broker):
    """A publisher alone is given credit for 2,000 messages; ten sending at once are given about that
    between them, a tenth each, not 2,000 each (receive_credit.py), and every message still arrives."""
    links, per_link = 10, 3000
    with Client(broker, timeout=60) as c:
        alone = c.sender("q.share.alone")
        sent = [alone.link.send(Message(body=f"m{n}")) for n in range(1000)]
        c.wait(lambda: all(d.settled for d in sent), 60, "settlement")
        c.roundtrip()
        assert alone.link.credit >= 1000, alone.link.credit
        senders = [c.sender(f"q.share.{i}") for i in range(links)]
        sent = [s.link.send(Message(body=f"m{n}")) for n in range(per_link) for s in senders]
        c.wait(lambda: all(d.settled for d in sent), 60, "settlement")
        c.roundtrip()
        held = [s.link.credit for s in senders]
        assert sum(held) <= 2 * 2000, held
        assert [c.queue_depth(f"q.share.{i}") for i in range(links)] == [per_link] * links
