"""Selectors (issue #12, point 2): a receiver's `apache.org:selector-filter:string` source filter, written
as proton's `Selector` option writes it, is honoured on consuming and browsing links, echoed in the
broker's attach, and refused at attach when invalid. The grammar itself: tests/unit/test_selector.py;
rhea's equivalents: test_interop_rhea.py."""
from __future__ import annotations

import pytest
from proton import Described, Message, symbol
from proton.reactor import Copy, Filter, Selector
from proton.utils import BlockingConnection, LinkDetached

from clients import Client, bodies

pytestmark = pytest.mark.timeout(60)

SELECTOR = symbol("apache.org:selector-filter:string")


def coloured(colours: str) -> list[Message]:
    """One message per letter: r(ed), g(reen), b(lue); bodies `colour-i`."""
    names = {"r": "red", "g": "green", "b": "blue"}
    return [Message(body=f"{names[c]}-{i}", properties={"colour": names[c], "i": i}) for i, c in enumerate(colours)]


def echoed_filter(link) -> dict:
    data = link.remote_source.filter
    data.rewind()
    value = data.get_object() if data.next() else None
    return dict(value) if value else {}


def test_selector_consumer_gets_what_it_matches_and_leaves_the_rest(broker):
    """A consumer with proton's Selector gets the green messages, in order; the others stay on the queue,
    in order, for a consumer without one. The broker echoes the filter: it applies it."""
    with Client(broker) as c:
        c.send("q.sel", coloured("rgbggrbgr"))
    conn = BlockingConnection(broker.url(), timeout=10)
    try:
        greens = conn.create_receiver("q.sel", options=Selector("colour = 'green'"), credit=10)
        assert echoed_filter(greens.link) == {symbol("selector"): Described(SELECTOR, "colour = 'green'")}
        got = []
        for _ in range(4):
            got.append(greens.receive().body)
            greens.accept()
        assert got == ["green-1", "green-3", "green-4", "green-7"]
        with pytest.raises(Exception):  # nothing else matches
            greens.receive(timeout=0.3)
    finally:
        conn.close()
    with Client(broker) as c:
        assert c.queue_depth("q.sel") == 5
        assert bodies(c.receiver("q.sel").receive_n(5)) == ["red-0", "blue-2", "red-5", "blue-6", "red-8"]


def test_selector_browser_sees_only_matches_and_takes_nothing(broker):
    with Client(broker) as c:
        c.send("q.sel.browse", coloured("rgbg"))
        browser = c.receiver("q.sel.browse", options=[Copy(), Selector("colour <> 'green' AND i >= 0")])
        assert bodies(browser.receive_n(2)) == ["red-0", "blue-2"]
        browser.expect_nothing(0.3)
        assert c.queue_depth("q.sel.browse") == 4
        c.send("q.sel.browse", coloured("gggb"))  # a browser at the end sees newer matches as they come
        assert bodies(browser.receive_n(1)) == ["blue-3"]


def test_selector_consumers_share_a_queue_with_plain_ones(broker):
    """Two selector consumers and one without, all with credit as the messages come: each message goes to
    exactly one of them, each sees its own in queue order; one that releases a message gets it again
    before newer ones."""
    sent = [m.body for m in coloured("rgb" * 20)]
    with Client(broker) as c:
        reds = c.receiver("q.sel.mix", options=Selector("colour = 'red'"), credit=60)
        greens = c.receiver("q.sel.mix", options=Selector("colour = 'green'"), credit=60)
        anyone = c.receiver("q.sel.mix", credit=60)
        c.send("q.sel.mix", coloured("rgb" * 20))
        receivers = (reds, greens, anyone)
        c.wait(lambda: sum(r.available for r in receivers) == 60, 10, "all 60 messages")
        r, g, a = (x.receive_n(x.available, settle=None) for x in receivers)
        assert all(b.startswith("red-") for b in bodies(r)) and all(b.startswith("green-") for b in bodies(g))
        assert len(r) > 1 and len(g) > 1, (len(r), len(g), len(a))
        assert sorted(bodies(r) + bodies(g) + bodies(a), key=lambda b: int(b.split("-")[1])) == sent
        for part in (r, g, a):
            seq = [int(b.split("-")[1]) for b in bodies(part)]
            assert seq == sorted(seq)
        anyone.link.close()  # anyone's own go back, but only the red ones will be taken again
        c.process()
        for x in r[1:]:
            reds.accept(x)
        reds.release(r[0])  # comes again, with the reds anyone had, in queue order
        back = sorted([r[0].body] + [b for b in bodies(a) if b.startswith("red-")], key=lambda b: int(b[4:]))
        assert bodies(reds.receive_n(len(back))) == back
        for x in g:
            greens.accept(x)
        greens.expect_nothing(0.2)
        greens.link.close()
        c.process()
        assert c.queue_depth("q.sel.mix") == sum(1 for b in bodies(a) if not b.startswith("red-"))


