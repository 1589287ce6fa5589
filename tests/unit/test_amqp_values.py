"""amqp_values writes the bytes proton's Python codec writes and reads what it reads, for the values brokers send
each other (the HA wiring, reports, link and connection properties); anything else goes through proton's codec."""
from __future__ import annotations

from typing import Any

import pytest
from cproton_ffi import lib
from proton import Array, Data, Described, Message, int32, symbol, timestamp, uint, ulong

from haqueue.broker import amqp_values

HANDLED = [
    {"event": "snapshot", "epoch": 3, "neg": -7, "big": 2**62, "sync": "all", "ok": True, "no": False, "x": None,
     "ratio": 1.5, "raw": b"\x00z", "members": {"broker-1": "ready"}, "queues": [{"name": "q", "args": {}}],
     "seqs": (1, 2), "empty": [], "ünï": "cödé"},
    {symbol("x-ha-broker"): "b", "n": ulong(2**63), "u": uint(7), "i": int32(-3)},
    [], {}, "s", 0, [[[]]],
]
LEFT_TO_PROTON = [{"t": timestamp(5)}, {"d": Described(symbol("x"), 1)}, {"a": Array(Data.NULL, Data.INT, 1, 2)}]


def proton_bytes(value: Any) -> bytes:
    message: Any = Message(body=value)
    return bytes(message.encode())


def proton_body(data: bytes) -> Any:
    message = Message()
    message.decode(data)
    return message.body


def typed(value: Any) -> Any:
    """The value with every leaf's type beside it (proton's types are int and str subclasses that compare equal to
    plain ones); binary as bytes (proton reads a memoryview)."""
    if isinstance(value, dict):
        return {typed(k): typed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [typed(v) for v in value]
    if isinstance(value, (bytes, memoryview)):
        return "binary", bytes(value)
    return type(value).__name__, value


@pytest.mark.parametrize("value", HANDLED + LEFT_TO_PROTON)
def test_a_message_body_is_encoded_and_read_as_proton_does(value: Any) -> None:
    data = amqp_values.encode_body(value)
    assert data == proton_bytes(value)
    assert typed(amqp_values.decode_body(data)) == typed(proton_body(data))


def test_a_message_proton_would_write_otherwise_is_read_by_proton() -> None:
    message = Message(body={"k": 1}, durable=True, subject="s")
    data = bytes(message.encode())
    assert amqp_values.decode_body(data) == {"k": 1}


def test_a_body_proton_cannot_encode_is_refused_as_proton_refuses_it() -> None:
    with pytest.raises(OverflowError):
        proton_bytes({"big": 2**64})
    with pytest.raises(OverflowError):
        amqp_values.encode_body({"big": 2**64})


@pytest.mark.parametrize("value", HANDLED[:2] + LEFT_TO_PROTON)
def test_a_pn_data_is_written_and_read_as_proton_does(value: dict[Any, Any]) -> None:
    ours, theirs = lib.pn_data(0), lib.pn_data(0)
    try:
        amqp_values.write(ours, value)
        Data(theirs).put_object(value)
        assert bytes(Data(ours).encode()) == bytes(Data(theirs).encode())
        theirs_data = Data(theirs)
        theirs_data.rewind()
        theirs_data.next()
        assert typed(amqp_values.read(ours)) == typed(theirs_data.get_object())
    finally:
        lib.pn_data_free(ours)
        lib.pn_data_free(theirs)


def test_an_empty_pn_data_reads_as_nothing() -> None:
    empty = lib.pn_data(0)
    try:
        assert amqp_values.read(empty) is None
    finally:
        lib.pn_data_free(empty)
