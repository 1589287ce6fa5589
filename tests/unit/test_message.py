"""The broker reads header, properties and annotations from encoded bytes without decoding the body."""
from __future__ import annotations

from proton import Message, symbol

from haqueue.broker.message import (Routing, delivery_count, transient_or_unreplicated, ttl_ms, unreplicated,
                                    with_delivery_count)


def encoded(**kw) -> bytes:
    return bytes(Message(**kw).encode())


def decoded(data: bytes) -> Message:
    m = Message()
    m.decode(data)
    return m


def test_routing_fields_read_from_properties_and_annotations():
    data = encoded(address="orders", subject="eu.fr", id="m-1", body={"big": list(range(100))})
    r = Routing(data)
    assert (r.to, r.subject, r.message_id, r.key) == ("orders", "eu.fr", "m-1", "eu.fr")
    with_key = encoded(subject="s", annotations={symbol("routing-key"): "k.1"}, body="x")
    assert Routing(with_key).key == "k.1"
    assert Routing(encoded(body="no properties")).key == ""


def test_ttl_read_from_header_only_when_there_is_one():
    assert ttl_ms(encoded(ttl=2.5, body="x")) == 2500
    assert ttl_ms(encoded(body="x")) is None


def test_delivery_count_rewrite_keeps_every_other_field():
    original = Message(durable=True, priority=7, ttl=3.0, first_acquirer=True, delivery_count=2,
                       id=5, subject="s", properties={"k": 1}, body=[1, "two", 3.0])
    data = with_delivery_count(bytes(original.encode()), 3)
    m = decoded(data)
    assert delivery_count(data) == 3 and m.delivery_count == 3
    assert (m.durable, m.priority, m.ttl, m.first_acquirer) == (True, 7, 3.0, True)
    assert (m.id, m.subject, m.properties, m.body) == (5, "s", {"k": 1}, [1, "two", 3.0])


def test_delivery_count_added_to_a_message_without_header():
    data = with_delivery_count(bytes(Message(body=b"raw", inferred=True).encode()), 1)
    m = decoded(data)
    assert m.delivery_count == 1 and m.body == b"raw"


def test_x_replicate_false_annotation_keeps_a_message_off_the_backups():
    off = symbol("x-replicate")
    assert unreplicated(encoded(annotations={off: False}, body="x"))
    assert unreplicated(encoded(durable=True, priority=7, instructions={symbol("d"): 1},  # after header and
                                annotations={symbol("x-opt-jms-msg-type"): 3, off: "False"}, body="x"))  # delivery annotations
    assert unreplicated(encoded(annotations={off: symbol("false")}, body="x"))
    for kept in ({off: True}, {off: "no"}, {symbol("x-other"): "x-replicate"}, None):  # anything else replicates
        assert not unreplicated(encoded(annotations=kept, body="x")), kept
    assert not unreplicated(b"\x00\x53\x72\xc1")  # too short to read: replicated, never an error


def test_durable_only_replication_keeps_transient_messages_off_the_backups():
    assert transient_or_unreplicated(encoded(body="x"))
    assert not transient_or_unreplicated(encoded(durable=True, body="x"))
    assert transient_or_unreplicated(encoded(durable=True, annotations={symbol("x-replicate"): False}, body="x"))
