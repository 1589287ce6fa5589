"""Pass-through: a message arrives as it was sent — every body kind, header fields, properties,
application properties and message annotations — and multi-megabyte messages arrive intact."""
from __future__ import annotations

import hashlib
import os
import uuid

import pytest
from proton import Message

from clients import Client
from typed import bare_message, canonical, encode_spec, mismatches, section_codes

pytestmark = pytest.mark.timeout(60)

T = lambda t, v=None: {"t": t} if t == "null" else {"t": t, "v": v}  # noqa: E731

BODIES = {
    "data": {"section": "data", "v": bytes(range(256)).hex()},
    "data-empty": {"section": "data", "v": ""},
    "value-binary": {"section": "value", "v": T("binary", b"\x00\xffbin".hex())},
    "value-string": {"section": "value", "v": T("string", "héllo wörld ✓")},
    "value-long": {"section": "value", "v": T("long", -(2 ** 40))},
    "value-int": {"section": "value", "v": T("int", -7)},
    "value-ulong": {"section": "value", "v": T("ulong", 2 ** 63)},
    "value-double": {"section": "value", "v": T("double", 3.25)},
    "value-float": {"section": "value", "v": T("float", 1.5)},
    "value-bool": {"section": "value", "v": T("bool", True)},
    "value-symbol": {"section": "value", "v": T("symbol", "sym")},
    "value-uuid": {"section": "value", "v": T("uuid", uuid.UUID(int=12345).hex)},
    "value-timestamp": {"section": "value", "v": T("timestamp", 1700000000123)},
    "value-list": {"section": "value", "v": T("list", [T("string", "a"), T("long", 1), T("null"),
                                                        T("list", [T("bool", False)])])},
    "value-map": {"section": "value", "v": T("map", [[T("string", "k"), T("long", 1)],
                                                      [T("symbol", "s"), T("map", [])],
                                                      [T("long", 2), T("list", [])]])},
    "value-array": {"section": "value", "v": T("array", [T("int", 1), T("int", 2), T("int", 3)])},
    "value-array-strings": {"section": "value", "v": T("array", [T("string", "x"), T("string", "y")])},
    "value-described": {"section": "value",
                        "v": {"t": "described", "d": T("symbol", "org.example:thing"),
                              "v": T("map", [[T("string", "x"), T("double", 0.5)]])}},
    "value-described-ulong": {"section": "value",
                              "v": {"t": "described", "d": T("ulong", 0x1234), "v": T("string", "v")}},
    "value-null": {"section": "value", "v": T("null")},
    "sequence": {"section": "sequence", "v": [T("string", "one"), T("long", 2), T("double", 3.0)]},
    "no-body": {"section": "none"},
}

FULL_HEADER = {"durable": True, "priority": 9, "ttl": 3_600_000, "first_acquirer": True}
FULL_PROPERTIES = {
    "message_id": T("string", "msg-1"), "user_id": b"tester".hex(), "to": "q.fid",
    "subject": "the subject", "reply_to": "reply.here", "correlation_id": T("string", "corr-1"),
    "content_type": "application/x-test", "content_encoding": "gzip",
    "absolute_expiry_time": 4102444800000, "creation_time": 1700000000123, "group_id": "grp",
    "group_sequence": 42, "reply_to_group_id": "reply-grp",
}
APP_PROPERTIES = {"str": T("string", "v"), "long": T("long", 7), "int": T("int", -1),
                  "double": T("double", 2.5), "bool": T("bool", False), "null": T("null"),
                  "uuid": T("uuid", uuid.UUID(int=99).hex), "binary": T("binary", "00ff"),
                  "timestamp": T("timestamp", 1234567890000), "ubyte": T("ubyte", 200)}
ANNOTATIONS = {"x-opt-test": T("string", "annotated"), "x-opt-num": T("long", 5),
               "x-opt-list": T("list", [T("long", 1)])}


def roundtrip(c: Client, address: str, spec: dict):
    """Send the spec's encoding as is; return (sent bytes, Received)."""
    raw = encode_spec(spec)
    d = c.send_raw(address, raw)
    assert d.remote_state == d.ACCEPTED, (d.remote_state, d.remote.condition)
    [got] = c.receiver(address).receive_n(1)
    return raw, got


