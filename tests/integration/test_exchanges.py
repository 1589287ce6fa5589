"""Exchanges: direct, topic (* and #) and fanout, declared in config and through management;
routing by message subject; a message no binding matches is accepted and dropped."""
from __future__ import annotations

import pytest
from proton import Delivery, Message

from clients import Client, bodies

pytestmark = pytest.mark.timeout(60)

QUEUES = ["d.red", "d.green", "d.red2", "t.star", "t.hash", "t.eu", "t.exact", "f.one", "f.two"]

CONFIG = {
    "queues": [{"name": q} for q in QUEUES],
    "exchanges": [{"name": "ex.direct", "type": "direct"},
                  {"name": "ex.topic", "type": "topic"},
                  {"name": "ex.fanout", "type": "fanout"}],
    "bindings": [
        {"exchange": "ex.direct", "queue": "d.red", "key": "red"},
        {"exchange": "ex.direct", "queue": "d.red2", "key": "red"},
        {"exchange": "ex.direct", "queue": "d.green", "key": "green"},
        {"exchange": "ex.topic", "queue": "t.star", "key": "stock.*"},
        {"exchange": "ex.topic", "queue": "t.hash", "key": "stock.#"},
        {"exchange": "ex.topic", "queue": "t.eu", "key": "#.eu"},
        {"exchange": "ex.topic", "queue": "t.exact", "key": "stock.nyse"},
        {"exchange": "ex.fanout", "queue": "f.one", "key": ""},
        {"exchange": "ex.fanout", "queue": "f.two", "key": "ignored"},
    ],
}


@pytest.fixture
def routed(broker_factory):
    return broker_factory(CONFIG)


def depths(c: Client) -> dict[str, int]:
    return {q["name"]: int(q["depth"]) for q in c.mgmt("QUERY", "queue").body if q["name"] in QUEUES}


def drain_queue(c: Client, name: str, n: int) -> list:
    return bodies(c.receiver(name).receive_n(n)) if n else []


def route(c: Client, exchange: str, subject: str | None, body: str) -> Delivery:
    return c.send_one(exchange, Message(subject=subject, body=body))


def test_direct_exchange_routes_by_subject(routed):
    with Client(routed) as c:
        for subject in ("red", "green", "red", "blue"):
            d = route(c, "ex.direct", subject, f"{subject}-msg")
            assert d.remote_state == Delivery.ACCEPTED, (subject, d.remote_state, d.remote.condition)
        got = depths(c)
        assert got == {**{q: 0 for q in QUEUES}, "d.red": 2, "d.red2": 2, "d.green": 1}
        assert drain_queue(c, "d.red", 2) == ["red-msg", "red-msg"]
        assert drain_queue(c, "d.green", 1) == ["green-msg"]


@pytest.mark.parametrize("subject, expected", [
    ("stock.nyse", {"t.star", "t.hash", "t.exact"}),
    ("stock.nyse.ibm", {"t.hash"}),
    ("stock", {"t.hash"}),               # '#' matches zero words
    ("stock.eu", {"t.star", "t.hash", "t.eu"}),
    ("bond.eu", {"t.eu"}),
    ("eu", {"t.eu"}),
    ("a.b.c.eu", {"t.eu"}),
    ("bond.us", set()),                   # no match: accepted and dropped
])
def test_topic_exchange_wildcards(routed, subject, expected):
    with Client(routed) as c:
        d = route(c, "ex.topic", subject, subject)
        assert d.remote_state == Delivery.ACCEPTED, d.remote.condition
        got = {q for q, n in depths(c).items() if n}
        assert got == expected
        for q in expected:
            assert drain_queue(c, q, 1) == [subject]


def test_fanout_exchange_copies_to_every_binding(routed):
    with Client(routed) as c:
        c.send("ex.fanout", [Message(subject="anything", body="a"), Message(body="b")])
        assert drain_queue(c, "f.one", 2) == ["a", "b"]
        assert drain_queue(c, "f.two", 2) == ["a", "b"]


def test_unmatched_message_is_accepted_and_dropped(routed):
    with Client(routed) as c:
        d = route(c, "ex.direct", "nobody-listens", "lost")
        assert d.remote_state == Delivery.ACCEPTED
        assert sum(depths(c).values()) == 0


def test_message_content_survives_routing(routed):
    with Client(routed) as c:
        m = Message(id="rid", subject="green", body={"k": [1, 2]}, properties={"p": 1},
                    correlation_id="cid")
        c.send("ex.direct", [m])
        [got] = c.receiver("d.green").receive_n(1)
        assert (got.message.id, got.message.subject, got.message.body, got.message.properties,
                got.message.correlation_id) == ("rid", "green", {"k": [1, 2]}, {"p": 1}, "cid")


def test_exchange_and_bindings_through_management(broker):
    with Client(broker) as c:
        c.mgmt("CREATE", "exchange", "mx", {"type": "topic"})
        c.mgmt("CREATE", "queue", "mq")
        c.mgmt("CREATE", "binding", body={"exchange": "mx", "queue": "mq", "key": "a.*"})
        c.send("mx", [Message(subject="a.b", body="hit"), Message(subject="b.a", body="miss")])
        assert c.queue_depth("mq") == 1
        c.mgmt("DELETE", "binding", body={"exchange": "mx", "queue": "mq", "key": "a.*"})
        c.send("mx", [Message(subject="a.b", body="after-unbind")])
        assert c.queue_depth("mq") == 1
        assert drain_queue(c, "mq", 1) == ["hit"]



@pytest.mark.parametrize("annotation", ["routing-key", "x-opt-routing-key"])
def test_routing_key_annotation_overrides_subject(routed, annotation):
    with Client(routed) as c:
        c.send("ex.direct", [Message(subject="green", annotations={annotation: "red"}, body="by-annotation")])
        got = {q for q, n in depths(c).items() if n}
        assert got == {"d.red", "d.red2"}
        assert drain_queue(c, "d.red", 1) == ["by-annotation"]


def test_topic_exchange_declared_through_management_with_many_bindings(broker):
    with Client(broker) as c:
        c.mgmt("CREATE", "exchange", "logs", {"type": "topic"})
        patterns = {"all": "#", "errors": "*.error", "kernel": "kern.*", "kernel-all": "kern.#"}
        for q, key in patterns.items():
            c.mgmt("CREATE", "queue", f"logs.{q}")
            c.mgmt("CREATE", "binding", body={"exchange": "logs", "queue": f"logs.{q}", "key": key})
        subjects = ["kern.error", "kern.info", "app.error", "kern.disk.full", "app"]
        c.send("logs", [Message(subject=s, body=s) for s in subjects])
        expected = {
            "all": subjects,
            "errors": ["kern.error", "app.error"],
            "kernel": ["kern.error", "kern.info"],
            "kernel-all": ["kern.error", "kern.info", "kern.disk.full"],
        }
        for q, want in expected.items():
            assert c.queue_depth(f"logs.{q}") == len(want), q
            assert bodies(c.receiver(f"logs.{q}").receive_n(len(want))) == want
