"""AMQP values and messages as type-tagged JSON, and the raw section layout of an encoded message.

The tagged form lets a proton client (Python) and a rhea client (tests/js/*.js) describe the same
message field by field, with AMQP types kept: a value is ``{"t": TYPE, "v": VALUE}`` where TYPE is
one of null, bool, ubyte, ushort, uint, ulong, byte, short, int, long, float, double, timestamp,
uuid (hex), binary (hex), string, symbol, char, list, map (list of [key, value] pairs), array
(elements tagged) or described (``{"t": "described", "d": DESCRIPTOR, "v": VALUE}``).

A message spec / canonical form::

    {"header": {"durable", "priority", "ttl" (ms), "first_acquirer", "delivery_count"},
     "properties": {"message_id": tagged, "user_id": hex, "to", "subject", "reply_to",
                    "correlation_id": tagged, "content_type", "content_encoding",
                    "absolute_expiry_time" (ms), "creation_time" (ms), "group_id",
                    "group_sequence", "reply_to_group_id"},
     "application_properties": {key: tagged}, "message_annotations": {key: tagged},
     "body": {"section": "value", "v": tagged} | {"section": "data", "v": hex}
             | {"section": "sequence", "v": [tagged, ...]} | {"section": "none"}}
"""
from __future__ import annotations

import struct
import uuid
from typing import Any

from proton import (Array, Data, Described, Message, byte, char, float32, int32, short, symbol,
                    timestamp, ubyte, uint, ulong, ushort)

_ARRAY_TYPES = {
    Data.NULL: "null", Data.BOOL: "bool", Data.UBYTE: "ubyte", Data.BYTE: "byte",
    Data.USHORT: "ushort", Data.SHORT: "short", Data.UINT: "uint", Data.INT: "int",
    Data.CHAR: "char", Data.ULONG: "ulong", Data.LONG: "long", Data.TIMESTAMP: "timestamp",
    Data.FLOAT: "float", Data.DOUBLE: "double", Data.UUID: "uuid", Data.BINARY: "binary",
    Data.STRING: "string", Data.SYMBOL: "symbol", Data.LIST: "list", Data.MAP: "map",
}
_ARRAY_CODES = {v: k for k, v in _ARRAY_TYPES.items()}


def tag(value: Any) -> dict:
    """The tagged form of a value as proton decodes it."""
    if value is None:
        return {"t": "null"}
    if isinstance(value, bool):
        return {"t": "bool", "v": value}
    for cls, name in ((ulong, "ulong"), (uint, "uint"), (ushort, "ushort"), (ubyte, "ubyte"),
                      (byte, "byte"), (short, "short"), (int32, "int"), (timestamp, "timestamp")):
        if isinstance(value, cls):
            return {"t": name, "v": int(value)}
    if isinstance(value, int):
        return {"t": "long", "v": int(value)}
    if isinstance(value, float32):
        return {"t": "float", "v": float(value)}
    if isinstance(value, float):
        return {"t": "double", "v": value}
    if isinstance(value, symbol):
        return {"t": "symbol", "v": str(value)}
    if isinstance(value, char):
        return {"t": "char", "v": str(value)}
    if isinstance(value, str):
        return {"t": "string", "v": value}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"t": "binary", "v": bytes(value).hex()}
    if isinstance(value, uuid.UUID):
        return {"t": "uuid", "v": value.hex}
    if isinstance(value, Described):
        return {"t": "described", "d": tag(value.descriptor), "v": tag(value.value)}
    if isinstance(value, Array):
        return {"t": "array", "v": [{"t": _ARRAY_TYPES[value.type], "v": untag_plain(tag(e))}
                                    for e in value.elements]}
    if isinstance(value, (list, tuple)):
        return {"t": "list", "v": [tag(e) for e in value]}
    if isinstance(value, dict):
        return {"t": "map", "v": [[tag(k), tag(v)] for k, v in value.items()]}
    raise TypeError(f"no tag for {type(value)}: {value!r}")


def untag_plain(tv: dict) -> Any:
    return tv.get("v")


