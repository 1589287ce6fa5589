"""Bad input: garbage, oversized frames, too many links, and a consumer that grants no credit.
In each case the broker deals with the offender and keeps serving everyone else."""
from __future__ import annotations

import socket

import pytest
from proton import Endpoint

from clients import AMQP_HEADER, Client, RawAmqp, bodies, frame, make_messages

pytestmark = pytest.mark.timeout(60)


def check_serving(broker, address: str = "q.alive") -> None:
    with Client(broker) as c:
        c.send(address, ["alive"])
        assert bodies(c.receiver(address).receive_n(1)) == ["alive"]


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    b"AMQP\x09\x09\x09\x09",                     # a protocol header for no known protocol
    bytes(range(256)) * 4,
])
def test_garbage_gets_header_and_close(broker, garbage):
    with Client(broker) as bystander:
        bystander.send("q.bystander", ["before"])
        with RawAmqp(broker.host, broker.port) as raw:
            raw.send_bytes(garbage)
            assert raw.read_until_eof(timeout=10), "the broker did not close the garbage connection"
            assert bytes(raw.received[:4]) == b"AMQP", bytes(raw.received[:16])
        bystander.send("q.bystander", ["after"])
        assert bodies(bystander.receiver("q.bystander").receive_n(2)) == ["before", "after"]
    assert broker.running


def test_garbage_after_a_valid_header(broker):
    with RawAmqp(broker.host, broker.port) as raw:
        raw.send_bytes(AMQP_HEADER + b"\xff" * 64)
        assert raw.read_until_eof(timeout=10)
        assert bytes(raw.received[:8]) == AMQP_HEADER
    check_serving(broker)


def test_connection_dropped_mid_frame(broker):
    s = socket.create_connection((broker.host, broker.port), timeout=5)
    s.sendall(AMQP_HEADER + b"\x00\x00\x01\x00\x02\x00\x00\x00" + b"\x00" * 20)  # half a frame
    s.close()
    check_serving(broker)


def test_frame_larger_than_max_frame_closes_connection(broker_factory):
    b = broker_factory(listen=[{"address": "127.0.0.1:0", "max_frame_size": 4096}])
    with Client(b) as bystander:
        with RawAmqp(b.host, b.port) as raw:
            raw.open()
            raw.wait_open()
            assert raw.transport.remote_max_frame_size == 4096
            raw.send_bytes(frame(b"\x00" * 10_000))  # 10 008 bytes > 4096
            raw.pump(lambda: raw.conn.state & Endpoint.REMOTE_CLOSED or raw.eof, timeout=10)
            assert raw.conn.state & Endpoint.REMOTE_CLOSED or raw.eof, "connection not closed"
            cond = raw.condition
            assert cond is not None and cond.name == "amqp:connection:framing-error", cond
        bystander.roundtrip()


def test_too_many_links_refused_clearly(broker_factory):
    limit = 100
    b = broker_factory(limits={"max_links_per_connection": limit})
    with Client(b) as bystander:
        with RawAmqp(b.host, b.port) as raw:
            raw.open()
            session = raw.conn.session()
            session.open()
            links = []
            for i in range(5000):
                snd = session.sender(f"link-{i}")
                snd.target.address = "q.links"
                snd.open()
                links.append(snd)

            def answered() -> bool:
                # a refused attach is answered by an attach then a detach: wait for both
                if raw.conn.state & Endpoint.REMOTE_CLOSED:
                    return True
                if any(lk.state & Endpoint.REMOTE_UNINIT for lk in links):
                    return False
                return sum(1 for lk in links if lk.state & Endpoint.REMOTE_ACTIVE) <= limit

            raw.pump(answered, timeout=40)
            if raw.conn.state & Endpoint.REMOTE_CLOSED:
                cond = raw.conn.remote_condition
                assert cond is not None and cond.name == "amqp:resource-limit-exceeded", cond
            else:
                assert not any(lk.state & Endpoint.REMOTE_UNINIT for lk in links), \
                    "the broker did not answer every attach"
                active = [lk for lk in links if lk.state & Endpoint.REMOTE_ACTIVE]
                refused = [lk for lk in links if lk.state & Endpoint.REMOTE_CLOSED]
                assert len(active) <= limit, len(active)
                assert len(active) + len(refused) == len(links)
                assert refused, "no link refused"
                conds = {lk.remote_condition.name if lk.remote_condition else None for lk in refused}
                assert conds == {"amqp:resource-limit-exceeded"}, conds
        bystander.send("q.links.other", ["still serving"])
        assert bodies(bystander.receiver("q.links.other").receive_n(1)) == ["still serving"]


