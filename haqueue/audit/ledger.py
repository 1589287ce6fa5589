"""A client ledger for `haqueue audit lag --ledger` (design/audit-events.md, "Client ledgers"): one JSON
line per message a producer had confirmed or a consumer received, so the audit can tell what the
clients saw from what the brokers logged.

    ledger = Ledger("orders-ledger.jsonl", client="producer-1")
    ledger.confirmed("orders", message.id)      # when the broker accepted it
    ledger.received("orders", message.id)       # a consumer, for each message it got

Lines are written as they come (unbuffered, one `write` each): a client killed mid-run keeps what it
had recorded.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from .schema import CONFIRMED, RECEIVED


def ledger_id(message_id: Any) -> str:
    """A message-id as the audit's events give it: strings as they are, numbers in decimal, UUIDs in
    their usual form, binary in hex."""
    if isinstance(message_id, (bytes, bytearray)):
        return bytes(message_id).hex()
    return str(message_id)  # a UUID's str is its usual form


class Ledger:
    def __init__(self, path: str | os.PathLike[str], client: str) -> None:
        self.client = client
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def confirmed(self, queue: str, message_id: Any) -> None:
        self._line(queue, message_id, CONFIRMED)

    def received(self, queue: str, message_id: Any) -> None:
        self._line(queue, message_id, RECEIVED)

    def _line(self, queue: str, message_id: Any, op: str) -> None:
        line = {"client": self.client, "queue": queue, "id": ledger_id(message_id), "op": op,
                "t": time.time_ns() // 1000}
        os.write(self.fd, (json.dumps(line) + "\n").encode())

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
