"""Reading the few sections of an encoded AMQP message that the broker needs, without decoding the body.

The broker keeps each message as the bytes the publisher sent. It reads the header (ttl,
delivery-count), the properties (to, subject, message-id) and the message annotations
(routing-key) by scanning the encoding; the body is never touched. The only rewrite is the
header, when a redelivery raises the delivery-count.
"""
from __future__ import annotations

import struct
import time
from typing import Any, Final

# Section descriptors (smallulong codes 0x70..0x78 after 0x00 0x53).
HEADER: Final = 0x70
DELIVERY_ANNOTATIONS: Final = 0x71
MESSAGE_ANNOTATIONS: Final = 0x72
PROPERTIES: Final = 0x73
APPLICATION_PROPERTIES: Final = 0x74

_HEADER_PREFIX: Final = b"\x00\x53\x70"
_U32: Final = struct.Struct(">I")
_U16: Final = struct.Struct(">H")
_U64: Final = struct.Struct(">Q")
_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")
_I64: Final = struct.Struct(">q")
_DOUBLE: Final = struct.Struct(">d")
_FLOAT: Final = struct.Struct(">f")


class MalformedMessage(ValueError):
    """The message bytes do not follow the AMQP type encoding."""


def skip(data: bytes, pos: int) -> int:
    """Position just after the encoded value starting at pos."""
    code = data[pos]
    pos += 1
    if code == 0x00:  # described: descriptor then value
        return skip(data, skip(data, pos))
    kind = code >> 4
    if kind == 0x4:
        return pos
    if kind == 0x5:
        return pos + 1
    if kind == 0x6:
        return pos + 2
    if kind == 0x7:
        return pos + 4
    if kind == 0x8:
        return pos + 8
    if kind == 0x9:
        return pos + 16
    if kind in (0xA, 0xC, 0xE):
        return pos + 1 + data[pos]
    if kind in (0xB, 0xD, 0xF):
        return pos + 4 + _U32.unpack_from(data, pos)[0]
    raise MalformedMessage(f"unknown type code 0x{code:02x}")


def read(data: bytes, pos: int) -> Any:
    """Decode the simple value at pos (strings, symbols, binaries, numbers, booleans, maps of those)."""
    code = data[pos]
    p = pos + 1
    if code == 0x40:
        return None
    if code == 0x41 or code == 0x56 and data[p] == 1:
        return True
    if code == 0x42 or code == 0x56:
        return False
    if code in (0x43, 0x44):
        return 0
    if code in (0x50, 0x52, 0x53):
        return data[p]
    if code in (0x51, 0x54, 0x55):
        return int.from_bytes(data[p:p + 1], "big", signed=True)
    if code == 0x60:
        return _U16.unpack_from(data, p)[0]
    if code == 0x61:
        return _I16.unpack_from(data, p)[0]
    if code == 0x73:  # char: a UTF-32 code point
        return chr(_U32.unpack_from(data, p)[0])
    if code == 0x70:
        return _U32.unpack_from(data, p)[0]
    if code == 0x71:
        return _I32.unpack_from(data, p)[0]
    if code in (0x80, 0x83):
        return _U64.unpack_from(data, p)[0] if code == 0x80 else _I64.unpack_from(data, p)[0]
    if code == 0x81:
        return _I64.unpack_from(data, p)[0]
    if code == 0x72:
        return _FLOAT.unpack_from(data, p)[0]
    if code == 0x82:
        return _DOUBLE.unpack_from(data, p)[0]
    if code == 0x98:
        return bytes(data[p:p + 16])
    if code in (0xA0, 0xA1, 0xA3):
        raw = bytes(data[p + 1:p + 1 + data[p]])
        return raw if code == 0xA0 else raw.decode("utf-8")
    if code in (0xB0, 0xB1, 0xB3):
        n = _U32.unpack_from(data, p)[0]
        raw = bytes(data[p + 4:p + 4 + n])
        return raw if code == 0xB0 else raw.decode("utf-8")
    if code in (0xC1, 0xD1):
        return dict(_map_items(data, pos))
    return None  # types the broker never needs to read (lists, arrays, described values)


