"""The nemesis checker on hand-written ledgers (fast: no cluster)."""
from __future__ import annotations

from haqueue.audit.ledger import Ledger

import checker


def test_lost_duplicated_unexpected_as_audit_lag_defines_them(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with Ledger(path, "producer") as producer, Ledger(path, "consumer") as consumer:
        for i in range(10):
            producer.confirmed("q", f"q-{i}")
        for i in [0, 1, 2, 2, 5, 6, 7, 8, 9, 10, 11]:  # 3, 4 never come; 2 twice; 10 in flight; 11 never sent
            consumer.received("q", f"q-{i}")
    verdict = checker.check([path], attempted={("q", "q-10")})
    assert verdict.counts() == {"confirmed": 10, "received": 10, "lost": 2, "duplicated": 1, "unexpected": 1}
    assert verdict.lost == ["q/q-3", "q/q-4"] and verdict.duplicated == ["q/q-2"] and verdict.unexpected == ["q/q-11"]
    assert checker.ranges(verdict.lost) == "q-3..4"
    assert checker.ranges(["q/q-1", "q/q-2", "q/q-7"]) == "q-1..2, q-7"
