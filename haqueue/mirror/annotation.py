"""The source's seq in a mirrored message's bytes (protocol.SEQ_ANNOTATION): added by the source as it sends,
read back by a standby that must learn again what it holds (after a restart or a failover of its own).

Only the message-annotations section is written anew; the header before it and the bare message after it are
copied as they are, so the standby holds the source's message plus one annotation. It is done here with bytes, not
with messaging/annotations.py's `with_annotations`, which re-encodes the map through proton's Data: that took
19-50 µs a message against 3-6 µs, on the source primary's thread for every message mirrored.
"""
from __future__ import annotations

from typing import Final

from ..broker.message import MESSAGE_ANNOTATIONS, message_annotations, read, skip
from .protocol import SEQ_ANNOTATION

_SECTION: Final = b"\x00\x53"  # a section's descriptor starts so (a small ulong follows)
_HEADER: Final = _SECTION + b"\x70"
_DELIVERY_ANNOTATIONS: Final = _SECTION + b"\x71"
_ANNOTATIONS: Final = _SECTION + bytes([MESSAGE_ANNOTATIONS])
_KEY: Final = b"\xa3" + bytes([len(SEQ_ANNOTATION)]) + SEQ_ANNOTATION.encode()  # sym8


def with_seq(data: bytes, seq: int) -> bytes:
    """The message with SEQ_ANNOTATION set to `seq` (one it had already, from an earlier mirror, replaced)."""
    pos = skip(data, 3) if data.startswith(_HEADER) else 0
    if data[pos:pos + 3] == _DELIVERY_ANNOTATIONS:
        pos = skip(data, pos + 3)
    pairs = [_KEY + b"\x80" + seq.to_bytes(8, "big")]
    end = pos
    if data[pos:pos + 3] == _ANNOTATIONS:
        end = skip(data, pos + 3)
        pairs += _other_pairs(data, pos + 3)
    body = b"".join(pairs)
    section = _ANNOTATIONS + b"\xd1" + (len(body) + 4).to_bytes(4, "big") + (2 * len(pairs)).to_bytes(4, "big")
    return data[:pos] + section + body + data[end:]


def _other_pairs(data: bytes, at: int) -> list[bytes]:
    """The encoded key-value pairs of the map at `at` but SEQ_ANNOTATION's."""
    code = data[at]
    if code == 0xC1:  # map8: size, count
        count, p = data[at + 2], at + 3
    elif code == 0xD1:  # map32
        count, p = int.from_bytes(data[at + 5:at + 9], "big"), at + 9
    else:  # map0 is not an encoding; anything else is no map: leave it out
        return []
    pairs = []
    for _ in range(count // 2):
        value_at = skip(data, p)
        end = skip(data, value_at)
        if read(data, p) != SEQ_ANNOTATION:
            pairs.append(data[p:end])
        p = end
    return pairs


def seq_of(data: bytes) -> int | None:
    """The source seq a mirrored message carries, None if none (a cold path: rebuilding a standby's index)."""
    seq = message_annotations(data).get(SEQ_ANNOTATION)
    return seq if isinstance(seq, int) else None
