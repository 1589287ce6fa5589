#!/usr/bin/env python3
"""What writing audit events costs in throughput: the same broker set-up with and without
`audit: {dir: ...}`, driven at saturation by bench/run.py's rhea producer and consumer (100-byte
bodies, at-least-once).

Both set-ups run side by side (the idle one costs nothing); each round is one saturation run on
each, in the order plain, audit, then audit, plain in the next round, so that a machine whose speed
drifts (this one's does, by ±15 % within minutes) treats both alike. Reported: the median of the
rounds' cost (1 - audit msg/s / plain msg/s of the round), median msg/s and broker CPU per message
of each set-up, and the audit lines written per message (checks that every event was logged).

    .venv/bin/python bench/audit_throughput.py [--setup standalone|cluster] [--rounds 8]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402  (bench/run.py)

STANDALONE = "{python} -m haqueue broker --config {data_dir}/broker.yaml"
CLUSTER = ("{python} -m haqueue cluster up --size 3 --public 127.0.0.1:{port} --dir {data_dir}/cluster "
           "--base-port {base_port}")


def start(setup: str, audit: bool) -> run.CommandBroker:
    template = STANDALONE if setup == "standalone" else CLUSTER.replace("{base_port}", str(run.free_port()))
    if setup == "cluster" and audit:
        template += " --audit-dir {data_dir}/audit"
    broker = run.CommandBroker(template, f"{setup}{' + audit' if audit else ''}", None, 60)
    if setup == "standalone":
        audit_section = f"audit: {{dir: {broker.data_dir}/audit}}\n" if audit else ""
        Path(broker.data_dir, "broker.yaml").write_text(
            f"name: bench\nlisten: ['127.0.0.1:{broker.port}']\ndata_dir: {broker.data_dir}\n{audit_section}")
    broker.start()
    return broker


def audit_lines(broker: run.CommandBroker) -> int:
    # rglob: under cluster up each broker writes in a directory of its own (audit/broker-N)
    return sum(f.read_bytes().count(b"\n") for f in Path(broker.data_dir, "audit").rglob("*.jsonl"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setup", choices=("standalone", "cluster"), default="standalone")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--messages", type=int, default=200_000)
    args = ap.parse_args()
    opts = SimpleNamespace(inflight=1000, credit=1000, durable=False)
    results: dict[bool, list[dict]] = {False: [], True: []}
    brokers = {False: start(args.setup, False)}
    try:
        brokers[True] = start(args.setup, True)
        for round_ in range(args.rounds):
            for audit in (False, True) if round_ % 2 == 0 else (True, False):
                r = run.saturation(brokers[audit], 100, args.messages, opts)
                if "error" in r:
                    raise SystemExit(f"{brokers[audit].label}: {r['error']}")
                run.log(f"round {round_ + 1} {brokers[audit].label}: {r['msgs_per_s']:.0f} msg/s, "
                        f"{r['broker_cpu_us_per_msg']:.1f} µs/msg ({r['broker_sys_us_per_msg']:.1f} sys), other load {r['other_load_cores']:.2f}")
                results[audit].append(r)
        warm = min(max(args.messages // 10, 2000), 20000)
        lines_per_message = audit_lines(brokers[True]) / (args.rounds * (args.messages + warm))
    finally:
        for broker in brokers.values():
            broker.stop()

    def median(audit: bool, key: str) -> float:
        return statistics.median(r[key] for r in results[audit])

    costs = [1 - a["msgs_per_s"] / p["msgs_per_s"] for p, a in zip(results[False], results[True])]
    print("| setup | cost (median of rounds) | msg/s plain | msg/s + audit | broker CPU µs/msg plain | + audit "
          "| audit lines/msg |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.setup} | {statistics.median(costs):.1%} | {median(False, 'msgs_per_s'):.0f} | "
          f"{median(True, 'msgs_per_s'):.0f} | {median(False, 'broker_cpu_us_per_msg'):.1f} | "
          f"{median(True, 'broker_cpu_us_per_msg'):.1f} | {lines_per_message:.2f} |")
    print("rounds' cost:", " ".join(f"{c:.1%}" for c in costs))
    for audit in (False, True):
        print(f"{'+ audit' if audit else 'plain'} msg/s:", " ".join(f"{r['msgs_per_s']:.0f}" for r in results[audit]),
              f"| other load ≤ {max(r['other_load_cores'] for r in results[audit]):.2f} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