def test_selector_on_header_and_properties_fields(broker):
    """JMS header names and `amqp.` names read the header and properties sections."""
    messages = [Message(body="a", priority=9, durable=True, subject="order", id="ID:a", correlation_id="c1"),
                Message(body="b", priority=1, subject="invoice", id="ID:b", group_id="g"),
                Message(body="c", properties={"JMSPriority": 9})]  # an application property does not shadow it
    cases = {"JMSPriority > 4": ["a"], "JMSDeliveryMode = 'PERSISTENT'": ["a"], "JMSType = 'invoice'": ["b"],
             "JMSMessageID IN ('ID:a', 'ID:x')": ["a"], "JMSCorrelationID = 'c1'": ["a"],
             "JMSXGroupID IS NOT NULL": ["b"], "amqp.subject LIKE 'in%'": ["b"], "amqp.durable": ["a"],
             "JMSPriority = 4": ["c"], "JMSRedelivered": []}
    with Client(broker) as c:
        c.send("q.sel.fields", messages)
        for selector, expected in cases.items():
            browser = c.receiver("q.sel.fields", options=[Copy(), Selector(selector)])
            got = browser.drain(10)
            assert [r.body for r in got] == expected, selector
            browser.close()


def test_invalid_selector_refused_at_attach(broker):
    """An invalid expression is refused at attach with amqp:invalid-field naming the error and where."""
    with Client(broker) as c:
        for selector, error in [("colour = ", "unexpected the end of the selector at position 9"),
                                ("colour == 'green'", "unexpected '=' at position 8"),
                                ("colour LIKE 5", "expected a string literal pattern after LIKE, found '5' "
                                                  "at position 12"),
                                ("'green'", "expected a condition, found a string at position 0")]:
            with pytest.raises(LinkDetached) as e:
                c.receiver("q.sel.bad", options=Selector(selector))
            condition = e.value.link.remote_condition
            assert condition.name == "amqp:invalid-field", str(e.value)
            assert condition.description == f"invalid selector {selector!r}: {error}", condition.description
        c.roundtrip()  # the connection is fine
        assert "q.sel.bad" not in c.queue_names()  # refused before the address was resolved (auto-created)


def test_filters_not_applied_are_not_echoed(broker):
    """A filter the broker does not apply is left out of its attach (so the client knows); a selector under
    any key, with the numeric descriptor rhea uses, is applied and echoed."""
    from proton import ulong
    no_local = {symbol("no-local"): Described(symbol("apache.org:no-local-filter:list"), ["x"])}
    with Client(broker) as c:
        c.send("q.sel.other", coloured("rg"))
        r = c.receiver("q.sel.other", options=Filter(no_local))
        assert echoed_filter(r.link) == {}
        assert bodies(r.receive_n(2)) == ["red-0", "green-1"]
        c.send("q.sel.other", coloured("rg"))
        numeric = {symbol("jms-selector"): Described(ulong(0x0000468C00000004), "colour = 'red'"), **no_local}
        r = c.receiver("q.sel.other", options=Filter(numeric))
        assert echoed_filter(r.link) == {symbol("jms-selector"): Described(ulong(0x0000468C00000004),
                                                                            "colour = 'red'")}
        assert bodies(r.receive_n(1)) == ["red-0"]
        r.expect_nothing(0.3)


def test_selector_on_an_exchange_subscription(broker):
    """Consuming from an exchange makes a private queue for the link: a selector there gets its matches,
    and what it does not match is dropped rather than left to pile up where no one else can take it."""
    with Client(broker) as c:
        c.mgmt("CREATE", "exchange", "sel.fan", {"type": "fanout"})
        r = c.receiver("sel.fan", options=Selector("i >= 3"), credit=0)
        c.send("sel.fan", coloured("rgbrgb"))
        assert bodies(r.receive_n(3)) == ["red-3", "green-4", "blue-5"]
        [queue] = [q for q in c.mgmt("QUERY", "queue").body if q["name"].startswith("sel.fan.sub.")]
        assert int(queue["depth"]) == 0
