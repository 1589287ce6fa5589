#!/usr/bin/env python3
"""Sharded primaries on one machine (design/sharding.md, step 7): the aggregate msg/s of 1, 2 and 4 shards with
as many producer/consumer pairs (rhea, as bench/run.py's saturation), and the relay's cost per message when
every client attaches to the wrong shard's process.

Each set-up is `haqueue cluster up --size 1 --shards K --replicas 1`: K shard processes on one node, each its own
HA group of one (no backups: what is measured is how the shards share the cores). Pair i uses a queue owned by
shard i and connects to that shard's direct address (its primary); in the relayed run (2 shards) each pair
connects to the other shard's direct address, whose process relays every link to the owner. Figures: msg/s =
all messages / (last receive - first send); broker CPU µs per message over every shard process.

    .venv/bin/python bench/shards.py [--shards 1,2,4] [--messages 200000 | --seconds S] [--record]

`--seconds S` sizes each pair's run to about S seconds at a guessed rate (a smoke run: `--seconds 3`);
`--record` appends the table to bench/RESULTS.md. Raw JSON goes to bench/out/.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import run as R  # noqa: E402  bench/run.py, used as a library
from setups import free_ports, terminate_group  # noqa: E402

sys.path.insert(0, str(BENCH.parent))
from haqueue.shard.ownership import shard_of_name  # noqa: E402

GUESSED_PAIR_RATE = 8000  # msg/s one pair reaches here, to size a --seconds run
SIZE = 100  # body bytes, as the saturation benchmark's first size


class ShardedCluster(R.LoggedProcess, R.Broker):
    """`haqueue cluster up --size 1 --shards K --replicas 1`; `relayed`: clients connect to the wrong shard."""

    def __init__(self, shards: int, relayed: bool = False) -> None:
        self.shards, self.relayed = shards, relayed
        self.label = f"{shards} shard{'s' if shards > 1 else ''}" + (", relayed" if relayed else "")
        self.dir = tempfile.mkdtemp(prefix="haqueue-shardbench-")
        self.port = free_ports(1)[0]  # the node's client address (not used: pairs go to the shards' own)
        self.base = free_ports(2 * shards, consecutive=True)[0]  # peers base + i, direct addresses base + K + i
        R.OUT.mkdir(exist_ok=True)
        self.log_path = R.OUT / f"shards-{shards}-{time.strftime('%Y%m%d-%H%M%S')}-{self.port}.log"
        self.cmd = [str(R.VENV_PY), "-m", "haqueue", "cluster", "up", "--size", "1", "--shards", str(shards),
                    "--replicas", "1", "--dir", self.dir, "--public", f"{R.HOST}:{self.port}",
                    "--base-port", str(self.base)]
        self.proc: subprocess.Popen | None = None

    def direct_port(self, shard: int) -> int:
        return self.base + self.shards + shard

    def client_endpoint(self, address: str) -> tuple[str, int]:
        owner = shard_of_name(address, self.shards)
        return R.HOST, self.direct_port((owner + 1) % self.shards if self.relayed else owner)

    def queues(self, tag: str) -> list[str]:
        """One queue per shard, queue i owned by shard i."""
        found: dict[int, str] = {}
        for n in range(100_000):
            found.setdefault(shard_of_name(f"bench-shard-{tag}-{n}", self.shards), f"bench-shard-{tag}-{n}")
            if len(found) == self.shards:
                break
        return [found[i] for i in range(self.shards)]

    def start(self) -> None:
        R.log(f"starting {self.label}: {' '.join(self.cmd)}")
        self.logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, cwd=R.REPO, stdout=self.logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 120
        while not all(R.port_open(self.direct_port(i)) for i in range(self.shards)):  # bound by each primary
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.label} not up; log tail:\n{self.log_tail()}")
            time.sleep(0.2)
        R.log(f"{self.label} up: direct addresses {R.HOST}:{self.direct_port(0)}..{self.direct_port(self.shards - 1)}")

    def stop(self) -> None:
        if self.proc is not None:
            terminate_group(self.proc, self.label)
            self.logf.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def saturate(cluster: ShardedCluster, each: int, args: argparse.Namespace) -> dict:
    """A warm-up, then `each` messages per pair through one queue per shard at once: the aggregate."""
    queues = cluster.queues(uuid.uuid4().hex[:8])
    warm = min(max(each // 10, 2000), 20000)
    producer = ["--size", str(SIZE), "--inflight", str(args.inflight)]
    w = R.run_pairs(cluster, queues, ["--messages", str(warm), "--seq-base", str(R.WARM_SEQ), *producer],
                    ["--messages", str(warm), "--credit", str(args.credit), "--seq-base", str(R.WARM_SEQ)],
                    60 + warm / 500, None)
    if "error" in w:
        return {"error": "warm-up: " + w["error"]}
    calibration = R.calibrate()
    meter = R.CpuMeter(cluster)
    r = R.run_pairs(cluster, queues, ["--messages", str(each), *producer],
                    ["--messages", str(each), "--credit", str(args.credit)], 60 + each / 1000, meter)
    if "error" in r:
        return {"error": r["error"], "raw": r}
    n = each * len(queues)
    p, c = r["producer"], r["consumer"]
    return {"set_up": cluster.label, "shards": cluster.shards, "relayed": cluster.relayed, "pairs": len(queues),
            "messages": n, "msgs_per_s": n / ((c["last_recv_us"] - p["first_send_us"]) / 1e6),
            "broker_cpu_us_per_msg": r["cpu"]["cpu_us_tree"] / n,
            "clients_cpu_us_per_msg": (p["client_cpu_us"] + c["client_cpu_us"]) / n,
            "missing": c["missing"], "duplicates": c["duplicates"], "other_load_cores": R.other_load(r),
            "calibration_ms": calibration, "raw": r}


def table(results: list[dict], command: str) -> str:
    one = next((r["msgs_per_s"] for r in results if r.get("shards") == 1 and not r.get("relayed")), None)
    lines = [f"## Sharded primaries on one machine ({time.strftime('%Y-%m-%d %H:%M')})", "", f"`{command}`", "",
             "| set-up | pairs | msg/s | vs 1 shard | broker CPU µs/msg | clients CPU µs/msg | other load (cores) |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['set_up']} | - | failed: {r['error']} | | | | |")
            continue
        ratio = f"{r['msgs_per_s'] / one:.2f}x" if one else "-"
        lines.append(f"| {r['set_up']} | {r['pairs']} | {r['msgs_per_s']:,.0f} | {ratio} | "
                     f"{r['broker_cpu_us_per_msg']:.1f} | {r['clients_cpu_us_per_msg']:.1f} | "
                     f"{r['other_load_cores']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", default="1,2,4", help="shard counts to measure (default 1,2,4)")
    parser.add_argument("--messages", type=int, default=200_000, help="messages per pair (default 200,000)")
    parser.add_argument("--seconds", type=float, help="instead of --messages: about this long per run")
    parser.add_argument("--inflight", type=int, default=1000)
    parser.add_argument("--credit", type=int, default=1000)
    parser.add_argument("--no-relay", action="store_true", help="skip the relayed run (2 shards, wrong process)")
    parser.add_argument("--record", action="store_true", help="append the table to bench/RESULTS.md")
    args = parser.parse_args(argv)
    each = int(args.seconds * GUESSED_PAIR_RATE) if args.seconds else args.messages
    set_ups = [ShardedCluster(int(k)) for k in args.shards.split(",")]
    if not args.no_relay:
        set_ups.append(ShardedCluster(2, relayed=True))
    results = []
    for cluster in set_ups:
        try:
            cluster.start()
            results.append(saturate(cluster, each, args))
        except RuntimeError as e:
            results.append({"set_up": cluster.label, "error": str(e).splitlines()[0]})
        finally:
            cluster.stop()
        R.log(f"{cluster.label}: " + json.dumps({k: v for k, v in results[-1].items() if k != "raw"}))
    out = R.OUT / f"shards-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=1, default=str))
    md = table(results, " ".join(["bench/shards.py", *(argv if argv is not None else sys.argv[1:])]))
    print(md)
    if args.record:
        R.record(md)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
