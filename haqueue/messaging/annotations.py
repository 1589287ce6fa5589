"""Adding message annotations to an encoded message (cold path: a dead-lettered message's reason)."""
from __future__ import annotations

from typing import Any

from proton import Data, symbol

from ..broker.message import DELIVERY_ANNOTATIONS, HEADER, MESSAGE_ANNOTATIONS, sections, skip

_MA_DESCRIPTOR = b"\x00\x53\x72"


def with_annotations(data: bytes, added: dict[str, Any]) -> bytes:
    """The message with `added` in its message annotations (keys sent as symbols, replacing any of the same
    name); the other sections stay as they were, byte for byte."""
    found = sections(data)
    annotations: dict[Any, Any] = {}
    if MESSAGE_ANNOTATIONS in found:
        start = found[MESSAGE_ANNOTATIONS]
        end = skip(data, start)
        decoded = Data()
        decoded.decode(data[start:end])
        annotations = decoded.get_object() or {}
        before, after = data[:start - len(_MA_DESCRIPTOR)], data[end:]
    else:  # after the header and delivery annotations, before everything else
        cut = max((skip(data, found[code]) for code in (HEADER, DELIVERY_ANNOTATIONS) if code in found), default=0)
        before, after = data[:cut], data[cut:]
    annotations.update({symbol(key): value for key, value in added.items()})
    encoded = Data()
    encoded.put_object(annotations)
    return before + _MA_DESCRIPTOR + encoded.encode() + after
