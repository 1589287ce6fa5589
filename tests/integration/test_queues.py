"""Queues as a client sees them: counts, order, auto-create, browsing, relay, dynamic nodes,
credit, dispositions, TTL, limits, exclusive and auto-delete queues."""
from __future__ import annotations

import pytest
from proton import Delivery, Message, Timeout
from proton.handlers import MessagingHandler
from proton.reactor import Container, Copy
from proton.utils import BlockingConnection, LinkDetached

from clients import Client, bodies, make_messages
from harness import wait_for

pytestmark = pytest.mark.timeout(60)


def condition_name(exc_or_cond) -> str | None:
    cond = getattr(exc_or_cond, "condition", exc_or_cond)
    return getattr(cond, "name", cond)


# ---- basic send / receive -----------------------------------------------------------------

def test_send_receive_counts_and_order(broker):
    with Client(broker) as c:
        sent = make_messages(200, prefix="order")
        c.send("q.order", sent)
        assert c.queue_depth("q.order") == 200
        r = c.receiver("q.order")
        got = r.receive_n(200)
        assert bodies(got) == [m.body for m in sent]
        assert [g.message.id for g in got] == [m.id for m in sent]
        assert c.queue_depth("q.order") == 0


def test_send_receive_across_connections(broker):
    with Client(broker) as producer, Client(broker) as consumer:
        r = consumer.receiver("q.cross", credit=50)
        producer.send("q.cross", make_messages(50, prefix="x"))
        got = r.receive_n(50)
        assert bodies(got) == [f"x-{i}" for i in range(50)]


def test_competing_consumers_each_message_once(broker):
    with Client(broker) as p, Client(broker) as c1, Client(broker) as c2:
        r1 = c1.receiver("q.compete")
        r2 = c2.receiver("q.compete")
        p.send("q.compete", make_messages(40, prefix="c"))
        a = r1.receive_n(20)
        b = r2.receive_n(20)
        everything = sorted(bodies(a) + bodies(b), key=lambda s: int(s.split("-")[1]))
        assert everything == [f"c-{i}" for i in range(40)]
        # each consumer sees its share in queue order
        for part in (a, b):
            seq = [int(s.split("-")[1]) for s in bodies(part)]
            assert seq == sorted(seq)


def test_unknown_address_is_auto_created(broker):
    with Client(broker) as c:
        assert "brand.new" not in c.queue_names()
        c.send("brand.new", ["hello"])
        assert "brand.new" in c.queue_names()
        r = c.receiver("fresh.receiver.queue", credit=1)  # a receiver creates it too
        assert "fresh.receiver.queue" in c.queue_names()
        r.close()
        assert bodies(c.receiver("brand.new").receive_n(1)) == ["hello"]


def test_auto_create_patterns_refuse_other_addresses(broker_factory):
    b = broker_factory(auto_create=["auto.*"])
    with Client(b) as c:
        c.send("auto.one", ["ok"])  # matches the pattern
        with pytest.raises(LinkDetached) as e:
            c.receiver("other")
        assert condition_name(e.value) == "amqp:not-found", str(e.value)
    with Client(b) as c:
        with pytest.raises(LinkDetached) as e:
            c.sender("other")
        assert condition_name(e.value) == "amqp:not-found", str(e.value)
        assert "other" not in c.queue_names()
        assert bodies(c.receiver("auto.one").receive_n(1)) == ["ok"]


# ---- browsing -----------------------------------------------------------------------------

def test_browser_leaves_messages_on_queue(broker):
    with Client(broker) as c:
        c.send("q.browse", make_messages(5, prefix="b"))
        browser = c.receiver("q.browse", options=Copy())
        seen = browser.receive_n(5)
        assert bodies(seen) == [f"b-{i}" for i in range(5)]
        browser.close()
        assert c.queue_depth("q.browse") == 5
        # a second browser sees them all again, and a consumer then takes them all
        again = c.receiver("q.browse", options=Copy()).receive_n(5)
        assert bodies(again) == [f"b-{i}" for i in range(5)]
        got = c.receiver("q.browse").receive_n(5)
        assert bodies(got) == [f"b-{i}" for i in range(5)]
        assert c.queue_depth("q.browse") == 0


