"""The ledger checker: lost, duplicated and unexpected messages, as `haqueue audit lag --ledger` defines
them (design/audit-events.md, "Client ledgers"), computed in plain Python over the ledger files.

`haqueue/audit/lag.py` computes these in Spark only (`_ledger_tables` joins the ledgers with the
brokers' events, a JVM start of 5-10 s and ~600 MB per check): too costly per nemesis run on two
cores. The definitions are the same with one substitution: `lost` there is "confirmed, never received
and not on the last primary's queue at the end"; here every queue is drained after the cluster healed,
so nothing confirmed can still be on a queue, and the drain's own leftover (`left_on_queue`, the
primary's depth after the drain) is reported beside it. `unexpected` there is "received, never confirmed
nor enqueued by any primary"; here, without events, "never enqueued" is "never sent": received ids
neither confirmed nor in the producers' `attempted` set.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from haqueue.audit.ledger import ledger_id
from haqueue.audit.schema import CONFIRMED, RECEIVED


@dataclass
class Verdict:
    confirmed: int
    received: int  # distinct
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {"confirmed": self.confirmed, "received": self.received, "lost": len(self.lost),
                "duplicated": len(self.duplicated), "unexpected": len(self.unexpected)}


def read(paths: Iterable[Path]) -> tuple[set[tuple[str, str]], Counter]:
    """(confirmed (queue, id) pairs, receipts per (queue, id)) from JSON-lines ledgers."""
    confirmed: set[tuple[str, str]] = set()
    received: Counter = Counter()
    for path in paths:
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                entry = json.loads(line)
                key = (entry["queue"], str(entry["id"]))
                if entry["op"] == CONFIRMED:
                    confirmed.add(key)
                elif entry["op"] == RECEIVED:
                    received[key] += 1
    return confirmed, received


def check(paths: Iterable[Path], attempted: Iterable[tuple[str, str]] = ()) -> Verdict:
    confirmed, received = read(paths)
    sent = confirmed | set(attempted)
    return Verdict(
        confirmed=len(confirmed), received=len(received),
        lost=sorted(f"{q}/{i}" for q, i in confirmed - received.keys()),
        duplicated=sorted(f"{q}/{i}" for (q, i), n in received.items() if n > 1),
        unexpected=sorted(f"{q}/{i}" for q, i in received.keys() - sent))


def ranges(ids: list[str]) -> str:
    """`q/q-7, q/q-8, q/q-9, q/q-12` -> `q-7..9, q-12`: a loss is usually one unbroken run of ids."""
    runs: list[list] = []
    ids = [i.partition("/")[2] for i in ids]
    for text in sorted(ids, key=lambda s: (s.rpartition("-")[0], int(s.rpartition("-")[2] or 0))):
        stem, _, n = text.rpartition("-")
        if runs and runs[-1][0] == stem and runs[-1][2] + 1 == int(n):
            runs[-1][2] = int(n)
        else:
            runs.append([stem, int(n), int(n)])
    return ", ".join(f"{s}-{a}" + (f"..{b}" if b != a else "") for s, a, b in runs)


def quarantined(data_dirs: Iterable[Path]) -> set[tuple[str, str]]:
    """(queue, id) of every message the brokers set aside at a rejoin (`data_dir/diverged/`, read on the
    host as `haqueue diverged list` reads it): a lost message found here was kept and can be republished;
    one not found is gone. Empty with a haqueue that predates the quarantine."""
    try:
        from proton import Message

        from haqueue.ha.quarantine import diverged_files, file_queue, read_messages
    except ImportError:
        return set()
    found: set[tuple[str, str]] = set()
    for data_dir in data_dirs:
        for path in diverged_files(data_dir):  # not yet republished (nobody republishes during a run)
            for _, data in read_messages(path):
                message = Message()
                message.decode(data)
                found.add((file_queue(path), ledger_id(message.id)))
    return found
