"""AMQP values of the brokers' control traffic (the HA wiring and reports, link and connection properties) encoded
and decoded by proton's codec from C (_values.c): the same bytes as proton's Python codec, without its per-value
Python calls, which at 10,000 queues put most of a second on a failover's critical path. A value holding a type
_values leaves (a Described, an Array, a timestamp...) goes through proton's Python codec instead."""
from __future__ import annotations

from typing import Any, Final, cast

import cproton_ffi
from cproton_ffi import ffi
from proton import Data, Message, int32, symbol, uint, ulong

from . import _values

_UNSUPPORTED: Final = object()
_values.bind(cproton_ffi.__file__, _UNSUPPORTED, symbol, ulong, uint, int32)


def encode_body(body: Any) -> bytes:
    """A message whose only section is the amqp-value `body`."""
    data = _values.encode_body(body)
    if data is _UNSUPPORTED:
        message: Any = Message(body=body)  # untyped: its encode returns a bytearray where proton's stub says bytes
        return bytes(message.encode())
    return cast(bytes, data)


def decode_body(data: bytes) -> Any:
    """The amqp-value of a message (any message proton reads)."""
    value = _values.decode_body(data)
    if value is _UNSUPPORTED:
        message = Message()
        message.decode(data)
        return message.body
    return value


def read(ptr: Any) -> Any:
    """The first value of a pn_data_t (a cffi pointer; NULL: what a peer never sent), or None."""
    address = int(ffi.cast("uintptr_t", ptr))
    if not address:
        return None
    value = _values.read(address)
    if value is _UNSUPPORTED:
        data = Data(ptr)
        data.rewind()
        return data.get_object() if data.next() else None
    return value


def write(ptr: Any, value: Any) -> None:
    """`value` appended to a pn_data_t (a cffi pointer)."""
    if not _values.write(int(ffi.cast("uintptr_t", ptr)), value):
        Data(ptr).put_object(value)