def test_blocking_browser_that_accepts_gets_every_message(broker):
    """Issue #12, point 1: a browser written as proton's blocking examples are (receive(), then accept())
    gets every message, with a credit window or with credit granted one at a time, and leaves them all on
    the queue. (Browse deliveries used to go pre-settled on a link that had not asked for that: the
    BlockingReceiver keeps only unsettled deliveries for accept(), whose first call then raised.)"""
    with Client(broker) as c:
        c.send("q.browse.accept", make_messages(10, prefix="a"))
    for credit in (20, None):  # None: the BlockingReceiver grants 1 at each receive()
        conn = BlockingConnection(broker.url(), timeout=10)
        try:
            browser = conn.create_receiver("q.browse.accept", options=Copy(), credit=credit)
            got = []
            for _ in range(10):
                got.append(browser.receive().body)
                browser.accept()
            assert got == [f"a-{i}" for i in range(10)], credit
            with pytest.raises(Timeout):
                browser.receive(timeout=0.3)  # browsed to the end: nothing more
        finally:
            conn.close()
    with Client(broker) as c:
        assert c.queue_depth("q.browse.accept") == 10
        # whatever a browser settles with, nothing leaves the queue
        browser = c.receiver("q.browse.accept", options=Copy())
        for outcome, r in zip(["reject", "release", "modify", "accept"] * 3, browser.receive_n(10, settle=None)):
            browser.settle(r, outcome, failed=True, undeliverable=True) if outcome == "modify" else \
                browser.settle(r, outcome)
        c.roundtrip()
        assert c.queue_depth("q.browse.accept") == 10
        assert bodies(c.receiver("q.browse.accept").receive_n(10)) == [f"a-{i}" for i in range(10)]


def test_browse_deliveries_settle_as_the_link_asks(broker):
    """An `unsettled` link gets unsettled deliveries (pre-settled ones would break the snd-settle-mode it
    asked for), a `settled` one pre-settled; a drained browser gets what is left, then an empty drain."""
    from proton import Link
    from proton.reactor import AtLeastOnce, AtMostOnce
    with Client(broker) as c:
        c.send("q.browse.modes", make_messages(6, prefix="s"))
        unsettled = c.receiver("q.browse.modes", options=[Copy(), AtLeastOnce()])
        assert unsettled.link.remote_snd_settle_mode == Link.SND_UNSETTLED
        got = unsettled.receive_n(6, settle=None)
        assert [r.delivery.settled for r in got] == [False] * 6
        settled = c.receiver("q.browse.modes", options=[Copy(), AtMostOnce()])
        assert all(r.delivery.settled for r in settled.receive_n(6, settle=None))
        drained = c.receiver("q.browse.modes", options=Copy())
        assert bodies(drained.drain(4)) == [f"s-{i}" for i in range(4)]
        assert bodies(drained.drain(10)) == [f"s-{i}" for i in range(4, 6)]
        assert drained.drain(5) == [] and drained.credit == 0
        for r in got:
            unsettled.accept(r)
        c.roundtrip()
        assert c.queue_depth("q.browse.modes") == 6


def test_event_driven_browser_gets_every_message(broker):
    """The event-driven equivalent (proton's MessagingHandler, auto-accepting) browses the queue whole."""
    with Client(broker) as c:
        c.send("q.browse.events", make_messages(10, prefix="e"))

    class Browser(MessagingHandler):
        def __init__(self):
            super().__init__()
            self.got = []

        def on_start(self, event):
            conn = event.container.connect(broker.url())
            event.container.create_receiver(conn, "q.browse.events", options=Copy())

        def on_message(self, event):
            self.got.append(event.message.body)
            if len(self.got) == 10:
                event.connection.close()

    handler = Browser()
    container = Container(handler)
    container.timeout = 10
    container.run()
    assert handler.got == [f"e-{i}" for i in range(10)]
    with Client(broker) as c:
        assert c.queue_depth("q.browse.events") == 10


# ---- anonymous relay ----------------------------------------------------------------------

