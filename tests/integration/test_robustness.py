"""What real clients do that is less tidy: pre-settled traffic, aborted deliveries, malformed
messages, clients that vanish with unsettled messages, many sessions, out-of-order releases."""
from __future__ import annotations

import pytest
from proton import Delivery, Described, Endpoint, Message, symbol
from proton.reactor import AtMostOnce

from clients import Client, RawAmqp, bodies, make_messages

pytestmark = pytest.mark.timeout(60)


def test_presettled_publish(broker):
    with Client(broker) as c:
        snd = c.sender("q.presettled", options=AtMostOnce())
        assert snd.link.snd_settle_mode == snd.link.SND_SETTLED
        for m in make_messages(10, prefix="ps"):
            d = snd.link.send(m)
            d.settle()
        c.roundtrip()  # the transfers came before this request on the same connection
        assert c.queue_depth("q.presettled") == 10
        assert bodies(c.receiver("q.presettled").receive_n(10)) == [f"ps-{i}" for i in range(10)]


def test_presettled_consume(broker):
    with Client(broker) as c:
        c.send("q.amo", make_messages(5, prefix="amo"))
        r = c.receiver("q.amo", options=AtMostOnce())
        got = r.receive_n(5, settle=None)
        assert bodies(got) == [f"amo-{i}" for i in range(5)]
        assert all(g.delivery.settled for g in got), "the broker did not pre-settle for an at-most-once receiver"
        c.roundtrip()
        assert c.queue_depth("q.amo") == 0


def test_out_of_order_releases_go_back_in_place(broker):
    with Client(broker) as a, Client(broker) as b:
        a.send("q.ooo", make_messages(6, prefix="o"))
        ra = a.receiver("q.ooo")
        held = ra.receive_n(5, settle=None)
        assert bodies(held) == [f"o-{i}" for i in range(5)]
        ra.release(held[3])
        ra.release(held[1])
        ra.accept(held[0])
        a.roundtrip()
        got = b.receiver("q.ooo").receive_n(3)
        assert bodies(got) == ["o-1", "o-3", "o-5"]


def test_vanished_consumer_messages_are_redelivered(broker):
    with Client(broker) as c:
        c.send("q.vanish", make_messages(3, prefix="gone"))
    raw = RawAmqp(broker.host, broker.port)
    raw.open()
    session = raw.conn.session()
    session.open()
    rcv = session.receiver("vanishing")
    rcv.source.address = "q.vanish"
    rcv.open()
    rcv.flow(3)
    assert raw.pump(lambda: rcv.queued >= 3, timeout=10), "raw receiver got nothing"
    raw.close()  # TCP gone, nothing settled
    with Client(broker) as c:
        got = c.receiver("q.vanish").receive_n(3)
        assert bodies(got) == [f"gone-{i}" for i in range(3)]


def test_aborted_delivery_is_discarded(broker_factory):
    b = broker_factory(listen=[{"address": "127.0.0.1:0", "max_frame_size": 4096}])
    with Client(b) as c:
        snd = c.sender("q.abort")
        big = Message(body=b"A" * 100_000).encode()
        d = snd.link.delivery("aborted-1")
        snd.link.stream(big[:50_000])  # several frames, no end
        c.wait(lambda: c.transport.pending() <= 0, 5, "the partial delivery to be written")
        d.abort()
        c.wait(lambda: c.transport.pending() <= 0, 5, "the abort to be written")
        c.send("q.abort", ["after abort"])
        assert c.queue_depth("q.abort") == 1
        assert bodies(c.receiver("q.abort").receive_n(1)) == ["after abort"]


def test_malformed_body_is_passed_through_or_rejected(broker):
    """The broker does not decode bodies: a body that lies about its size may be accepted, but
    then it must reach the consumer byte for byte, and nothing else may break."""
    bad = b"\x00\x53\x73\x45" + b"\x00\x53\x77\xb1\xff\xff\xff\xff"  # properties [], str32 claiming 4 GB
    with Client(broker) as c:
        d = c.send_raw("q.malformed", bad)
        if d.remote_state == Delivery.REJECTED:
            assert d.remote.condition is not None and d.remote.condition.name == "amqp:decode-error", \
                d.remote.condition
        else:
            assert d.remote_state == Delivery.ACCEPTED, d.remote_state
            [got] = c.receiver("q.malformed").receive_n(1)
            assert got.raw == bad
        c.send("q.malformed", ["fine"])
        assert bodies(c.receiver("q.malformed").receive_n(1)) == ["fine"]


