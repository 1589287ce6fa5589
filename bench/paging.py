#!/usr/bin/env python3
"""Paging at scale (issue #11): a queue far larger than memory, in a broker whose RSS stays small.

One haqueue broker with `store.page_above` set (durable bodies held in memory above which queues page):
the rhea producer fills a queue with N durable messages and no consumer, then the rhea consumer drains
it. The broker's RSS is sampled all along; the report gives the peak while filling and draining, the
store's status once full (messages paged, bodies in memory, journal size), the rates, and what the
consumer checked (every message once, in order).

    python bench/paging.py --messages 10000000 --size 1024 --page-above 64MiB
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import interleave as I  # noqa: E402  bench/interleave.py: produce, rss_mb, the markdown header
import run as R  # noqa: E402

CMD = "{python} -m haqueue broker --config {config}"
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def size_arg(text: str) -> int:
    for unit, factor in UNITS.items():
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * factor)
    return int(text)


class RssSampler(threading.Thread):
    """The peak RSS of a process, sampled every `interval` seconds until stopped."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak_mb = pid, interval, 0.0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval):
            self.peak_mb = max(self.peak_mb, I.rss_mb(self.pid) or 0.0)

    def finish(self) -> float:
        self._done.set()
        self.join()
        return self.peak_mb


def drain(broker: R.CommandBroker, queue: str, n: int) -> dict:
    cons = R.start_client("rhea", "consumer", R.client_args(broker, queue) + [
        "--messages", str(n), "--credit", "1000", "--timeout", str(int(120 + n / 500))], R.OUT / "clients.stderr.log")
    try:
        res = R.JsonLines(cons).wait_for(lambda o: o.get("role") == "consumer", time.monotonic() + 140 + n / 500)
    finally:
        R.stop_proc(cons)
    if res is None:
        raise RuntimeError("the consumer gave no result")
    return res


def measure(args: argparse.Namespace) -> dict:
    config_dir = tempfile.mkdtemp(prefix="haqueue-paging-")
    port = R.free_port()
    config = Path(config_dir) / "broker.yaml"
    config.write_text(json.dumps({"name": "paging", "listen": [f"{R.HOST}:{port}"], "data_dir": f"{config_dir}/data",
                                  "store": {"page_above": args.page_above}}))
    broker = R.CommandBroker(CMD.replace("{config}", str(config)), "haqueue paging", port, 60)
    queue, n = "bench-paging", args.messages
    out: dict = {"messages": n, "size": args.size, "page_above": args.page_above}
    try:
        broker.start()
        sampler = RssSampler(broker.pid)
        sampler.start()
        t0 = time.monotonic()
        I.log(f"filling {queue} with {n} durable {args.size}-byte messages")
        produced = I.produce(broker, queue, n, argparse.Namespace(size=args.size, inflight=1000, durable=True))
        out["fill_s"], out["fill_rate"] = time.monotonic() - t0, produced.get("settle_rate")
        out["rss_fill_peak_mb"] = sampler.finish()
        out["rss_full_mb"] = I.rss_mb(broker.pid)
        out["depth"] = I.queue_depth(broker, queue)
        out["store"] = R.admin_request(f"{R.HOST}:{port}", "READ", "store", timeout=30)[2]
        I.log(f"full: depth {out['depth']}, RSS {out['rss_full_mb']:.0f} MB (peak {out['rss_fill_peak_mb']:.0f}), "
              f"store {out['store']}")
        sampler = RssSampler(broker.pid)
        sampler.start()
        t0 = time.monotonic()
        consumed = drain(broker, queue, n)
        out["drain_s"], out["drain_rate"] = time.monotonic() - t0, consumed.get("recv_rate")
        out["rss_drain_peak_mb"] = sampler.finish()
        out["consumer"] = {k: consumed.get(k) for k in ("received", "missing", "duplicates", "out_of_order", "ok")}
        out["depth_after"] = I.queue_depth(broker, queue)
        I.log(f"drained in {out['drain_s']:.0f} s: {out['consumer']}, RSS peak {out['rss_drain_peak_mb']:.0f} MB")
    finally:
        broker.stop()
    return out


def markdown(out: dict, command: str) -> str:
    store = out["store"]
    c = out["consumer"]
    return "\n".join([
        f"## Paging: {out['messages']:,} durable messages of {out['size']} bytes (bench/paging.py), {I.now()}", "",
        "```", command, "```", "",
        f"haqueue at {I.tree_commit()}; `store.page_above` {out['page_above']:,} bytes; rhea producer "
        f"(≤ 1000 unsettled), no consumer, then the rhea consumer (credit 1000).", "",
        "| | |", "|---|---|",
        f"| filled | {out['fill_s']:.0f} s, {out['fill_rate'] or 0:,.0f} msg/s confirmed |",
        f"| broker RSS while filling (peak) / full | {out['rss_fill_peak_mb']:.0f} MB / {out['rss_full_mb']:.0f} MB |",
        f"| queue depth when full | {out['depth']:,} |",
        f"| store when full | {store.get('paged_messages', 0):,} messages paged, "
        f"{store.get('memory_bytes', 0) / 2**20:.0f} MiB of bodies in memory, journal "
        f"{store.get('bytes', 0) / 2**30:.2f} GiB in {store.get('segments')} segments |",
        f"| drained | {out['drain_s']:.0f} s, {out['drain_rate'] or 0:,.0f} msg/s; broker RSS peak "
        f"{out['rss_drain_peak_mb']:.0f} MB |",
        f"| consumer | received {c['received']:,}, missing {c['missing']}, duplicates {c['duplicates']}, "
        f"out of order {c['out_of_order']}; depth after {out['depth_after']} |", ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    ap.add_argument("--page-above", type=size_arg, default=64 << 20,
                    help="store.page_above, bytes (suffix KiB, MiB, GiB; default 64MiB)")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = ap.parse_args(argv)
    if not (R.JS / "node_modules" / "rhea").exists():
        R.run_cmd(["npm", "install", "--no-audit", "--no-fund"], timeout=300, cwd=R.JS)
    out = measure(args)
    text = markdown(out, "python bench/paging.py " + " ".join(sys.argv[1:] if argv is None else argv))
    print(text)
    if not args.no_record:
        with open(R.RESULTS, "a", encoding="utf-8") as f:
            f.write("\n" + text)
    return 0 if out["consumer"]["ok"] and out["consumer"]["missing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