def test_anonymous_relay_routes_by_to(broker):
    with Client(broker) as c:
        c.send(None, [Message(address="relay.a", body="to-a"), Message(address="relay.b", body="to-b"),
                      Message(address="relay.a", body="to-a-2")])
        assert bodies(c.receiver("relay.a").receive_n(2)) == ["to-a", "to-a-2"]
        assert bodies(c.receiver("relay.b").receive_n(1)) == ["to-b"]


def test_anonymous_relay_unknown_to_rejected_without_auto_create(broker_factory):
    b = broker_factory(auto_create=[], queues=[{"name": "known"}])
    with Client(b) as c:
        d = c.send_one(None, Message(address="nowhere", body="lost"))
        assert d.remote_state == Delivery.REJECTED
        assert condition_name(d.remote.condition) == "amqp:not-found", d.remote.condition
        # the link stays usable
        ok = c.send_one(None, Message(address="known", body="kept"))
        assert ok.remote_state == Delivery.ACCEPTED
        assert bodies(c.receiver("known").receive_n(1)) == ["kept"]


# ---- dynamic nodes: request / reply -------------------------------------------------------

def test_request_reply_with_dynamic_reply_queue(broker):
    with Client(broker) as responder, Client(broker) as requester:
        requests = responder.receiver("requests", credit=10)
        replies = requester.receiver(None, dynamic=True, credit=10)
        reply_to = replies.address
        assert reply_to, "the broker gave the dynamic receiver no address"
        asks = [Message(id=f"ask-{i}", reply_to=reply_to, body=f"question {i}") for i in range(3)]
        requester.send("requests", asks)
        for r in requests.receive_n(3):
            m = r.message
            responder.send(None, [Message(address=m.reply_to, correlation_id=m.id,
                                          body=m.body.replace("question", "answer"))])
        got = replies.receive_n(3)
        assert {(g.message.correlation_id, g.message.body) for g in got} == \
            {(f"ask-{i}", f"answer {i}") for i in range(3)}


# ---- credit -------------------------------------------------------------------------------

def test_credit_limits_what_arrives(broker):
    with Client(broker) as c:
        c.send("q.credit", make_messages(10, prefix="cr"))
        r = c.receiver("q.credit", credit=0)
        r.expect_nothing(0.3)
        r.flow(5)
        first = r.receive_n(5, credit=False)
        assert bodies(first) == [f"cr-{i}" for i in range(5)]
        r.expect_nothing(0.5)
        assert c.queue_depth("q.credit") == 5
        r.flow(5)
        rest = r.receive_n(5, credit=False)
        assert bodies(rest) == [f"cr-{i}" for i in range(5, 10)]


def test_drain_returns_unused_credit(broker):
    with Client(broker) as c:
        c.send("q.drain", make_messages(2, prefix="d"))
        r = c.receiver("q.drain", credit=0)
        got = r.drain(5)
        assert bodies(got) == ["d-0", "d-1"]
        assert r.credit == 0
        for g in got:
            r.accept(g)
        # draining an empty queue completes at once with no message
        assert r.drain(5) == []
        assert r.credit == 0
        # and the link still works afterwards
        c.send("q.drain", ["after"])
        assert bodies(r.receive_n(1)) == ["after"]


def test_credit_granted_one_at_a_time_and_after_a_drain_brings_every_waiting_message(broker):
    """proton tells the broker of the credit each of its sends used as well as of the client's grants; only a
    grant dispatches. Credit given one message at a time, then a drain, then one more: each brings the next."""
    with Client(broker) as c:
        c.send("q.trickle", make_messages(6, prefix="t"))
        r = c.receiver("q.trickle", credit=0)
        got = []
        for _ in range(3):
            r.flow(1)
            got += r.receive_n(1, credit=False)
        got += r.drain(2)
        assert r.credit == 0
        r.flow(1)
        got += r.receive_n(1, credit=False)
        assert bodies(got) == [f"t-{i}" for i in range(6)]


# ---- dispositions -------------------------------------------------------------------------

def test_accept_removes(broker):
    with Client(broker) as c:
        c.send("q.acc", ["one", "two"])
        r = c.receiver("q.acc")
        r.receive_n(1, settle="accept")
        c.roundtrip()
        assert c.queue_depth("q.acc") == 1


