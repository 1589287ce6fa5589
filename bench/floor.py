#!/usr/bin/env python3
"""The floor under "broker CPU per message at 1,000 msg/s": what the system calls and wake-ups of a lone
message cost on this machine with no broker around them, measured in alternation with haqueue.

bench/floor/relay.c (compiled into bench/out by run.py's `compiled`) does per message exactly the kernel work a broker cannot
avoid, over loopback TCP, with nothing else. Alone (`--setup single`): two wake-ups in epoll_wait (the
producer's transfer, then the consumer's accept), two recvs and two sends (the transfer to the consumer,
the settlement to the producer). With two backups (`--setup cluster`): the message also goes to each
backup, which acknowledges it, the settlement waits for both, and the consumer's accept sends each a
dequeue. Its CPU per message (the relay's, plus its backups'), kernel and user, is set beside haqueue's
in bench/run.py's fixed-rate run (rhea clients; a single broker, or `haqueue cluster up --size 3`),
round after round, so that both see the same minutes of this machine.

    python bench/floor.py --rounds 4                   # 10 s at 1,000 msg/s each, floor then broker
    python bench/floor.py --rounds 4 --setup cluster   # the same with a primary and two backups
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import run as R  # noqa: E402  bench/run.py, used as a library
import setups as S  # noqa: E402

log = R.log


def floor_run(binary: Path, backups: int, rate: float, duration: float) -> dict:
    """The CPU per message (total and in the kernel) of the relay and its backups over rate x duration
    messages."""
    n = int(rate * duration)
    port = R.free_port()
    relay = subprocess.Popen([str(binary), "relay", str(port), str(backups)], stdout=subprocess.PIPE, text=True)
    peers = [relay]
    try:
        if relay.stdout is None or relay.stdout.readline().strip() != "ready":
            raise RuntimeError("the floor relay did not start")
        peers += [subprocess.Popen([str(binary), "backup", str(port)]) for _ in range(backups)]
        producer = subprocess.Popen([str(binary), "producer", str(port), str(rate), str(n)])
        consumer = subprocess.Popen([str(binary), "consumer", str(port), str(n)])
        before = R.cpu_ticks([p.pid for p in peers])
        for client in (producer, consumer):
            if client.wait(timeout=duration + 60) != 0:
                raise RuntimeError("a floor client failed")
        after = R.cpu_ticks([p.pid for p in peers])
    finally:
        for p in peers:
            p.kill()
            p.wait()
    tick_us = 1e6 / R.CLK_TCK
    total = sum(after[p][0] - before[p][0] for p in before)
    kernel = sum(after[p][1] - before[p][1] for p in before)
    return {"cpu_us_per_msg": total * tick_us / n, "sys_us_per_msg": kernel * tick_us / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--setup", choices=["single", "cluster"], default="single",
                    help="a single broker, or a primary with two backups (default single)")
    args = ap.parse_args()
    broker_args = argparse.Namespace(rate=args.rate, duration=args.duration, inflight=1000, credit=1000, durable=False)
    rows = []
    binary = R.compiled(BENCH / "floor" / "relay.c", "floor-relay")
    backups = 2 if args.setup == "cluster" else 0
    broker: R.Broker = (S.HaCluster("haqueue cluster", size=3) if backups
                        else R.CommandBroker(R.DEFAULT_HAQUEUE_CMD, "haqueue", None, 30))
    broker.start()
    try:
        for i in range(args.rounds):
            floor = floor_run(binary, backups, args.rate, args.duration)
            hq = R.latency(broker, 100, broker_args)
            if "error" in hq:
                raise RuntimeError(f"haqueue's run failed: {hq['error']}")
            row = {"floor": floor["cpu_us_per_msg"], "floor_sys": floor["sys_us_per_msg"],
                   "haqueue": hq["broker_cpu_us_per_msg"], "haqueue_sys": hq["broker_sys_us_per_msg"],
                   "other_load": hq["other_load_cores"]}
            rows.append(row)
            log(f"round {i + 1}: floor {row['floor']:.1f} µs/msg ({row['floor_sys']:.1f} in the kernel), "
                f"haqueue {row['haqueue']:.1f} ({row['haqueue_sys']:.1f} in the kernel), "
                f"other load {row['other_load']:.2f} cores")
    finally:
        broker.stop()
    print(f"{args.setup}: CPU per message at {args.rate:g} msg/s, 100 B, {len(rows)} rounds in alternation "
          f"(µs, every broker process; kernel in brackets):")
    print("| round | floor (relay.c) | haqueue | haqueue − floor | other load (cores) |")
    print("|---|---|---|---|---|")
    for i, r in enumerate(rows, 1):
        print(f"| {i} | {r['floor']:.1f} ({r['floor_sys']:.1f}) | {r['haqueue']:.1f} ({r['haqueue_sys']:.1f}) | "
              f"{r['haqueue'] - r['floor']:.1f} | {r['other_load']:.2f} |")
    print(f"| median | {statistics.median(r['floor'] for r in rows):.1f} | {statistics.median(r['haqueue'] for r in rows):.1f} | "
          f"{statistics.median(r['haqueue'] - r['floor'] for r in rows):.1f} | |")


if __name__ == "__main__":
    main()