def test_bytes_that_are_not_sections_are_rejected(broker):
    """Without a section structure the broker cannot find header or properties: reject
    (amqp:decode-error) instead of handing the bytes to a consumer."""
    with Client(broker) as c:
        d = c.send_raw("q.malformed2", b"this is not AMQP at all")
        assert d.remote_state == Delivery.REJECTED, d.remote_state
        assert d.remote.condition is not None and d.remote.condition.name == "amqp:decode-error"
        c.roundtrip()


def test_sender_detaches_with_unsettled_deliveries(broker):
    with Client(broker) as c:
        snd = c.sender("q.half")
        for m in make_messages(3, prefix="half"):
            snd.link.send(m)
        snd.close()
        c.roundtrip()
        depth = c.queue_depth("q.half")
        assert depth in (0, 3), depth  # the broker either took them all or none; never a partial message
        assert bodies(c.receiver("q.half").receive_n(depth)) == [f"half-{i}" for i in range(depth)]


def test_many_sessions_and_session_limit(broker_factory):
    b = broker_factory(limits={"max_sessions_per_connection": 4})
    with RawAmqp(b.host, b.port) as raw:
        raw.open()
        sessions = [raw.conn.session() for _ in range(6)]
        for s in sessions:
            s.open()
        raw.pump(lambda: raw.conn.state & Endpoint.REMOTE_CLOSED or
                 all(not (s.state & Endpoint.REMOTE_UNINIT) for s in sessions)
                 and sum(1 for s in sessions if s.state & Endpoint.REMOTE_ACTIVE) <= 4, timeout=10)
        if raw.conn.state & Endpoint.REMOTE_CLOSED:
            assert raw.conn.remote_condition.name == "amqp:resource-limit-exceeded"
        else:
            active = [s for s in sessions if s.state & Endpoint.REMOTE_ACTIVE]
            refused = [s for s in sessions if s.state & Endpoint.REMOTE_CLOSED]
            assert len(active) == 4 and len(refused) == 2, (len(active), len(refused))
            assert {s.remote_condition.name for s in refused} == {"amqp:resource-limit-exceeded"}
    with Client(b) as c:
        c.roundtrip()


def test_consumer_on_dynamic_queue_and_reply_after_requester_left(broker):
    """A reply to a dynamic queue whose owner has gone must not break the responder."""
    with Client(broker) as requester:
        reply_to = requester.receiver(None, dynamic=True, credit=1).address
    with Client(broker) as responder:
        d = responder.send_one(None, Message(address=reply_to, body="too late"))
        assert d.remote_state in (Delivery.ACCEPTED, Delivery.REJECTED, Delivery.RELEASED)
        responder.send("q.after-reply", ["responder still fine"])
        assert bodies(responder.receiver("q.after-reply").receive_n(1)) == ["responder still fine"]


def test_a_coordinator_refuses_what_is_not_a_declare_or_discharge(broker):
    from txn_client import control
    for body, condition, words in [("nonsense", "amqp:decode-error", "declare and discharge"),
                                   (Described(symbol("amqp:declare:list"), [b"global"]), "amqp:not-implemented",
                                    "only local transactions")]:
        reply = control(broker.url(), body)
        assert (reply.outcome, reply.condition) == ("commit_failed", condition), reply
        assert words in reply.description
    with Client(broker) as c:
        c.roundtrip()


def test_selector_filter_is_honoured_or_omitted(broker):
    from proton.reactor import Selector
    with Client(broker) as c:
        c.send("q.sel", [Message(body="red", properties={"color": "red"}),
                         Message(body="blue", properties={"color": "blue"})])
        r = c.receiver("q.sel", options=Selector("color = 'red'"))
        data = r.link.remote_source.filter
        data.rewind()
        granted = data.get_object() if data.next() else None
        if granted and any("selector" in str(k) for k in granted):
            assert [g.body for g in r.receive_n(1)] == ["red"]
        else:  # the broker said it does not filter: every message comes
            assert sorted(g.body for g in r.receive_n(2)) == ["blue", "red"]