def test_release_puts_message_back_in_place(broker):
    with Client(broker) as a, Client(broker) as b:
        a.send("q.rel", ["m0", "m1", "m2"])
        ra = a.receiver("q.rel")
        [first] = ra.receive_n(1, settle=None)
        assert first.body == "m0"
        ra.release(first)
        a.roundtrip()  # the broker has processed the release
        got = b.receiver("q.rel").receive_n(3)
        assert bodies(got) == ["m0", "m1", "m2"]
        assert got[0].message.delivery_count == 0


def test_reject_drops(broker):
    with Client(broker) as c:
        c.send("q.rej", ["bad", "good"])
        r = c.receiver("q.rej")
        [bad] = r.receive_n(1, settle=None)
        r.reject(bad)
        c.roundtrip()
        assert c.queue_depth("q.rej") == 1
        assert bodies(r.receive_n(1)) == ["good"]


def test_reject_dead_letters(broker_factory):
    b = broker_factory(queues=[{"name": "q.dl", "args": {"dead_letter_address": "q.dead"}},
                               {"name": "q.dead"}])
    with Client(b) as c:
        c.send("q.dl", [Message(id="poison", body="poison", properties={"k": "v"})])
        r = c.receiver("q.dl")
        [m] = r.receive_n(1, settle=None)
        r.reject(m)
        c.roundtrip()
        assert c.queue_depth("q.dl") == 0
        [dead] = c.receiver("q.dead").receive_n(1)
        assert dead.body == "poison"
        assert dead.message.id == "poison"
        assert dead.message.properties == {"k": "v"}


def test_modified_delivery_failed_redelivers_with_count(broker):
    with Client(broker) as c:
        c.send("q.mod", ["again"])
        r = c.receiver("q.mod")
        [m] = r.receive_n(1, settle=None)
        assert m.message.delivery_count == 0
        r.modify(m, failed=True)
        [m2] = r.receive_n(1, settle=None)
        assert m2.body == "again"
        assert m2.message.delivery_count == 1
        r.modify(m2, failed=True)
        [m3] = r.receive_n(1, settle="accept")
        assert m3.message.delivery_count == 2
        c.roundtrip()
        assert c.queue_depth("q.mod") == 0


def test_modified_undeliverable_here_acts_as_release(broker):
    with Client(broker) as a, Client(broker) as b:
        a.send("q.undeliv", ["m0", "m1"])
        ra = a.receiver("q.undeliv")
        [m] = ra.receive_n(1, settle=None)
        ra.modify(m, undeliverable=True)
        a.roundtrip()
        got = b.receiver("q.undeliv").receive_n(2)
        assert bodies(got) == ["m0", "m1"]
        assert got[0].message.delivery_count == 0


def test_unsettled_messages_return_when_consumer_detaches(broker):
    with Client(broker) as c:
        c.send("q.detach", ["a", "b", "c"])
        r = c.receiver("q.detach")
        r.receive_n(2, settle=None)
        r.close()
        c.roundtrip()
        got = c.receiver("q.detach").receive_n(3)
        assert bodies(got) == ["a", "b", "c"]


# ---- TTL ----------------------------------------------------------------------------------

def test_expired_message_is_not_delivered(broker):
    with Client(broker) as c:
        c.send("q.ttl", [Message(body="short-lived", ttl=0.2)])
        wait_for(lambda: c.queue_depth("q.ttl") == 0, 10, message="the expired message to leave q.ttl")
        c.send("q.ttl", ["sentinel"])
        [got] = c.receiver("q.ttl").receive_n(1)
        assert got.body == "sentinel"


def test_unexpired_message_is_delivered(broker):
    with Client(broker) as c:
        c.send("q.ttl2", [Message(body="long-lived", ttl=60)])
        [got] = c.receiver("q.ttl2").receive_n(1)
        assert got.body == "long-lived"


# ---- limits -------------------------------------------------------------------------------

def test_max_depth_rejects_the_publish_over_it(broker_factory):
    b = broker_factory(queues=[{"name": "q.small", "args": {"max_depth": 3, "overflow": "reject-publish"}}])
    with Client(b) as c:
        c.send("q.small", ["1", "2", "3"])
        d = c.send_one("q.small", "4")
        assert d.remote_state == Delivery.REJECTED
        assert condition_name(d.remote.condition) == "amqp:resource-limit-exceeded", d.remote.condition
        assert "q.small" in d.remote.condition.description and "max_depth 3" in d.remote.condition.description
        assert c.queue_depth("q.small") == 3
        # room again once one is consumed
        c.receiver("q.small").receive_n(1)
        c.roundtrip()
        c.send("q.small", ["5"])
        assert c.queue_depth("q.small") == 3


