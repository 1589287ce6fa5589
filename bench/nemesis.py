#!/usr/bin/env python3
"""The nemesis suite run long (issue 27): random plans of nemeses against one coordinator, every sync mode.

    sudo .venv/bin/python bench/nemesis.py --minutes 30 --coordinator pacemaker --seed 27
    .venv/bin/python bench/nemesis.py --minutes 10 --coordinator zookeeper --modes all,quorum_disk,all+min1

The minutes are shared among the modes. Per mode it builds one cluster (tests/nemesis/pool.py: the
Pacemaker netns harness, or brokers and a ZooKeeper ensemble in netns) and runs rounds until the mode's
share is spent: each round a fresh queue, a plan of `--per-round` nemeses drawn from the seeded
generator (tests/nemesis/nemeses.py; the consumer runs during the round or only to drain, also drawn),
healed and drained, then checked (tests/nemesis/checker.py: lost, duplicated, unexpected from the
clients' ledgers). Every round prints one line; the end prints a Markdown table for bench/RESULTS.md, per
mode: rounds, nemeses applied, confirmed, lost, duplicated (and their bound), unexpected, and the seed to
replay it with. `--json FILE` also writes every round. Exit status 1 if a mode other than the opt-out
`ha.min_confirmations: 1` (mode `all+min1`) lost a confirmed message, or any mode showed an unexpected
message or duplicates above the bound, or the cluster was not healthy again in time after a round
(counted in the table's last column; the cluster is then rebuilt); 2 if the coordinator cannot run here.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "nemesis"), str(REPO / "tests"), str(REPO / "tests" / "ha"), str(REPO)]

import disks  # noqa: E402
import nemeses  # noqa: E402
import runner  # noqa: E402
from pool import Pool, unavailable  # noqa: E402

unhealthy: dict[str, int] = {}  # rounds per mode after which the cluster was not healthy (or served) in time

MODES = {"all": ("all", None), "all_disk": ("all_disk", None), "quorum_mem": ("quorum_mem", None),
         "quorum_disk": ("quorum_disk", None), "all+min1": ("all", 1)}


def log(text: str) -> None:
    print(f"{datetime.now(timezone.utc):%H:%M:%S} {text}", file=sys.stderr, flush=True)


def run_mode(pool: Pool, coordinator: str, mode: str, seconds: float, rng: random.Random, per_round: int,
             hold: float, workdir: Path) -> list[runner.Outcome]:
    sync, floor = MODES[mode]
    exclude = ("slow-disk",) if disks.blkio_available() else ()
    outcomes: list[runner.Outcome] = []
    deadline = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < deadline or not rounds:
        rounds += 1
        cluster = pool.healthy(coordinator, sync, floor)
        round_seed = rng.randrange(1 << 31)
        plan = nemeses.mixed(random.Random(round_seed), per_round, cluster.backup_timeout, hold, exclude)
        consume = random.Random(round_seed).random() < 0.5
        queue = f"nemesis-{mode.replace('+', '-')}-{rounds}"
        try:
            outcome = runner.run(cluster, plan, round_seed, workdir, queue, consume_during=consume, log=log)
        except AssertionError as e:  # not healthy again in time, or no service after: a finding, not a crash
            print(f"{coordinator} {mode} round seed {round_seed} [{'+'.join(n.name for n in plan)}]: FAILED: "
                  f"{str(e).splitlines()[0]}", flush=True)
            unhealthy[mode] = unhealthy.get(mode, 0) + 1
            continue
        outcomes.append(outcome)
        print(outcome.line(), flush=True)
    return outcomes


def table(coordinator: str, seed: int, minutes: float, results: dict[str, list[runner.Outcome]]) -> str:
    lines = [f"Nemesis run, {coordinator}, {minutes:g} min, seed {seed} "
             f"(`bench/nemesis.py --minutes {minutes:g} --coordinator {coordinator} --seed {seed} "
             f"--modes {','.join(results)}`), {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC:", "",
             "| mode | rounds | nemeses | confirmed | lost | duplicated (bound) | unexpected | heal s (max) | not healed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for mode, outcomes in results.items():
        applied = Counter(n for o in outcomes for n in o.nemeses)
        heals = [s for o in outcomes for s in o.heal_seconds]
        lines.append(
            f"| `{mode}` | {len(outcomes)} | {', '.join(f'{n} {c}' for n, c in sorted(applied.items()))} | "
            f"{sum(o.confirmed for o in outcomes):,} | {sum(o.lost for o in outcomes):,} | "
            f"{sum(o.duplicated for o in outcomes):,} ({sum(o.duplicate_bound for o in outcomes):,}) | "
            f"{sum(o.unexpected for o in outcomes):,} | {max(heals, default=0):.1f} | {unhealthy.get(mode, 0)} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="in all, shared among the modes")
    parser.add_argument("--coordinator", choices=("pacemaker", "zookeeper"), required=True)
    parser.add_argument("--seed", type=int, default=None, help="default: random, printed")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--per-round", type=int, default=3, help="nemeses per round")
    parser.add_argument("--hold", type=float, default=12.0, help="seconds a partition or disk fault holds")
    parser.add_argument("--json", type=Path, help="write every round's outcome here")
    parser.add_argument("--keep", action="store_true", help="keep the clusters' files")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        parser.error(f"unknown mode {', '.join(bad)}")
    why = unavailable(args.coordinator)
    if why:
        print(f"bench/nemesis.py: cannot run {args.coordinator} here: {why}", file=sys.stderr)
        return 2
    log(f"seed {seed} (replay: --seed {seed})")
    rng = random.Random(seed)
    results: dict[str, list[runner.Outcome]] = {}
    pool = Pool(keep_files=args.keep, log=log)
    workdir = Path(tempfile.mkdtemp(prefix="nemesis-ledgers-"))
    try:
        for mode in modes:
            results[mode] = run_mode(pool, args.coordinator, mode, args.minutes * 60 / len(modes), rng,
                                     args.per_round, args.hold, workdir)
    finally:
        pool.close()
        if args.json:
            args.json.write_text("\n".join(json.dumps(o.as_dict()) for os_ in results.values() for o in os_) + "\n")
        print(table(args.coordinator, seed, args.minutes, results))
        log(f"ledgers in {workdir}; seed {seed}")
    failed = bool(unhealthy) or any((o.lost and o.min_confirmations != 1) or o.unexpected or o.duplicated > o.duplicate_bound
                 for outcomes in results.values() for o in outcomes)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
