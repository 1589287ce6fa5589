"""A message's properties.message-id, read from its encoded bytes (the audit log's one look at a message).

Cheaper than `broker.message.Routing`, which also reads the message annotations: this walks the
sections before the properties by their encoded sizes and decodes one field.
"""
from __future__ import annotations

import struct
import uuid
from typing import Any

from ..broker.message import PROPERTIES, MalformedMessage, read, skip

_U32 = struct.Struct(">I")


def message_id(data: bytes) -> Any:
    """The message-id (str, int, bytes) or None when the message has none (or cannot be read)."""
    pos = 0
    try:
        while data[pos] == 0x00 and data[pos + 1] == 0x53:
            code = data[pos + 2]
            if code == PROPERTIES:
                pos += 3
                ctor = data[pos]
                if ctor == 0xC0 and data[pos + 2]:  # list8: size, count, fields
                    return _field(data, pos + 3)
                if ctor == 0xD0 and _U32.unpack_from(data, pos + 5)[0]:  # list32
                    return _field(data, pos + 9)
                return None  # list0, or no fields
            if code > PROPERTIES:  # past the properties: there are none
                return None
            pos = skip(data, pos + 3)
    except (IndexError, ValueError, struct.error, MalformedMessage):  # cut short, or not UTF-8
        pass
    return None


def _field(data: bytes, pos: int) -> Any:
    if data[pos] == 0x98:  # uuid: `read` gives its 16 bytes, which would print like a binary id
        return uuid.UUID(bytes=bytes(data[pos + 1:pos + 17]))
    return read(data, pos)