def test_max_depth_via_management(broker):
    with Client(broker) as c:
        c.mgmt("CREATE", "queue", "q.small2", {"max_depth": 1, "overflow": "reject-publish"})
        c.send("q.small2", ["1"])
        d = c.send_one("q.small2", "2")
        assert d.remote_state == Delivery.REJECTED
        assert condition_name(d.remote.condition) == "amqp:resource-limit-exceeded"


# ---- exclusive and auto-delete queues -----------------------------------------------------

def test_exclusive_queue_refuses_second_consumer(broker_factory):
    b = broker_factory(queues=[{"name": "q.excl", "args": {"exclusive": True}}])
    with Client(b) as c1, Client(b) as c2:
        first = c1.receiver("q.excl", credit=1)
        with pytest.raises(LinkDetached) as e:
            c2.receiver("q.excl", credit=1)
        assert condition_name(e.value) == "amqp:resource-locked", str(e.value)
        # the first consumer still works
        c1.send("q.excl", ["only-for-first"])
        assert bodies(first.receive_n(1)) == ["only-for-first"]
    with Client(b) as c3:  # once the first consumer has gone, another may come
        c3.send("q.excl", ["later"])
        assert bodies(c3.receiver("q.excl").receive_n(1)) == ["later"]


def test_auto_delete_queue_goes_with_last_consumer(broker):
    with Client(broker) as c:
        c.mgmt("CREATE", "queue", "q.auto", {"auto-delete": True})
        assert "q.auto" in c.queue_names()
        with Client(broker) as consumer:
            r1 = consumer.receiver("q.auto", credit=1)
            r2 = consumer.receiver("q.auto", credit=1)
            r1.close()
            consumer.roundtrip()
            assert "q.auto" in c.queue_names(), "deleted while a consumer was still attached"
            r2.close()
        wait_for(lambda: "q.auto" not in c.queue_names(), 10, message="q.auto to be deleted")


def test_queue_ttl_argument_expires_messages(broker):
    with Client(broker) as c:
        c.mgmt("CREATE", "queue", "q.qttl", {"ttl": 0.2})
        c.send("q.qttl", ["doomed"])
        wait_for(lambda: c.queue_depth("q.qttl") == 0, 10, message="q.qttl to expire its message")
        c.send("q.qttl", ["sentinel"])
        [got] = c.receiver("q.qttl").receive_n(1)
        assert got.body == "sentinel"


def test_many_messages_keep_order(broker):
    n = 3000
    with Client(broker) as p, Client(broker) as c:
        r = c.receiver("q.volume", credit=0)
        p.send("q.volume", make_messages(n, prefix="v"), timeout=60)
        got = r.receive_n(n, timeout=60)
        assert [int(b.split("-")[1]) for b in bodies(got)] == list(range(n))


def test_dynamic_queue_deleted_with_its_receiver(broker):
    with Client(broker) as admin:
        with Client(broker) as c:
            r = c.receiver(None, dynamic=True, credit=1)
            by_link = r.address
            assert by_link in admin.queue_names()
            r.close()
            wait_for(lambda: by_link not in admin.queue_names(), 5,
                     message=f"dynamic queue {by_link} to go when its receiver detached")
            by_connection = c.receiver(None, dynamic=True, credit=1).address
            assert by_connection in admin.queue_names()
        wait_for(lambda: by_connection not in admin.queue_names(), 5,
                 message=f"dynamic queue {by_connection} to go when its connection closed")


def test_anonymous_relay_message_without_to_is_rejected(broker):
    with Client(broker) as c:
        d = c.send_one(None, Message(body="nowhere to go"))
        assert d.remote_state == Delivery.REJECTED, d.remote_state
        assert d.remote.condition is not None, "rejected without saying why"
        ok = c.send_one(None, Message(address="relay.after", body="fine"))
        assert ok.remote_state == Delivery.ACCEPTED