def test_interleaved_large_messages_on_one_session(broker_factory):
    b = broker_factory(listen=[{"address": "127.0.0.1:0", "max_frame_size": 4096}])
    with Client(b, timeout=30) as c:
        s1, s2 = c.sender("q.inter.a"), c.sender("q.inter.b")
        pa, pb = b"a" * 700_000, b"b" * 900_000
        deliveries = [s1.link.send(Message(body=pa)), s2.link.send(Message(body=pb)),
                      s1.link.send(Message(body=pa[::-1])), s2.link.send(Message(body=b"small"))]
        c.wait(lambda: all(d.settled for d in deliveries), 30, "settlement")
        assert all(d.remote_state == Delivery.ACCEPTED for d in deliveries)
        assert [bytes(g.body) for g in c.receiver("q.inter.a").receive_n(2)] == [pa, pa[::-1]]
        assert [bytes(g.body) for g in c.receiver("q.inter.b").receive_n(2)] == [pb, b"small"]


def test_consuming_from_management_node_refused(broker):
    from proton.utils import LinkDetached
    with Client(broker) as c:
        try:
            r = c.receiver("$management", credit=1)
        except LinkDetached:
            pass
        else:
            r.expect_nothing(0.3)
        c.roundtrip()  # management still answers


def test_redelivery_after_consumer_loss_counts(broker):
    """After a consumer vanished holding a message, the message comes again; its delivery-count
    says it may have been seen (>= 1), or stays 0 if the broker treats the loss as a release."""
    with Client(broker) as c:
        c.send("q.lost", ["held"])
    raw = RawAmqp(broker.host, broker.port)
    raw.open()
    session = raw.conn.session()
    session.open()
    rcv = session.receiver("holder")
    rcv.source.address = "q.lost"
    rcv.open()
    rcv.flow(1)
    assert raw.pump(lambda: rcv.queued >= 1, timeout=10)
    raw.close()
    with Client(broker) as c:
        [got] = c.receiver("q.lost").receive_n(1)
        assert got.body == "held"
        assert got.message.delivery_count in (0, 1), got.message.delivery_count


@pytest.mark.slow
def test_connections_dropped_mid_message_give_their_memory_back(broker):
    """Each connection gone takes its memory with it, a message it was part way through included: 300
    clients each 200 KB into a message, then reset, leave the broker's RSS where it was."""
    import socket
    import struct
    from harness import rss, wait_for

    def crowd(n: int) -> None:
        raws = []
        for i in range(n):
            raw = RawAmqp(broker.host, broker.port)
            raw.open()
            raw.send_part_of_a_message(f"partial-{i}", "q.partial", 200_000)
            raw.pump(lambda: raw.transport.pending() <= 0, timeout=10)
            raws.append(raw)
        for raw in raws:
            raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset
            raw.close()

    crowd(50)  # what the broker allocates once is not a leak
    with Client(broker) as c:
        wait_for(lambda: c.mgmt("READ", "broker").body["connections"] == 1, 10, message="the warm-up gone")
        before = rss(broker.pid)
        crowd(300)
        wait_for(lambda: c.mgmt("READ", "broker").body["connections"] == 1, 10, message="the crowd gone")
        wait_for(lambda: rss(broker.pid) <= before * 1.1, 15,
                 message=f"RSS back within 10% of {before / 2 ** 20:.1f} MiB (now {rss(broker.pid) / 2 ** 20:.1f})")
        assert c.queue_depth("q.partial") == 0


@pytest.mark.slow
def test_a_message_held_at_the_front_keeps_no_consumed_ones_in_memory(broker):
    """A consumer that holds the oldest message and never settles it does not make the broker keep every
    message consumed after it: 40,000 1 KB messages through the queue behind it, and its RSS after the
    last 20,000 is where the first 20,000 left it. The held message stays on the queue, and goes back to it
    with its consumer."""
    from harness import rss
    from ha_harness import receive, send_all
    with Client(broker) as holder:
        send_all(broker.address, "q.held", ["first"])
        assert holder.receiver("q.held").receive(timeout=10).body == "first"  # acquired, never settled
        sizes = []
        for _ in range(4):
            send_all(broker.address, "q.held", ["x" * 1000] * 10_000, timeout=60)
            assert len(receive(broker.address, "q.held", 10_000, timeout=60)) == 10_000
            sizes.append(rss(broker.pid))
        print(f"RSS after each 10,000 consumed behind a held message: {[round(s / 2 ** 20, 1) for s in sizes]} MiB")
        assert sizes[3] - sizes[1] < 6 << 20  # each 10,000 kept would add 12 MB
        assert holder.queue_depth("q.held") == 1
    assert [m.body for m in receive(broker.address, "q.held", 1, timeout=10)] == ["first"]
