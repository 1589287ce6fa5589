"""A peeked message as the console shows it: its header and properties, application properties and a
preview of its body (decoded on the console's thread, never the broker's loop)."""
from __future__ import annotations

import json
from typing import Any

from proton import Message

PREVIEW = 1000  # characters of a body shown


def describe(data: bytes) -> dict[str, Any]:
    message = Message()
    try:
        message.decode(data)
    except Exception as error:  # noqa: BLE001 - proton raises its own errors; the page says what went wrong
        return {"size": len(data), "error": f"cannot decode: {error}"}
    content_type = message.content_type
    fields = {"id": message.id, "subject": message.subject, "correlation_id": message.correlation_id,
              "content_type": content_type if content_type != "None" else None,  # none is symbol('None')
              "to": message.address, "reply_to": message.reply_to, "group_id": message.group_id,
              "creation_time": message.creation_time or None}
    application: dict[Any, Any] = message.properties or {}
    annotated: dict[Any, Any] = message.annotations or {}
    return {"size": len(data), "durable": message.durable, "priority": message.priority,
            "ttl": message.ttl or None, "delivery_count": message.delivery_count,
            "properties": {k: _text(v) for k, v in fields.items() if v is not None},
            "application_properties": {str(k): _text(v) for k, v in application.items()},
            "annotations": {str(k): _text(v) for k, v in annotated.items()},
            "body": _preview(message.body)}


def _text(value: Any) -> Any:
    """JSON's own types as they are; any other (proton's symbols, timestamps, UUIDs) as its text."""
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _preview(body: Any) -> str:
    if isinstance(body, (bytes, bytearray, memoryview)):
        raw = bytes(body)
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            text = raw[:PREVIEW // 2].hex() + (" (binary)" if len(raw) else "")
    elif isinstance(body, str):
        text = body
    else:
        text = json.dumps(body, default=str)
    return text if len(text) <= PREVIEW else text[:PREVIEW] + f"… ({len(text)} characters)"
