"""Large messages through a broker, compared byte for byte: 64 KB, 1 MB and 10 MB bodies; a message in
thousands of frames and socket reads each way; a multi-frame transfer aborted half way; a consumer whose
socket fills up gets every message once it reads; a publisher of large messages is given credit for
a few megabytes of them, not for 2,000."""
from __future__ import annotations

import os

import pytest
from proton import Delivery, Endpoint, Message

from clients import Client, RawAmqp

pytestmark = pytest.mark.timeout(120)

KB, MB = 1024, 1024 * 1024
SIZES = pytest.mark.parametrize("size", [64 * KB, MB, 10 * MB], ids=["64KB", "1MB", "10MB"])


def body(size: int) -> bytes:
    """Random bytes: a piece misplaced, doubled or lost anywhere would show."""
    return os.urandom(size)


def received_bodies(c: Client, address: str, n: int) -> list[bytes]:
    got = c.receiver(address, credit=n).receive_n(n, timeout=90)
    return [bytes(r.body) for r in got]


@SIZES
def test_bodies_arrive_byte_for_byte(broker, size):
    sent = [body(size) for _ in range(3)]
    with Client(broker, timeout=90) as c:
        c.send("q.large", [Message(body=b) for b in sent], timeout=90)
        assert received_bodies(c, "q.large", 3) == sent


def test_a_message_in_thousands_of_frames_each_way(broker_factory):
    """512-byte frames to the broker and from it: a 1 MB message is 2,000 transfers and as many reads
    each way, interleaved with another link's on the same connection."""
    b = broker_factory(listen=[{"address": "127.0.0.1:0", "max_frame_size": 512}])
    with Client(b, timeout=90, max_frame_size=512) as c:
        assert c.remote_max_frame_size == 512
        first, second = c.sender("q.frames.a"), c.sender("q.frames.b")
        a, b2 = body(MB), body(MB + 333)
        deliveries = [first.link.send(Message(body=a)), second.link.send(Message(body=b2)),
                      first.link.send(Message(body=b"small"))]
        c.wait(lambda: all(d.settled for d in deliveries), 90, "settlement")
        assert received_bodies(c, "q.frames.a", 2) == [a, b"small"]
        assert received_bodies(c, "q.frames.b", 1) == [b2]


def test_a_multi_frame_transfer_aborted_half_way_leaves_nothing(broker_factory):
    """The broker holds the first half of a 1 MB message in 4 KB frames; the client aborts it and sends
    another large message on the same link: only that one is queued, intact."""
    b = broker_factory(listen=[{"address": "127.0.0.1:0", "max_frame_size": 4096}])
    with Client(b, timeout=60) as c:
        snd = c.sender("q.aborted")
        aborted = snd.link.delivery("aborted-1")
        snd.link.stream(Message(body=body(MB)).encode()[:MB // 2])
        c.wait(lambda: c.transport.pending() <= 0, 10, "half the message to be written")
        aborted.abort()
        after = body(MB)
        c.send("q.aborted", [Message(body=after)], timeout=60)
        assert c.queue_depth("q.aborted") == 1
        assert received_bodies(c, "q.aborted", 1) == [after]


def test_a_consumer_whose_socket_fills_up_gets_every_message(broker_factory):
    """24 MB for a consumer that granted all its credit at once and reads nothing meanwhile: the broker
    holds back once more than limits.output_buffer waits for the socket, and goes on as the consumer
    reads (it stopped for good: the consumer grants no more credit, so nothing woke it)."""
    b = broker_factory(limits={"output_buffer": 16384})  # under the 64 KB that fit a frame of the consumer's
    sent = [body(MB) for _ in range(24)]
    raw = RawAmqp(b.host, b.port, max_frame_size=65536)  # in 1 MB frames its transport drops input
    raw.open()
    session = raw.conn.session()
    session.open()
    rcv = session.receiver("slow-reader")
    rcv.source.address = "q.slow"
    rcv.open()
    rcv.flow(len(sent))
    assert raw.pump(lambda: rcv.state & Endpoint.REMOTE_ACTIVE, timeout=10), "the receiver was not attached"
    with Client(b, timeout=60) as c:
        c.send("q.slow", [Message(body=x) for x in sent], timeout=60)
        c.roundtrip()  # the broker has dispatched what it could while the consumer did not read
    got: list[bytes] = []

    def read_whole() -> bool:
        while rcv.current is not None and not rcv.current.partial:
            delivery = rcv.current
            message = Message()
            message.decode(rcv.recv(delivery.pending))
            got.append(bytes(message.body))
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()
            rcv.advance()
        return len(got) >= len(sent)

    raw.pump(read_whole, timeout=60)
    raw.close()
    assert len(got) == len(sent) and got == sent


def test_a_publisher_of_large_messages_holds_credit_for_megabytes_not_thousands(broker):
    """Credit for 2,000 messages of 1 MB let a publisher push gigabytes at the broker; it now holds
    about 16 MiB worth once the broker has seen its messages' size, while small messages keep 2,000."""
    with Client(broker, timeout=60) as c:
        small = c.sender("q.credit.small")  # alone: publishers sending at once share a window of 2,000
        sent = [small.link.send(Message(body=b"x" * 100)) for _ in range(1000)]
        c.wait(lambda: all(d.settled for d in sent), 60, "settlement")
        c.roundtrip()
        assert small.link.credit >= 1000, small.link.credit
        big = c.sender("q.credit.big")
        sent = [big.link.send(Message(body=body(MB))) for _ in range(40)]
        c.wait(lambda: all(d.settled for d in sent), 60, "settlement")
        c.roundtrip()
        assert 2 <= big.link.credit <= 16, big.link.credit