def untag(tv: dict) -> Any:
    """The proton value for a tagged value."""
    t, v = tv["t"], tv.get("v")
    simple = {"ulong": ulong, "uint": uint, "ushort": ushort, "ubyte": ubyte, "byte": byte,
              "short": short, "int": int32, "long": int, "timestamp": timestamp, "float": float32,
              "double": float, "symbol": symbol, "char": char, "string": str, "bool": bool}
    if t == "null":
        return None
    if t in simple:
        return simple[t](v)
    if t == "binary":
        return bytes.fromhex(v)
    if t == "uuid":
        return uuid.UUID(hex=v)
    if t == "described":
        return Described(untag(tv["d"]), untag(v))
    if t == "array":
        kind = v[0]["t"]
        return Array(_UNDESCRIBED, _ARRAY_CODES[kind], *[untag(e) for e in v])
    if t == "list":
        return [untag(e) for e in v]
    if t == "map":
        return {untag(k): untag(x) for k, x in v}
    raise ValueError(f"unknown tag {t}")


try:
    from proton import UNDESCRIBED as _UNDESCRIBED
except ImportError:  # pragma: no cover
    from proton._data import UNDESCRIBED as _UNDESCRIBED


def tag_id(value: Any) -> dict:
    """A message-id / correlation-id is ulong, uuid, binary or string; proton gives ulong as int."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"t": "ulong", "v": int(value)}
    return tag(value)


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(round(seconds * 1000))


def canonical(msg: Message, raw: bytes | None = None) -> dict:
    """The canonical form of a decoded proton message (every field, defaults included).

    With `raw`, the body section kind is read from the bytes (proton cannot tell a missing body
    from an amqp-value null)."""
    header = {"durable": bool(msg.durable), "priority": int(msg.priority), "ttl": _ms(msg.ttl) or 0,
              "first_acquirer": bool(msg.first_acquirer), "delivery_count": int(msg.delivery_count)}
    props = {
        "message_id": tag_id(msg.id), "user_id": (msg.user_id or b"").hex(), "to": msg.address,
        "subject": msg.subject, "reply_to": msg.reply_to, "correlation_id": tag_id(msg.correlation_id),
        "content_type": None if msg.content_type is None else str(msg.content_type),
        "content_encoding": None if msg.content_encoding is None else str(msg.content_encoding),
        "absolute_expiry_time": _ms(msg.expiry_time), "creation_time": _ms(msg.creation_time),
        "group_id": msg.group_id, "group_sequence": int(msg.group_sequence or 0),
        "reply_to_group_id": msg.reply_to_group_id,
    }
    app = {str(k): tag(v) for k, v in (msg.properties or {}).items()}
    ann = {str(k): tag(v) for k, v in (msg.annotations or {}).items()}
    kinds = [code for code, _, _ in sections(raw)] if raw is not None else None
    if kinds is not None and not any(c in (0x75, 0x76, 0x77) for c in kinds):
        body = {"section": "none"}
    elif kinds is not None and 0x75 in kinds or (kinds is None and msg.inferred and
                                                  isinstance(msg.body, (bytes, memoryview))):
        body = {"section": "data", "v": bytes(msg.body).hex()}
    elif kinds is not None and 0x76 in kinds or (kinds is None and msg.inferred and isinstance(msg.body, list)):
        body = {"section": "sequence", "v": [tag(e) for e in msg.body]}
    elif kinds is None and msg.body is None:
        body = {"section": "none"}
    else:
        body = {"section": "value", "v": tag(msg.body)}
    return {"header": header, "properties": props, "application_properties": app,
            "message_annotations": ann, "body": body}


def message_from_spec(spec: dict) -> Message:
    """A proton Message from a spec (the canonical form, any subset of it)."""
    m = Message()
    h = spec.get("header", {})
    if "durable" in h:
        m.durable = h["durable"]
    if "priority" in h:
        m.priority = h["priority"]
    if "ttl" in h:
        m.ttl = h["ttl"] / 1000.0
    if "first_acquirer" in h:
        m.first_acquirer = h["first_acquirer"]
    if "delivery_count" in h:
        m.delivery_count = h["delivery_count"]
    p = spec.get("properties", {})
    simple = {"to": "address", "subject": "subject", "reply_to": "reply_to", "group_id": "group_id",
              "reply_to_group_id": "reply_to_group_id", "group_sequence": "group_sequence"}
    for key, attr in simple.items():
        if key in p:
            setattr(m, attr, p[key])
    if "message_id" in p:
        m.id = untag(p["message_id"])
    if "correlation_id" in p:
        m.correlation_id = untag(p["correlation_id"])
    if "user_id" in p:
        m.user_id = bytes.fromhex(p["user_id"])
    if "content_type" in p:
        m.content_type = symbol(p["content_type"])
    if "content_encoding" in p:
        m.content_encoding = symbol(p["content_encoding"])
    if "absolute_expiry_time" in p:
        m.expiry_time = p["absolute_expiry_time"] / 1000.0
    if "creation_time" in p:
        m.creation_time = p["creation_time"] / 1000.0
    if "application_properties" in spec:
        m.properties = {k: untag(v) for k, v in spec["application_properties"].items()}
    if "message_annotations" in spec:
        m.annotations = {symbol(k): untag(v) for k, v in spec["message_annotations"].items()}
    body = spec.get("body", {"section": "none"})
    kind = body["section"]
    if kind == "data":
        m.body = bytes.fromhex(body["v"])
        m.inferred = True
    elif kind == "sequence":
        m.body = [untag(e) for e in body["v"]]
        m.inferred = True
    elif kind == "value":
        m.body = untag(body["v"])
        m.inferred = False
    return m


def encode_spec(spec: dict) -> bytes:
    """Encoded bytes for a spec; handles what proton's Message cannot say (amqp-value null)."""
    body = spec.get("body", {"section": "none"})
    if body["section"] == "value" and body["v"]["t"] == "null":
        head = dict(spec, body={"section": "none"})
        return message_from_spec(head).encode() + b"\x00\x53\x77\x40"
    return message_from_spec(spec).encode()