def test_consumer_without_credit_does_not_block_others(broker):
    with Client(broker) as stingy, Client(broker) as eager, Client(broker) as producer:
        stingy.receiver("q.stingy", credit=0)
        r = eager.receiver("q.stingy", credit=0)
        producer.send("q.stingy", make_messages(10, prefix="s"))
        got = r.receive_n(10)
        assert bodies(got) == [f"s-{i}" for i in range(10)]


def test_consumer_holding_unsettled_does_not_block_others(broker):
    with Client(broker) as hoarder, Client(broker) as eager, Client(broker) as producer:
        h = hoarder.receiver("q.hoard", credit=3)
        producer.send("q.hoard", make_messages(3, prefix="h"))
        held = h.receive_n(3, settle=None, credit=False)
        assert len(held) == 3
        r = eager.receiver("q.hoard", credit=0)
        producer.send("q.hoard", make_messages(5, prefix="e"))
        assert bodies(r.receive_n(5)) == [f"e-{i}" for i in range(5)]


def test_many_connections_open_and_close(broker):
    for _ in range(30):
        with RawAmqp(broker.host, broker.port) as raw:
            raw.open()
            raw.wait_open(timeout=5)
    check_serving(broker)


def test_message_over_max_message_size_refused(broker_factory):
    from proton import Message
    from proton.utils import LinkDetached
    b = broker_factory(limits={"max_message_size": 1000})
    with Client(b) as c:
        c.send("q.size", [b"x" * 100])
        try:
            d = c.send_one("q.size", Message(body=b"y" * 5000))
            cond = d.remote.condition
        except LinkDetached as e:
            cond = e.condition
        name = getattr(cond, "name", cond)
        assert name == "amqp:link:message-size-exceeded", cond
        assert "limits.max_message_size 1000" in getattr(cond, "description", ""), cond
    with Client(b) as c:
        assert c.queue_depth("q.size") == 1
        assert bodies(c.receiver("q.size").receive_n(1)) == [b"x" * 100]


def test_large_message_over_max_message_size_refused_in_pieces(broker_factory):
    """A message larger than a read arrives in pieces: it is refused once past the limit, the broker
    holds none of it, and the client can publish again on a new link."""
    from proton import Message
    from proton.utils import LinkDetached
    b = broker_factory(limits={"max_message_size": 1_000_000})
    with Client(b, timeout=30) as c:
        try:
            d = c.send_one("q.size.big", Message(body=b"y" * 3_000_000))
            cond = d.remote.condition
        except LinkDetached as e:
            cond = e.condition
        assert getattr(cond, "name", cond) == "amqp:link:message-size-exceeded", cond
        c.send("q.size.big", [b"z" * 900_000])
        assert c.queue_depth("q.size.big") == 1
        assert [bytes(g.body) for g in c.receiver("q.size.big").receive_n(1)] == [b"z" * 900_000]
    assert b.running


def test_max_connections(broker_factory):
    from proton import ConnectionException
    b = broker_factory(limits={"max_connections": 3})
    clients = [Client(b) for _ in range(3)]
    try:
        with pytest.raises(ConnectionException) as e:
            extra = Client(b)
            try:
                extra.roundtrip()
            finally:
                extra.close()
        assert "resource-limit-exceeded" in str(e.value), str(e.value)
        clients.pop().close()
        with Client(b) as c:  # room again
            c.roundtrip()
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize("after_header", [
    frame(b"\xff" * 24),  # a body that is no AMQP encoding, before any open
    frame(b"\x00\x53\x10\xc0\x03\x01\xa1\x00") + frame(b"\x00\x53\x7f\x45"),  # an open, then an unknown performative
], ids=["undecodable", "unknown-performative"])
def test_unreadable_frame_closes_the_connection(broker, after_header):
    """proton stops reading such a connection without closing it: the broker must close it, not leave it open."""
    with socket.create_connection((broker.host, broker.port), timeout=10) as s:
        s.sendall(AMQP_HEADER + after_header)
        while s.recv(65536):
            pass  # until the broker closes (a timeout fails the test)
    assert "sent a frame that could not be read" in broker.log()
    check_serving(broker)
