"""Large bodies through the broker's reader (_pn.c), over real sockets: a proton client whose byte stream is
written in random pieces, random max-frame sizes on both sides, several links on one connection, links
detached in the middle of a delivery and attached again (their handle reused), and every message compared
byte for byte at a consumer. Also through TLS (the reader reads the decrypted bytes). Three seeds run here;
HAQUEUE_FUZZ_SEEDS=n runs n more."""
from __future__ import annotations

import os
import random
import socket

import pytest
from proton import Endpoint, Message, SSLDomain

from clients import Client, RawAmqp
from tls_certs import CertificateAuthority

pytestmark = pytest.mark.timeout(300)

SEEDS = [1, 2, 3] + list(range(100, 100 + int(os.environ.get("HAQUEUE_FUZZ_SEEDS", "0"))))


class SplitWriter(RawAmqp):
    """RawAmqp whose output goes to the socket in random pieces, each its own send (TCP_NODELAY)."""

    def __init__(self, host: str, port: int, rng: random.Random, **kw) -> None:
        super().__init__(host, port, **kw)
        self.rng = rng
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _flush(self) -> None:
        while True:
            n = self.transport.pending()
            if n <= 0:
                return
            piece = min(n, self.rng.choice([1, 3, 8, 9, 100, 1000, 16_384, 65_536, 300_000]))
            try:
                sent = self.sock.send(self.transport.peek(piece))
            except (BlockingIOError, InterruptedError):
                self._read(0.01)  # the broker answers (flows, settlements) while it reads
                continue
            except OSError:
                self.transport.close_head()
                return
            self.transport.pop(sent)


def open_sender(raw: RawAmqp, session, name: str, address: str):
    snd = session.sender(name)
    snd.target.address = address
    snd.open()
    assert raw.pump(lambda: snd.credit > 0, timeout=30), f"no credit on {name}"
    return snd


def written(raw: RawAmqp) -> bool:
    return raw.transport.pending() <= 0


@pytest.mark.parametrize("seed", SEEDS)
def test_random_bodies_frames_and_pieces_arrive_whole(broker_factory, seed):
    rng = random.Random(seed)
    broker_frame = rng.choice([4096, 20_000, 65_536, 1 << 20])
    b = broker_factory(listen=[{"address": "127.0.0.1:0", "max_frame_size": broker_frame}])
    expected: dict[str, list[bytes]] = {}
    with SplitWriter(b.host, b.port, rng, max_frame_size=rng.choice([None, 512, 65_536])) as raw:
        raw.open()
        raw.wait_open()
        session = raw.conn.session()
        session.open()
        addresses = [f"q.fuzz.{seed}.{i}" for i in range(3)]
        senders = {a: open_sender(raw, session, f"fuzz-{a}", a) for a in addresses}
        deliveries = []
        for step in range(30):
            address = rng.choice(addresses)
            snd = senders[address]
            data = rng.randbytes(rng.choice([0, 10, 16_384, 70_000, 500_000, 2_000_000, 3_500_000]))
            encoded = Message(body=data).encode()
            assert raw.pump(lambda: snd.credit > 0, timeout=60), "no credit"
            if rng.random() < 0.15 and len(encoded) > 3 * broker_frame:
                # detached in the middle of a delivery, then attached again: the handle is reused
                snd.delivery(f"cut-{step}".encode())
                snd.stream(encoded[:len(encoded) // 2])
                assert raw.pump(lambda: written(raw), timeout=60)
                snd.close()
                assert raw.pump(lambda: snd.state & Endpoint.REMOTE_CLOSED, timeout=30), "detach unanswered"
                senders[address] = open_sender(raw, session, f"fuzz-{address}", address)
                continue
            delivery = snd.delivery(f"d-{step}".encode())
            snd.send(encoded)
            snd.advance()
            deliveries.append(delivery)
            expected.setdefault(address, []).append(data)
            if rng.random() < 0.5:
                raw.pump(lambda: written(raw), timeout=60)
        assert raw.pump(lambda: all(d.remote_state for d in deliveries), timeout=120), \
            f"{sum(not d.remote_state for d in deliveries)} of {len(deliveries)} messages unconfirmed"
        assert {d.remote_state for d in deliveries} == {deliveries[0].ACCEPTED}
    with Client(b, timeout=60) as c:
        for address, bodies in expected.items():
            got = [bytes(m.body) for m in c.receiver(address).receive_n(len(bodies))]
            assert [len(g) for g in got] == [len(e) for e in bodies], address
            assert got == bodies, address
            assert c.queue_depth(address) == 0
    assert b.running


def test_large_bodies_through_tls(broker_factory, tmp_path):
    """Through TLS the reader reads what TLS decrypted (Connection.received -> ProtonConnection.push)."""
    ca = CertificateAuthority(tmp_path, "ca")
    server = ca.issue("localhost")
    b = broker_factory(tls=server.config(), listen=[{"address": "127.0.0.1:0", "tls": True}])
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(ca.ca_file)
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER)
    rng = random.Random(5)
    bodies = [rng.randbytes(n) for n in (3_000_000, 100, 700_000, 70_000)]
    with Client(f"amqps://localhost:{b.port}", ssl_domain=domain, timeout=60) as c:
        c.send("q.tls.big", bodies)
        assert [bytes(m.body) for m in c.receiver("q.tls.big").receive_n(len(bodies))] == bodies


def test_a_frame_it_cannot_read_mid_message_closes_the_connection_saying_so(broker):
    """A transfer whose performative is not in the spec's small form, in the middle of a large message the
    broker is assembling: the connection is closed with a framing error naming it (no half message is
    queued), and the broker serves others."""
    with RawAmqp(broker.host, broker.port) as raw:
        raw.open()
        raw.wait_open()
        session = raw.conn.session()
        session.open()
        snd = open_sender(raw, session, "odd", "q.odd")
        snd.delivery(b"d")
        snd.stream(Message(body=b"p" * 500_000).encode()[:200_000])
        assert raw.pump(lambda: written(raw), timeout=30)
        # transfer(handle=0, more=false) described by the ulong 0x14 instead of the smallulong
        body = b"\x00\x80" + (0x14).to_bytes(8, "big") + b"\xc0\x02\x01\x43" + b"x" * 10
        raw.send_bytes((8 + len(body)).to_bytes(4, "big") + bytes([2, 0, 0, 0]) + body)
        assert raw.pump(lambda: raw.conn.state & Endpoint.REMOTE_CLOSED or raw.eof, timeout=30)
        condition = raw.condition
        assert condition is not None and condition.name == "amqp:connection:framing-error", condition
        assert "could not read" in condition.description, condition
    with Client(broker) as c:
        assert c.queue_depth("q.odd") == 0
        c.send("q.odd", ["alive"])
        assert [m.body for m in c.receiver("q.odd").receive_n(1)] == ["alive"]
