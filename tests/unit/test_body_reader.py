"""_pn's reader (the input of every AMQP connection, before proton): a large message's body is kept out of
proton and handed to the broker whole, byte for byte, whatever the frames, the pieces the bytes come in,
detaches, session ends and aborts in the middle of a delivery, and reused handles and channels.

In process: a proton client's output is fed to a server transport through the reader (`_pn.feed`) in
random pieces, and the server's events are read with `_pn.drain`, as the broker does. Three seeds run
here; HAQUEUE_READER_SEEDS=n runs n more.
"""
from __future__ import annotations

import os
import random
import tracemalloc
from typing import Any

import pytest
from cproton_ffi import ffi, lib
from proton import Collector, Connection, Delivery, Endpoint, Event, Message, Transport

from haqueue.broker import _pn, proton_adapter

ACCEPTED = proton_adapter.ACCEPTED


def address(obj) -> int:
    return proton_adapter.address(obj._impl)


class Pair:
    """A proton client and a server transport whose input goes through a reader, pumped by hand."""

    def __init__(self, rng: random.Random, client_frame: int, server_frame: int, limit: int = 0) -> None:
        self.rng = rng
        self.server = Transport(Transport.SERVER)
        self.server.max_frame_size = server_frame
        self.server_conn = Connection()
        self.server_events = Collector()
        self.server_conn.collect(self.server_events)
        self.server.bind(self.server_conn)
        self.reader = _pn.reader(limit)
        self.client = Transport()
        self.client.max_frame_size = client_frame
        self.conn = Connection()
        self.conn.container = "fuzz"
        self.client_events = Collector()
        self.conn.collect(self.client_events)
        self.client.bind(self.conn)
        self.received: dict[bytes, list[bytes]] = {}  # by link name, the bodies the server took
        self.raw: list[tuple[bytes, bool]] = []  # (link name, aborted) of deliveries drain left to the broker
        self.lost: list[str] = []
        self.conn.open()

    def pump(self) -> None:
        """Until nothing moves: the client's output to the server in random pieces, the server's back."""
        for _ in range(10_000):
            moved = False
            pending = self.client.pending()
            if pending > 0:
                data = self.client.peek(pending)
                self.client.pop(pending)
                at = 0
                while at < len(data):
                    n = self.rng.choice([1, 2, 3, 7, 8, 9, 64, 1000, 16_384, 70_000, len(data)])
                    assert _pn.feed(address(self.server), self.reader, data[at:at + n]), \
                        _pn.reader_error(self.reader)
                    at += n
                moved = True
            self.serve()
            pending = self.server.pending()
            if pending > 0:
                self.client.push(self.server.peek(pending))
                self.server.pop(pending)
                moved = True
            while self.client_events.peek() is not None:
                self.client_events.pop()
            if not moved:
                return
        raise AssertionError("the pair never settled")

    def serve(self) -> None:
        """The server's events through _pn.drain, as the broker reads them."""
        collector = address(self.server_events)
        while True:
            items = _pn.drain(collector, 0)
            if not items:
                return
            for item in items:
                if item[0] == _pn.EVENT:
                    self.kept(self.server_events.peek())
                    self.server_events.pop()
                elif item[0] == _pn.TRANSFER:
                    self.received.setdefault(self.name(item[1]), []).append(item[3])
                    _pn.settle(item[2], ACCEPTED)
                elif item[0] == _pn.RAW:
                    delivery = ffi.cast("pn_delivery_t *", item[2])
                    self.raw.append((self.name(item[1]), bool(lib.pn_delivery_aborted(delivery))))
                    if lib.pn_delivery_aborted(delivery):
                        lib.pn_delivery_settle(delivery)
                elif item[0] == _pn.LOST:
                    self.lost.append(item[3])

    @staticmethod
    def name(link: int) -> bytes:
        return ffi.string(lib.pn_link_name(ffi.cast("pn_link_t *", link)))

    @staticmethod
    def kept(event) -> None:
        if event.type == Event.CONNECTION_REMOTE_OPEN:
            event.connection.open()
        elif event.type == Event.SESSION_REMOTE_OPEN:
            event.session.open()
        elif event.type == Event.SESSION_REMOTE_CLOSE:
            event.session.close()
        elif event.type == Event.LINK_REMOTE_OPEN:
            event.link.open()
            event.link.flow(1000)
        elif event.type in (Event.LINK_REMOTE_CLOSE, Event.LINK_REMOTE_DETACH):
            event.link.close()

    def state(self) -> tuple[int, int, int]:
        return _pn.reader_state(self.reader)


