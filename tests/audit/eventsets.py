"""Synthetic audit event sets with known answers, written exactly as brokers write them (schema.py).

`EventLog` collects events per broker process (run) and writes one file per run. `failover_scenario`
is the reference set the tests and the notebook audit; its docstring states every figure the audit
must report for it. `partition_scenario` is issue 27's partition under the floor's opt-out.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from haqueue.audit import schema

T0 = 1_800_000_000_000_000  # µs since the epoch: 2027-01-15 08:00:00 UTC
MS = 1000
SECOND = 1_000_000
EPOCH2 = 2 << 40  # the first seq a primary of epoch 2 gives
SIZE = 3  # the brokers of the scenarios' cluster (b0, b1, b2), as their marks say
RUNS = (1, 2, 3, 4)  # the scenarios' broker processes: b0, b1, b2, and b0 again after a restart


class EventLog:
    def __init__(self) -> None:
        self.runs: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)

    def add(self, broker: str, run: int, event: str, t: int, role: str, epoch: int, **fields: Any) -> None:
        lines = self.runs[(broker, run)]
        lines.append({"t": t, "event": event, "broker": broker, "role": role, "epoch": epoch, "run": run,
                      "n": len(lines) + 1, **fields})

    def message(self, broker: str, run: int, event: str, t: int, role: str, epoch: int, seq: int,
                queue: str = "q", **fields: Any) -> None:
        self.add(broker, run, event, t, role, epoch, queue=queue, uid=f"uid-{queue}", seq=seq,
                 message_id=f"msg-{seq}", **fields)

    def mark(self, broker: str, run: int, t: int, role: str, epoch: int) -> None:
        self.add(broker, run, schema.MARK, t, role, epoch, cluster_size=SIZE)

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        for part, ((broker, run), lines) in enumerate(sorted(self.runs.items()), start=1):
            with open(directory / f"{broker}-{part:06d}.jsonl", "w", encoding="utf-8") as f:
                f.writelines(json.dumps(line) + "\n" for line in lines)
        return directory


def _started() -> EventLog:
    """b0 primary of epoch 1, b1 and b2 its backups: each marks its log at T0."""
    log = EventLog()
    for broker, run, role in zip(("b0", "b1", "b2"), RUNS, (schema.PRIMARY, schema.BACKUP, schema.BACKUP)):
        log.mark(broker, run, T0, role, 1)
    return log


def failover_scenario() -> EventLog:
    """Queue q on b0 (primary, epoch 1) with backups b1 and b2; b0 dies, b1 takes over (epoch 2), b0
    comes back as a backup and catches up. Known answers:

    - epoch 1: seq 1..10 enqueued on b0 at T0 + seq ms, each confirmed 2 ms later naming b1 and b2;
      seq 1..5 dequeued at T0 + 50 ms + seq × 10 µs.
    - b1 receives every message live, lag seq × 100 µs: p50 0.5 ms, p95 and p99 and max 1.0 ms; it
      mirrors the five dequeues.
    - b2 receives live with lag 0.3 ms, but never seq 7 (missing 1), seq 4 twice (duplicates 1),
      seq 6 before seq 5 (order violations 1), and never applies the dequeue of seq 5 (1 not mirrored).
    - epoch 2 from T0 + 2 s: b1 enqueues EPOCH2+1 and +2 (confirmed 2 ms later naming b2, which
      receives them live with lag 0.3 ms) and dequeues seq 6, enqueued in epoch 1 (1 inherited).
    - b0 restarts (a new run) and receives EPOCH2+2, EPOCH2+1, 10, 9, 8, 7 in catch-up.
    Completion latency 2 ms for all 12 messages; no loss for b0 and b1.
    """
    log = _started()
    run_b0, run_b1, run_b2, run_b0_again = RUNS
    for seq in range(1, 11):
        t = T0 + seq * MS
        log.message("b0", run_b0, schema.ENQUEUE, t, schema.PRIMARY, 1, seq)
        log.message("b1", run_b1, schema.REPLICATE, t + seq * 100, schema.BACKUP, 1, seq, mode=schema.LIVE,
                    enqueued=t)
        log.message("b0", run_b0, schema.COMPLETE, t + 2 * MS, schema.PRIMARY, 1, seq, backups=["b1", "b2"])
    for seq in (1, 2, 3, 4, 4, 6, 5, 8, 9, 10):  # the order b2 logs them in
        t = T0 + seq * MS
        log.message("b2", run_b2, schema.REPLICATE, t + 300, schema.BACKUP, 1, seq, mode=schema.LIVE, enqueued=t)
    for seq in range(1, 6):
        t = T0 + 50 * MS + seq * 10
        log.message("b0", run_b0, schema.DEQUEUE, t, schema.PRIMARY, 1, seq)
        log.message("b1", run_b1, schema.DEQUEUE, t + 200, schema.BACKUP, 1, seq)
        if seq != 5:
            log.message("b2", run_b2, schema.DEQUEUE, t + 300, schema.BACKUP, 1, seq)
    log.mark("b0", run_b0, T0 + SECOND, schema.PRIMARY, 1)  # its last flush before it died

    t2 = T0 + 2 * SECOND
    log.mark("b1", run_b1, t2, schema.PRIMARY, 2)
    for i in (1, 2):
        seq, t = EPOCH2 + i, t2 + i * MS
        log.message("b1", run_b1, schema.ENQUEUE, t, schema.PRIMARY, 2, seq)
        log.message("b2", run_b2, schema.REPLICATE, t + 300, schema.BACKUP, 2, seq, mode=schema.LIVE, enqueued=t)
        log.message("b1", run_b1, schema.COMPLETE, t + 2 * MS, schema.PRIMARY, 2, seq, backups=["b2"])
    log.message("b1", run_b1, schema.DEQUEUE, t2 + 10 * MS, schema.PRIMARY, 2, 6)
    log.message("b2", run_b2, schema.DEQUEUE, t2 + 10 * MS + 300, schema.BACKUP, 2, 6)
    log.mark("b0", run_b0_again, t2 + 20 * MS, schema.BACKUP, 2)
    for position, seq in enumerate([EPOCH2 + 2, EPOCH2 + 1, 10, 9, 8, 7]):
        log.message("b0", run_b0_again, schema.REPLICATE, t2 + 21 * MS + position, schema.BACKUP, 2, seq,
                    mode=schema.CATCHUP, enqueued=0)
    end = T0 + 5 * SECOND
    for broker, run, role in (("b0", run_b0_again, schema.BACKUP), ("b1", run_b1, schema.PRIMARY),
                              ("b2", run_b2, schema.BACKUP)):
        log.mark(broker, run, end, role, 2)
    return log


def partition_scenario() -> EventLog:
    """Issue 27 under `min_confirmations: 1`: b0 (primary, epoch 1) confirms seq 1..3 at T0 + seq ms naming
    b1 and b2, which receive them live; cut off from them, it confirms seq 4 and 5 naming no backup (at risk:
    1 holder of 3, a majority is 2). b1 takes over (epoch 2) and confirms EPOCH2+1 naming no backup: b2, still
    catching up (not ready, so not named), had logged its copy before (2 holders: not at risk). b0 rejoins as a
    backup (a new run), catches up EPOCH2+1 and keeps seq 4 and 5 aside (diverged): b1 never had them; and seq 6,
    which b0 had journalled when it was killed, before it logged the enqueue (never confirmed: kept aside alone).
    Known answers: at_risk 2 and diverged 2 on queue q (seqs 4, 5), kept aside 1 (seq 6), nothing missing, no
    dequeue unmirrored."""
    log = _started()
    run_b0, run_b1, run_b2, run_b0_again = RUNS
    for seq in range(1, 6):
        t = T0 + seq * MS
        reached = seq <= 3  # then b0 is cut off from its backups
        log.message("b0", run_b0, schema.ENQUEUE, t, schema.PRIMARY, 1, seq)
        for backup, run in (("b1", run_b1), ("b2", run_b2)) if reached else ():
            log.message(backup, run, schema.REPLICATE, t + 300, schema.BACKUP, 1, seq, mode=schema.LIVE, enqueued=t)
        log.message("b0", run_b0, schema.COMPLETE, t + 2 * MS, schema.PRIMARY, 1, seq,
                    backups=["b1", "b2"] if reached else [])
    log.mark("b0", run_b0, T0 + SECOND, schema.PRIMARY, 1)

    t2 = T0 + 2 * SECOND
    log.mark("b1", run_b1, t2, schema.PRIMARY, 2)
    log.message("b1", run_b1, schema.ENQUEUE, t2 + MS, schema.PRIMARY, 2, EPOCH2 + 1)
    log.message("b2", run_b2, schema.REPLICATE, t2 + MS + 300, schema.BACKUP, 2, EPOCH2 + 1, mode=schema.LIVE,
                enqueued=t2 + MS)
    log.message("b1", run_b1, schema.COMPLETE, t2 + 3 * MS, schema.PRIMARY, 2, EPOCH2 + 1, backups=[])
    log.mark("b0", run_b0_again, t2 + 20 * MS, schema.BACKUP, 2)
    log.message("b0", run_b0_again, schema.REPLICATE, t2 + 21 * MS, schema.BACKUP, 2, EPOCH2 + 1, mode=schema.CATCHUP,
                enqueued=0)
    for seq in (4, 5, 6):
        log.message("b0", run_b0_again, schema.DIVERGED, t2 + 22 * MS, schema.BACKUP, 2, seq)
    for broker, run, role in (("b0", run_b0_again, schema.BACKUP), ("b1", run_b1, schema.PRIMARY),
                              ("b2", run_b2, schema.BACKUP)):
        log.mark(broker, run, T0 + 5 * SECOND, role, 2)
    return log
