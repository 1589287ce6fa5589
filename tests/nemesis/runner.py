"""One nemesis run, Jepsen's shape: clients writing ledgers, a plan of nemeses, heal, drain, check.

    outcome = run(cluster, plan, seed=7, workdir=tmp, queue="nemesis-1")

The producer (ledger_clients.py) runs throughout; the consumer too with `consume_during`, else only after the
plan, to drain. Without it every confirmed message is still queued when the nemesis strikes, which is
what exposes a loss at a failover (a consumer on the isolated primary's side would take the messages
it confirmed alone before they could be discarded: issue 27's loss then does not show). After a warm-up of WARMUP confirmed publishes,
each nemesis of the plan begins, holds, ends; then every fault is healed and the cluster must be healthy
again within HEAL_TIMEOUT (a failure raises). After the plan, AFTER more publishes must be confirmed (the
cluster serves again), the producer stops, the consumer drains the queue, and the checker reads the
ledger. The outcome has the counts and the duplicate bound; asserting on them is the caller's.
"""
from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ha_harness

import checker
from nemeses import Nemesis

WARMUP = 200
AFTER = 100
HEAL_TIMEOUT = 120.0
CONFIRM_TIMEOUT = 90.0


@dataclass
class Outcome:
    coordinator: str
    sync: str
    min_confirmations: int | None
    nemeses: list[str]
    seed: int
    consume_during: bool = False
    confirmed: int = 0
    received: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    duplicate_bound: int = 0
    left_on_queue: int | None = None
    seconds: float = 0.0
    heal_seconds: list[float] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    lost_ids: str = ""
    quarantined: int = 0  # of the lost, how many a broker kept in data_dir/diverged (recoverable)

    @property
    def mode(self) -> str:
        return self.sync if self.min_confirmations is None else f"{self.sync}+min_confirmations={self.min_confirmations}"

    def line(self) -> str:
        return (f"{self.coordinator} {self.mode} [{'+'.join(self.nemeses)}] seed {self.seed}"
                f"{', consuming' if self.consume_during else ''}: confirmed "
                f"{self.confirmed}, lost {self.lost}, duplicated {self.duplicated} (bound {self.duplicate_bound}), "
                f"unexpected {self.unexpected}, quarantined {self.quarantined}, left {self.left_on_queue}, {self.seconds:.0f} s, healed in "
                f"{', '.join(f'{s:.1f}' for s in self.heal_seconds)} s" + (f"; lost ids {self.lost_ids}" if self.lost else ""))

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mode": self.mode}


def run(cluster: Any, plan: list[Nemesis], seed: int, workdir: Path, queue: str,
        consume_during: bool = False, log: Any = print) -> Outcome:
    rng = random.Random(seed)
    outcome = Outcome(cluster.coordinator, cluster.sync, cluster.min_confirmations, [n.name for n in plan], seed,
                      consume_during)
    ledger = workdir / f"{queue}.jsonl"
    started = time.monotonic()
    load = cluster.load(queue, ledger)
    load.start_producer()
    if consume_during:
        load.start_consumer()

    def note(text: str) -> None:
        outcome.events.append(f"+{time.monotonic() - started:6.1f}s {text}")
        log(f"nemesis: {outcome.events[-1]}")
    try:
        load.wait_confirmed(WARMUP, CONFIRM_TIMEOUT)
        for nemesis in plan:
            note(f"{nemesis.name}: {nemesis.begin(cluster, rng)}, held {nemesis.hold:.1f} s")
            time.sleep(nemesis.hold)  # the fault's duration
            nemesis.end(cluster)
            healing = time.monotonic()
            primary = cluster.heal_and_wait(HEAL_TIMEOUT)
            outcome.heal_seconds.append(time.monotonic() - healing)
            note(f"healed: healthy, primary {primary.name}, {load.confirmed_count()} confirmed")
        load.wait_confirmed(AFTER, CONFIRM_TIMEOUT)
    finally:
        load.stop_producer(load.send_timeout + load.connect_timeout + 5)
        load.start_consumer()
        load.drain(lambda: cluster.depth(queue))
        ha_harness.Load.stop(load, 10)
        outcome.left_on_queue = cluster.depth(queue)
        note(f"drained: {load.confirmed_count()} confirmed, {load.received_count()} received; "
             f"failures: producer {load.producer_failures}, consumer {load.consumer_failures}")
    verdict = checker.check([ledger], load.attempted())
    outcome.__dict__.update(verdict.counts())
    outcome.duplicate_bound = load.duplicate_bound()
    outcome.lost_ids = checker.ranges(verdict.lost)
    kept = checker.quarantined(cluster.store(n) for n in cluster.nodes)
    outcome.quarantined = sum(1 for key in verdict.lost if tuple(key.split("/", 1)) in kept)
    outcome.seconds = time.monotonic() - started
    log(f"nemesis: {outcome.line()}")
    return outcome
