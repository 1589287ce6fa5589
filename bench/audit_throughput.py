#!/usr/bin/env python3
"""What writing audit events costs in throughput: the same broker set-up with and without
`audit: {dir: ...}`, driven at saturation by bench/run.py's rhea producer and consumer (100-byte
bodies, at-least-once), in alternating rounds so that a machine whose speed drifts (this one's
does, by ±15 % over minutes) treats both alike.

Each round starts the plain set-up, runs --runs saturation runs, stops it, then does the same with
audit events on. Reported: median msg/s and broker CPU per message of each, the cost (1 - audit /
plain, of the medians), and the audit lines written per message (checks every event was logged).

    .venv/bin/python bench/audit_throughput.py [--setup standalone|cluster] [--rounds 4] [--runs 2]
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
    return sum(f.read_bytes().count(b"\n") for f in Path(broker.data_dir, "audit").glob("*.jsonl"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setup", choices=("standalone", "cluster"), default="standalone")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--runs", type=int, default=2, help="saturation runs per set-up and round")
    ap.add_argument("--messages", type=int, default=200_000)
    args = ap.parse_args()
    opts = SimpleNamespace(inflight=1000, credit=1000, durable=False)
    results: dict[bool, list[dict]] = {False: [], True: []}
    lines_per_message: list[float] = []
    for round_ in range(args.rounds):
        for audit in (False, True):
            broker = start(args.setup, audit)
            try:
                for _ in range(args.runs):
                    r = run.saturation(broker, 100, args.messages, opts)
                    if "error" in r:
                        raise SystemExit(f"{broker.label}: {r['error']}")
                    run.log(f"round {round_ + 1} {broker.label}: {r['msgs_per_s']:.0f} msg/s, "
                            f"{r['broker_cpu_us_per_msg']:.1f} µs/msg, other load {r['other_load_cores']:.2f}")
                    results[audit].append(r)
            finally:
                lines = audit_lines(broker) if audit else 0
                messages = args.runs * (args.messages + min(max(args.messages // 10, 2000), 20000))  # + warm-ups
                broker.stop()
            if audit:
                lines_per_message.append(lines / messages)

    def median(audit: bool, key: str) -> float:
        return statistics.median(r[key] for r in results[audit])

    plain, audited = median(False, "msgs_per_s"), median(True, "msgs_per_s")
    print(f"| setup | msg/s plain | msg/s + audit | cost | broker CPU µs/msg plain | + audit | audit lines/msg |")
    print(f"|---|---|---|---|---|---|---|")
    print(f"| {args.setup} | {plain:.0f} | {audited:.0f} | {1 - audited / plain:.1%} | "
          f"{median(False, 'broker_cpu_us_per_msg'):.1f} | {median(True, 'broker_cpu_us_per_msg'):.1f} | "
          f"{statistics.median(lines_per_message):.2f} |")
    for audit in (False, True):
        print(f"{'+ audit' if audit else 'plain'} runs, msg/s:",
              " ".join(f"{r['msgs_per_s']:.0f}" for r in results[audit]),
              "| other load ≤", f"{max(r['other_load_cores'] for r in results[audit]):.2f} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