def body(rng: random.Random, size: int) -> bytes:
    """Random bytes, or (half the time) an AMQP message, whose data section lets the reader size its buffer."""
    raw = rng.randbytes(size)
    return Message(body=raw).encode() if rng.random() < 0.5 else raw


def send_in_pieces(sender, data: bytes, pieces: int) -> Delivery:
    delivery = sender.delivery(os.urandom(8))
    step = max(1, len(data) // pieces)
    for at in range(0, len(data), step):
        sender.send(data[at:at + step])
    return delivery


def run_seed(seed: int) -> None:
    rng = random.Random(seed)
    frame = rng.choice([4096, 17_000, 65_536, 65_536, 1 << 20])
    pair = Pair(rng, rng.choice([512, 65_536, 1 << 20]), frame)
    session = pair.conn.session()
    session.open()
    names = [f"link-{i}".encode() for i in range(3)]
    senders = {}
    for name in names:
        senders[name] = session.sender(name.decode())
        senders[name].open()
    pair.pump()
    expected: dict[bytes, list[bytes]] = {name: [] for name in names}
    for step in range(40):
        name = rng.choice(names)
        sender = senders[name]
        what = rng.random()
        size = rng.choice([0, 1, 16, 100, 16_383, 16_384, 70_000, 300_000, 1_000_000, 3_000_000])
        data = body(rng, size)
        if what < 0.1 and size > 3 * frame:
            # detached in the middle of a delivery; a new link takes the same handle
            delivery = send_in_pieces(sender, data[:len(data) // 2], 2)
            pair.pump()
            sender.close()
            pair.pump()
            sender = senders[name] = session.sender(name.decode())
            sender.open()
            pair.pump()
            assert pair.state()[1] == 0, "a detached link's delivery was still followed"
            continue
        if what < 0.2 and size > 3 * frame:
            # aborted in the middle
            delivery = send_in_pieces(sender, data[:len(data) // 2], 3)
            pair.pump()
            delivery.abort()
            pair.pump()
            continue
        if what < 0.25 and size > 3 * frame:
            # the session ended in the middle; the links start again on a new one (the channel reused)
            send_in_pieces(sender, data[:len(data) // 2], 2)
            pair.pump()
            session.close()
            pair.pump()
            assert pair.state()[1] == 0, "an ended session's delivery was still followed"
            session = pair.conn.session()
            session.open()
            for n in names:
                senders[n] = session.sender(n.decode())
                senders[n].open()
            pair.pump()
            continue
        delivery = send_in_pieces(sender, data, rng.choice([1, 2, 5]))
        sender.advance()
        expected[name].append(data)
        if rng.random() < 0.5:
            pair.pump()
    pair.pump()
    assert pair.lost == []
    for name in names:
        got = pair.received.get(name, [])
        assert len(got) == len(expected[name]), (name, [len(g) for g in got], [len(e) for e in expected[name]])
        for i, (g, e) in enumerate(zip(got, expected[name])):
            assert g == e, f"{name!r} message {i}: {len(g)} bytes received, {len(e)} sent"
    assembled, following, waiting = pair.state()
    assert (following, waiting) == (0, 0)
    if any(len(e) > 2 * frame and frame >= 17_000 for es in expected.values() for e in es):
        assert assembled > 0, "no body went through the reader"


@pytest.mark.parametrize("seed", [1, 2, 3] + list(range(100, 100 + int(os.environ.get("HAQUEUE_READER_SEEDS", "0")))))
def test_bodies_arrive_whole_through_the_reader(seed):
    run_seed(seed)


def attached(rng: random.Random) -> tuple["Pair", Any, Any]:
    """A connection through the reader (64 KiB frames both ways) with a session and a sender "a" attached."""
    pair = Pair(rng, 65_536, 65_536)
    session = pair.conn.session()
    session.open()
    sender = session.sender("a")
    sender.open()
    pair.pump()
    return pair, session, sender


def assert_a_new_link_gets_whole_messages(pair: "Pair", session, rng: random.Random) -> None:
    """A link attached on the handle (or channel) a cut-off delivery used gets its next message whole."""
    again = session.sender("a")
    again.open()
    pair.pump()
    data = rng.randbytes(400_000)
    send_in_pieces(again, data, 3)
    again.advance()
    pair.pump()
    assert pair.received[b"a"] == [data]


def test_detach_mid_delivery_then_reused_handle_gets_whole_messages():
    """The bug that corrupted messages once: a link detached in the middle of a large delivery, the peer
    attaches a new link that reuses the handle, and its next message must arrive whole (not its last frame)."""
    rng = random.Random(7)
    pair, session, sender = attached(rng)
    send_in_pieces(sender, rng.randbytes(500_000), 4)
    pair.pump()
    assert pair.state()[1] == 1  # followed
    sender.close()
    pair.pump()
    assert pair.state()[1] == 0
    assert_a_new_link_gets_whole_messages(pair, session, rng)


def test_aborted_delivery_is_dropped_and_the_next_one_whole():
    rng = random.Random(8)
    pair, session, sender = attached(rng)
    delivery = send_in_pieces(sender, rng.randbytes(300_000), 3)
    pair.pump()
    delivery.abort()
    pair.pump()
    assert pair.state()[1:] == (0, 0)
    assert pair.raw == [(b"a", True)]
    data = rng.randbytes(200_000)
    send_in_pieces(sender, data, 2)
    sender.advance()
    pair.pump()
    assert pair.received[b"a"] == [data]


def test_over_the_limit_body_is_dropped_and_reported_with_its_size():
    rng = random.Random(9)
    pair = Pair(rng, 65_536, 65_536, limit=100_000)
    session = pair.conn.session()
    session.open()
    sender = session.sender("a")
    sender.open()
    pair.pump()
    send_in_pieces(sender, rng.randbytes(300_000), 3)
    sender.advance()
    pair.pump()
    assert pair.raw == [(b"a", False)]
    assert b"a" not in pair.received
    assert pair.state()[1:] == (0, 0)


def test_a_message_shaped_like_a_token_is_a_message():
    """A 16-byte message (the token's size) is read as what it is."""
    pair, session, sender = attached(random.Random(10))
    for data in (bytes(16), b"\xff" * 16):
        send_in_pieces(sender, data, 1)
        sender.advance()
    pair.pump()
    assert pair.received[b"a"] == [bytes(16), b"\xff" * 16]


def frame(channel: int, performative: bytes, payload: bytes = b"") -> bytes:
    body = performative + payload
    return (8 + len(body)).to_bytes(4, "big") + bytes([2, 0]) + channel.to_bytes(2, "big") + body


def test_a_performative_it_cannot_read_mid_delivery_fails_the_connection():
    """A transfer whose descriptor is a ulong (not the small form) in the middle of an assembled delivery:
    the connection fails with a reason, never a body made of the wrong bytes."""
    pair, session, sender = attached(random.Random(11))
    send_in_pieces(sender, random.Random(1).randbytes(200_000), 2)
    pair.pump()
    assert pair.state()[1] == 1
    # transfer(handle=0, more=false) described by ulong 0x14
    odd = frame(0, b"\x00\x80" + (0x14).to_bytes(8, "big") + b"\xc0\x02\x01\x43", b"x" * 10)
    assert not _pn.feed(address(pair.server), pair.reader, odd)
    assert "could not read" in _pn.reader_error(pair.reader)


def test_a_performative_it_cannot_read_otherwise_passes_to_proton():
    """With no delivery assembled, a frame the reader cannot read reaches proton unchanged: proton decides."""
    pair = Pair(random.Random(12), 65_536, 65_536)
    session = pair.conn.session()
    session.open()
    pair.pump()
    odd = frame(0, b"\x00\x80" + (0x14).to_bytes(8, "big") + b"\xc0\x02\x01\x43", b"x" * 10)
    assert _pn.feed(address(pair.server), pair.reader, odd)
    assert _pn.reader_error(pair.reader) is None


def test_session_ended_mid_delivery_then_reused_channel_gets_whole_messages():
    """A session ended in the middle of a large delivery (its links with it): a new session takes the
    channel, a new link the handle, and its next message arrives whole."""
    rng = random.Random(13)
    pair, session, sender = attached(rng)
    send_in_pieces(sender, rng.randbytes(500_000), 4)
    pair.pump()
    assert pair.state()[1] == 1
    session.close()
    pair.pump()
    assert pair.state()[1] == 0
    session = pair.conn.session()
    session.open()
    assert_a_new_link_gets_whole_messages(pair, session, rng)


def test_a_delivery_whose_body_is_gone_is_reported_alone():
    """A delivery drain cannot read (here: its body dropped with the reader before drain ran) comes as a
    LOST item naming why, and the messages around it in the same batch are still delivered."""
    rng = random.Random(14)
    pair = Pair(rng, 65_536, 65_536)
    session = pair.conn.session()
    session.open()
    big, small = session.sender("big"), session.sender("small")
    big.open()
    small.open()
    pair.pump()
    send_in_pieces(small, b"before", 1)
    small.advance()
    send_in_pieces(big, rng.randbytes(300_000), 3)
    big.advance()
    send_in_pieces(small, b"after", 1)
    small.advance()
    while pair.client.pending() > 0:  # all of it read, none of it drained
        data = pair.client.peek(pair.client.pending())
        pair.client.pop(len(data))
        assert _pn.feed(address(pair.server), pair.reader, data)
    assert pair.state()[2] == 1  # the body, waiting for drain
    pair.reader = _pn.reader(0)  # the old one goes, and the body it held with it
    pair.serve()
    assert pair.received[b"small"] == [b"before", b"after"]
    assert b"big" not in pair.received
    assert len(pair.lost) == 1 and "lost the body" in pair.lost[0], pair.lost


def test_an_empty_frame_with_an_extended_header_mid_delivery_is_passed_on():
    """A heartbeat (no body) whose header is extended, in the middle of an assembled delivery, is no frame
    the reader fails to read: it goes to proton, and the message still arrives whole."""
    rng = random.Random(15)
    pair, session, sender = attached(rng)
    data = rng.randbytes(300_000)
    send_in_pieces(sender, data[:150_000], 2)
    pair.pump()
    assert pair.state()[1] == 1
    assert _pn.feed(address(pair.server), pair.reader, (12).to_bytes(4, "big") + bytes([3, 0, 0, 0]) + bytes(4))
    sender.send(data[150_000:])
    sender.advance()
    pair.pump()
    assert pair.received[b"a"] == [data]



def open_all(server: proton_adapter.ProtonConnection, client: Transport) -> None:
    """Client and server exchange what they have until neither has output; the server opens every endpoint the
    client opened and gives each link credit."""
    for _ in range(100):
        moved = client_to(server, client)
        lib.pn_connection_open(server.ptr)
        session = lib.pn_session_head(server.ptr, 0)
        while session != ffi.NULL:
            lib.pn_session_open(session)
            session = lib.pn_session_next(session, 0)
        link = lib.pn_link_head(server.ptr, 0)
        while link != ffi.NULL:
            if not lib.pn_link_state(link) & lib.PN_LOCAL_ACTIVE:
                lib.pn_link_open(link)
                lib.pn_link_flow(link, 10)
            link = lib.pn_link_next(link, 0)
        while chunk := server.peek_output():
            client.push(chunk)
            server.pop_output(len(chunk))
            moved = True
        if not moved:
            return
    raise AssertionError("the pair never settled")


def client_to(server: proton_adapter.ProtonConnection, client: Transport) -> bool:
    """All the client's output through the server's reader (ProtonConnection.push); whether there was any."""
    moved = False
    while (pending := client.pending()) > 0:
        assert server.push(bytes(client.peek(pending)))
        client.pop(pending)
        moved = True
    return moved

def test_a_released_connection_frees_its_bodies_while_still_referenced():
    """The bodies a connection's reader holds (one half read, one whole that drain has not taken) are freed
    when the connection is released, as proton's buffers are, even while something still refers to its
    ProtonConnection (say a reference cycle, which the broker's rare cyclic collections leave for long)."""
    rng = random.Random(16)
    collector = lib.pn_collector()
    server = proton_adapter.ProtonConnection(collector, 65_536, 0)
    client = Transport()
    conn = Connection()
    client.bind(conn)
    conn.open()
    session = conn.session()
    session.open()
    whole, half = session.sender("whole"), session.sender("half")
    whole.open()
    half.open()
    open_all(server, client)
    tracemalloc.start()
    try:
        send_in_pieces(whole, Message(body=rng.randbytes(2_000_000)).encode(), 4)
        whole.advance()
        send_in_pieces(half, Message(body=rng.randbytes(3_000_000)).encode()[:1_500_000], 3)
        client_to(server, client)
        assert _pn.reader_state(server.reader)[1:] == (1, 1)  # one followed, one waiting for drain
        held = tracemalloc.get_traced_memory()[0]
        server.release()
        freed = held - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        lib.pn_collector_free(collector)
    assert _pn.reader_state(server.reader)[1:] == (0, 0)
    assert freed >= 4_000_000, f"{freed} bytes freed by the release"