def _compound(data: bytes, pos: int) -> tuple[int, int]:
    """(count, position of the first element) of the list or map at pos."""
    code = data[pos]
    if code == 0x45:
        return 0, pos + 1
    if code in (0xC0, 0xC1):
        return data[pos + 2], pos + 3
    if code in (0xD0, 0xD1):
        return _U32.unpack_from(data, pos + 5)[0], pos + 9
    raise MalformedMessage(f"expected a list or map, found type code 0x{code:02x}")


def _map_items(data: bytes, pos: int):
    count, p = _compound(data, pos)
    for _ in range(count // 2):
        key = read(data, p)
        p = skip(data, p)
        yield key, read(data, p)
        p = skip(data, p)


def _list_fields(data: bytes, pos: int, wanted: int) -> list[Any]:
    """The first `wanted` fields of the list at pos (None where absent)."""
    count, p = _compound(data, pos)
    fields: list[Any] = []
    for _ in range(min(count, wanted)):
        fields.append(read(data, p))
        p = skip(data, p)
    fields.extend([None] * (wanted - len(fields)))
    return fields


def sections(data: bytes) -> dict[int, int]:
    """Section code -> position of its value, for the sections before the body."""
    found: dict[int, int] = {}
    pos = 0
    end = len(data)
    while pos < end:
        if data[pos] != 0x00 or data[pos + 1] != 0x53:
            raise MalformedMessage(f"section at byte {pos} has no small-ulong descriptor")
        code = data[pos + 2]
        if code > PROPERTIES + 1:  # application-properties (0x74) and later: nothing more we read
            break
        found[code] = pos + 3
        pos = skip(data, pos + 3)
    return found


def is_message(data: bytes) -> bool:
    """Does it start like an AMQP message (a section descriptor)? One cheap check on the hot path,
    so bytes that are no message are refused at the door rather than handed to consumers."""
    return data[:2] == b"\x00\x53" and len(data) > 2 and HEADER <= data[2] <= 0x78


def is_durable(data: bytes) -> bool:
    """The header's durable flag (its first field), read without decoding the rest: on the hot path."""
    if not data.startswith(_HEADER_PREFIX):
        return False
    code = data[3]
    first = 6 if code == 0xC0 else 12 if code == 0xD0 else 0  # list8 / list32; list0 has no fields
    return first > 0 and len(data) > first and (data[first] == 0x41 or data[first:first + 2] == b"\x56\x01")


def annotations_at(data: bytes) -> int:
    """Where the message-annotations map starts, 0 for a message without: the header and the delivery
    annotations skipped, one byte compared (cheap enough to ask of every message on the hot path)."""
    pos = 0
    try:
        if data.startswith(_HEADER_PREFIX):
            pos = skip(data, 3)
        if data[pos + 2] == DELIVERY_ANNOTATIONS and data[pos:pos + 2] == b"\x00\x53":
            pos = skip(data, pos + 3)
        if data[pos + 2] == MESSAGE_ANNOTATIONS and data[pos:pos + 2] == b"\x00\x53":
            return pos + 3
    except (IndexError, MalformedMessage):
        pass  # not a message that reaches this far: it has no annotations to act on
    return 0


def annotated(data: bytes) -> bool:
    """Does the message carry message annotations?"""
    return annotations_at(data) > 0


def message_annotations(data: bytes) -> dict[Any, Any]:
    """The message annotations (symbol keys as str), {} if none."""
    pos = annotations_at(data)
    return dict(_map_items(data, pos)) if pos else {}


def priority(data: bytes) -> int:
    """The header's priority (its second field); 4, the AMQP default, if absent."""
    if not data.startswith(_HEADER_PREFIX):
        return 4
    found = _list_fields(data, 3, 2)[1]
    return 4 if found is None else found


def group_id(data: bytes) -> Any:
    """The properties' group-id (their eleventh field), None if absent."""
    found = sections(data)
    return _list_fields(data, found[PROPERTIES], 11)[10] if PROPERTIES in found else None


def application_property(data: bytes, key: str) -> Any:
    """One application property's value, None if absent."""
    found = sections(data)
    if APPLICATION_PROPERTIES not in found:
        return None
    for name, value in _map_items(data, found[APPLICATION_PROPERTIES]):
        if name == key:
            return value
    return None


def ttl_ms(data: bytes) -> int | None:
    """The header's ttl (its third field) in milliseconds. Most clients send no header, or one of fewer
    than three fields (durable alone): those cost a comparison or two on the hot path."""
    if not data.startswith(_HEADER_PREFIX):
        return None
    code = data[3]
    if code == 0x45 or (code == 0xC0 and len(data) > 5 and data[5] < 3) \
            or (code == 0xD0 and len(data) >= 12 and _U32.unpack_from(data, 8)[0] < 3):
        return None
    return _list_fields(data, 3, 3)[2]


def expiry(data: bytes) -> float:
    """The monotonic deadline the header's ttl gives a message, 0.0 for none (cold paths: the hot path inlines it)."""
    ttl = ttl_ms(data)
    return time.monotonic() + ttl / 1000.0 if ttl else 0.0


class Routing:
    """The fields routing needs: properties.to, properties.subject and the routing-key annotation."""

    __slots__ = ("to", "subject", "routing_key", "message_id")

    def __init__(self, data: bytes) -> None:
        found = sections(data)
        self.to: str | None = None
        self.subject: str | None = None
        self.message_id: Any = None
        self.routing_key: str | None = None
        if PROPERTIES in found:
            self.message_id, _user, self.to, self.subject = _list_fields(data, found[PROPERTIES], 4)
        if MESSAGE_ANNOTATIONS in found:
            for key, value in _map_items(data, found[MESSAGE_ANNOTATIONS]):
                if key in ("routing-key", "x-opt-routing-key") and isinstance(value, str):
                    self.routing_key = value

    @property
    def key(self) -> str:
        """The key an exchange routes by: the routing-key annotation, else the subject."""
        return self.routing_key if self.routing_key is not None else (self.subject or "")


def _encode_field(value: Any, kind: str) -> bytes:
    if value is None:
        return b"\x40"
    if kind == "bool":
        return b"\x41" if value else b"\x42"
    if kind == "ubyte":
        return bytes((0x50, value))
    return b"\x70" + _U32.pack(value)  # uint


_HEADER_KINDS: Final = ("bool", "ubyte", "uint", "bool", "uint")


def with_delivery_count(data: bytes, count: int) -> bytes:
    """The message with its header's delivery-count set to count (a header is added if absent)."""
    if data.startswith(_HEADER_PREFIX):
        fields = _list_fields(data, 3, 5)
        rest = data[skip(data, 3):]
    else:
        fields = [None] * 5
        rest = data
    fields[4] = count
    body = b"".join([_encode_field(v, k) for v, k in zip(fields, _HEADER_KINDS)])
    return _HEADER_PREFIX + bytes((0xC0, len(body) + 1, 5)) + body + rest


def delivery_count(data: bytes) -> int:
    if not data.startswith(_HEADER_PREFIX):
        return 0
    return _list_fields(data, 3, 5)[4] or 0


# -- selective replication (haqueue/ha/policy.py): is a message kept off the backups? -----------------
_REPLICATE_KEY: Final = b"x-replicate"


def unreplicated(data: bytes) -> bool:
    """Does the message ask to stay off the backups: message annotation `x-replicate` false (a boolean, or the
    string or symbol "false")? Only a message with annotations has them searched for the key, and decoded only
    when the key is there; a message too malformed to read is replicated (forwarded as it is)."""
    start = annotations_at(data)
    if not start:
        return False
    try:
        if data.find(_REPLICATE_KEY, start, skip(data, start)) < 0:
            return False
        for key, value in _map_items(data, start):
            if key == "x-replicate":
                return value is False or (isinstance(value, str) and value.lower() == "false")
    except (MalformedMessage, IndexError, struct.error, UnicodeDecodeError):
        pass
    return False


def transient_or_unreplicated(data: bytes) -> bool:
    """Kept off the backups of a queue that replicates durable messages only (`x-replicate: durable`)."""
    return not is_durable(data) or unreplicated(data)