def mismatches(expected: dict, actual: dict) -> list[str]:
    """Field-by-field differences: every field given in `expected` must be equal in `actual`."""
    out = []
    for section, fields in expected.items():
        if section == "body":
            if actual.get("body") != fields:
                out.append(f"body: expected {fields}, got {actual.get('body')}")
            continue
        got = actual.get(section, {})
        for key, want in fields.items():
            have = got.get(key, "<absent>")
            if have != want:
                out.append(f"{section}.{key}: expected {want!r}, got {have!r}")
    return out


# ---------------------------------------------------------------------------------------------
# Raw layout

SECTION_NAMES = {0x70: "header", 0x71: "delivery-annotations", 0x72: "message-annotations",
                 0x73: "properties", 0x74: "application-properties", 0x75: "data",
                 0x76: "amqp-sequence", 0x77: "amqp-value", 0x78: "footer"}
_SYMBOLIC = {"amqp:header:list": 0x70, "amqp:delivery-annotations:map": 0x71,
             "amqp:message-annotations:map": 0x72, "amqp:properties:list": 0x73,
             "amqp:application-properties:map": 0x74, "amqp:data:binary": 0x75,
             "amqp:amqp-sequence:list": 0x76, "amqp:value:*": 0x77, "amqp:footer:map": 0x78}
_FIXED = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}


def skip_value(buf: bytes, pos: int) -> int:
    """The offset just past the AMQP-encoded value at `pos`."""
    code = buf[pos]
    pos += 1
    if code == 0x00:  # described: descriptor then value
        return skip_value(buf, skip_value(buf, pos))
    sub = code >> 4
    if sub in _FIXED:
        return pos + _FIXED[sub]
    if sub in (0xA, 0xC, 0xE):
        return pos + 1 + buf[pos]
    if sub in (0xB, 0xD, 0xF):
        return pos + 4 + struct.unpack_from(">I", buf, pos)[0]
    raise ValueError(f"bad AMQP format code 0x{code:02x} at {pos - 1}")


def _descriptor_code(buf: bytes, pos: int) -> int:
    code = buf[pos]
    if code == 0x53:
        return buf[pos + 1]
    if code == 0x80:
        return struct.unpack_from(">Q", buf, pos + 1)[0]
    if code == 0x44:
        return 0
    if code in (0xA3, 0xB3):
        width = 1 if code == 0xA3 else 4
        n = buf[pos + 1] if width == 1 else struct.unpack_from(">I", buf, pos + 1)[0]
        name = bytes(buf[pos + 1 + width:pos + 1 + width + n]).decode()
        return _SYMBOLIC.get(name, -1)
    return -1


def sections(raw: bytes) -> list[tuple[int, int, int]]:
    """(section code, start, end) for each section of an encoded message."""
    out = []
    pos = 0
    while pos < len(raw):
        if raw[pos] != 0x00:
            raise ValueError(f"section at {pos} is not a described value")
        end = skip_value(raw, pos)
        out.append((_descriptor_code(raw, pos + 1), pos, end))
        pos = end
    return out


def bare_message(raw: bytes) -> bytes:
    """The bare message: properties, application-properties and body sections, as bytes."""
    parts = [raw[s:e] for code, s, e in sections(raw) if 0x73 <= code <= 0x77]
    return b"".join(parts)


def section_codes(raw: bytes) -> list[str]:
    return [SECTION_NAMES.get(c, hex(c)) for c, _, _ in sections(raw)]
