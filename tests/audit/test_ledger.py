"""The client ledger helper (haqueue/audit/ledger.py): the lines `haqueue audit lag --ledger` reads."""
from __future__ import annotations

import json
import time
import uuid

from haqueue.audit import schema
from haqueue.audit.ledger import Ledger


def test_a_producer_and_a_consumer_write_their_ledger_in_two_lines(tmp_path):
    path = tmp_path / "ledger.jsonl"
    before = time.time_ns() // 1000
    with Ledger(path, client="producer-1") as ledger:
        ledger.confirmed("orders", "order-1")
        ledger.confirmed("orders", 17)
        ledger.confirmed("orders", uuid.UUID(int=7))
        ledger.confirmed("orders", b"\x01\xff")
    with Ledger(path, client="consumer-1") as ledger:  # appends
        ledger.received("orders", "order-1")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["client"], e["queue"], e["id"], e["op"]) for e in lines] == [
        ("producer-1", "orders", "order-1", "confirmed"), ("producer-1", "orders", "17", "confirmed"),
        ("producer-1", "orders", "00000000-0000-0000-0000-000000000007", "confirmed"),
        ("producer-1", "orders", "01ff", "confirmed"), ("consumer-1", "orders", "order-1", "received")]
    assert all(set(e) == set(schema.LEDGER_FIELDS) and before <= e["t"] <= time.time_ns() // 1000 for e in lines)