def assert_same(spec: dict, sent: bytes, got) -> None:
    actual = canonical(got.message, got.raw)
    problems = mismatches(spec, actual)
    assert not problems, "\n".join(problems)
    assert bare_message(got.raw) == bare_message(sent), (
        f"bare message changed: sent sections {section_codes(sent)}, got {section_codes(got.raw)}")


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_body_kinds_pass_through(broker, kind):
    spec = {"properties": {"message_id": T("string", f"id-{kind}")}, "body": BODIES[kind]}
    with Client(broker) as c:
        sent, got = roundtrip(c, f"q.body.{kind}", spec)
        assert_same(spec, sent, got)


def test_all_header_and_property_fields_pass_through(broker):
    spec = {"header": FULL_HEADER, "properties": FULL_PROPERTIES,
            "application_properties": APP_PROPERTIES, "message_annotations": ANNOTATIONS,
            "body": BODIES["value-map"]}
    with Client(broker) as c:
        sent, got = roundtrip(c, "q.fid", spec)
        assert_same(spec, sent, got)
        assert got.message.delivery_count == 0


@pytest.mark.parametrize("ident", [
    T("string", "string-id"), T("ulong", 12345678901), T("uuid", uuid.UUID(int=7).hex),
    T("binary", "deadbeef")], ids=["string", "ulong", "uuid", "binary"])
def test_message_and_correlation_id_types(broker, ident):
    spec = {"properties": {"message_id": ident, "correlation_id": ident},
            "body": BODIES["value-string"]}
    with Client(broker) as c:
        sent, got = roundtrip(c, f"q.ids.{ident['t']}", spec)
        assert_same(spec, sent, got)


def test_header_defaults_pass_through(broker):
    spec = {"header": {"durable": False, "priority": 0, "first_acquirer": False},
            "body": BODIES["value-string"]}
    with Client(broker) as c:
        sent, got = roundtrip(c, "q.hdr", spec)
        assert_same(spec, sent, got)


def test_python_message_objects_round_trip(broker):
    """The same through proton's own Message.send path, compared attribute by attribute."""
    m = Message(id=uuid.UUID(int=5), durable=True, priority=3, ttl=120.0, first_acquirer=True,
                user_id=b"u", address="q.obj", subject="s", reply_to="r", correlation_id=9,
                content_type="text/plain", content_encoding="utf-8", expiry_time=4102444800.0,
                creation_time=1700000000.5, group_id="g", group_sequence=2, reply_to_group_id="rg",
                properties={"a": 1, "b": "two"}, annotations={"x-opt-a": "ann"}, body=["x", {"y": 1.0}])
    with Client(broker) as c:
        c.send("q.obj", [m])
        [got] = c.receiver("q.obj").receive_n(1)
        g = got.message
        for attr in ("id", "durable", "priority", "ttl", "first_acquirer", "user_id", "address",
                     "subject", "reply_to", "correlation_id", "content_type", "content_encoding",
                     "expiry_time", "creation_time", "group_id", "group_sequence",
                     "reply_to_group_id", "properties", "body", "inferred"):
            assert getattr(g, attr) == getattr(m, attr), attr
        assert {k: v for k, v in g.annotations.items() if k in m.annotations} == m.annotations


def _big(c: Client, size: int) -> None:
    payload = os.urandom(size)
    digest = hashlib.sha256(payload).hexdigest()
    c.send("q.big", [Message(id="big", body=payload, inferred=True)], timeout=120)
    [got] = c.receiver("q.big").receive_n(1, timeout=120)
    body = got.message.body
    assert len(body) == size
    assert hashlib.sha256(body).hexdigest() == digest


def test_10_mb_message_arrives_intact(broker):
    with Client(broker, timeout=60) as c:
        _big(c, 10 * 1024 * 1024)


@pytest.mark.timeout(180)
def test_20_mb_message_arrives_intact(broker):
    with Client(broker, timeout=120) as c:
        _big(c, 20 * 1024 * 1024)


def test_large_message_over_small_frames(broker_factory):
    b = broker_factory(listen=[{"address": "127.0.0.1:0", "max_frame_size": 4096}])
    with Client(b) as c:
        assert c.remote_max_frame_size == 4096
        _big(c, 300 * 1024)
