#!/usr/bin/env python3
"""The mirror's cost and lag (design/mirroring.md, issue 49), with the standby 50 ms away through
tests/mirror/delay_relay.py (25 ms each way, in a child process of its own).

Set-ups, run round by round in an order rotated each round (bench/interleave.py's way: this machine's speed drifts
from minute to minute):
  off     a source broker of this tree without a mirror
  on      one of this tree mirroring every queue to the standby
  on@DIR  (--old DIR) one of another tree mirroring (git archive COMMIT | tar -x -C DIR, with the compiled modules
          copied or built): the before of a change
Each round gives every set-up a saturation run and a fixed-rate run (bench/run.py's, with the C clients by default;
a producer and a consumer at the source; the fixed-rate runs of all set-ups at once, unless --fixed-rate-apart: the
cores are not the limit there, and each then sees the same load from the rest of the machine): msg/s, the source
broker's CPU per message, its wake-ups per message (the voluntary context switches of its threads: its loop waited
in epoll) and the clients' p99 latency at the fixed rate, each divided by `off`'s of the same round. The cost on the source is measured so that the two cores are
not what it shows: during these runs the standby and the relay run at nice --standby-nice (19: they take what the
source and its clients leave, as if they had a site of their own; the mirror's backlog may grow meanwhile, the
source does not wait for it), and the headline figure is the fixed rate's, where the cores are not the limit. Then,
with the standby and relay at nice 0 again, per mirroring set-up, two lag runs: a producer alone at the source on a
fresh queue, at --rate for --duration s and then --lag-messages as fast as it goes; the lag is the source's own (its
status, `mirrored_lag_ms`): per transfer, from its oldest message's enqueue (to the millisecond) to the standby's
confirmation, once its guards hold them. (A client browsing the standby, tried first, measured itself: on this
loaded 2-core machine a Python browser fell seconds behind at 1,000 msg/s.) And a partition: its relay cut,
--partition s of publishing at --rate (no consumer), the relay healed, and the time until the source's status
shows no lag: the catch-up rate (messages / time from the reconnection to the last confirmed).

The standby is one broker of this tree (it speaks mirror protocols 1-2: an old source uses 1).

    .venv/bin/python bench/mirror.py --rounds 4 --old /tmp/hq-mirror-p1
    .venv/bin/python bench/mirror.py --rounds 1 --messages 20000 --duration 5 --partition 5 --no-record
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "mirror"))
import run as R  # noqa: E402  bench/run.py, used as a library
from delay_relay import DelayRelay  # type: ignore[import-not-found]  # noqa: E402  tests/mirror/

MIRROR_USER, MIRROR_PASSWORD = "mirror", "bench-mirror"
SITE_DELAY = 0.025
CONFIG = "name: {name}\nlisten: ['127.0.0.1:{port}']\ndata_dir: {data_dir}\n"
BROKER_CMD = "sh -c 'cd {tree} && exec {valgrind}{{python}} -m haqueue broker --config {{data_dir}}/broker.yaml'"
# --callgrind: a source under callgrind, counting only while a fixed-rate run is measured (callgrind_control), so
# that its instructions a message are counted, which this machine's drift in speed does not move
CALLGRIND = "valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file={out}/callgrind.%p "


# ---------------------------------------------------------------- the relay, in a process of its own

def _relay_process(target: tuple[str, int], conn: Any) -> None:
    relay = DelayRelay(target, SITE_DELAY)
    conn.send(relay.address)
    while True:
        command = conn.recv()
        if command == "stop":
            relay.close()
            return
        getattr(relay, command)()
        conn.send("ok")


class Relay:
    def __init__(self, target: tuple[str, int]) -> None:
        self.conn, child = multiprocessing.Pipe()
        self.proc = multiprocessing.Process(target=_relay_process, args=(target, child), daemon=True)
        self.proc.start()
        self.address = self.conn.recv()

    def do(self, command: str) -> None:
        self.conn.send(command)
        self.conn.recv()

    def stop(self) -> None:
        self.conn.send("stop")
        self.proc.join(10)


# ---------------------------------------------------------------- brokers

class ConfigBroker(R.CommandBroker):
    """A broker of `tree` from a config file in its data dir: CONFIG plus `extra`."""

    def __init__(self, tree: Path, label: str, extra: str, callgrind: bool = False) -> None:
        valgrind = CALLGRIND.format(out=shlex.quote(str(R.OUT))) if callgrind else ""
        super().__init__(BROKER_CMD.format(tree=shlex.quote(str(tree)), valgrind=valgrind), label, None, 60)
        self.callgrind = callgrind
        Path(self.data_dir, "broker.yaml").write_text(
            CONFIG.format(name=f"bench{self.port}", port=self.port, data_dir=f"{self.data_dir}/data") + extra)

    @property
    def endpoint(self) -> str:
        return f"{R.HOST}:{self.port}"


class Source(ConfigBroker):
    """A source broker; with a relay, it mirrors every queue to the standby behind it, and a browser of the
    standby records the lag of the lag runs."""

    def __init__(self, spec: str, standby: ConfigBroker, callgrind: bool = False) -> None:
        kind, _, tree = spec.partition("@")
        label = {"off": "source, no mirror", "on": "source mirroring"}[kind] + (f" ({tree})" if tree else "")
        self.relay = Relay((R.HOST, standby.port)) if kind == "on" else None
        extra = ""
        if self.relay is not None:
            cluster = "site-" + spec.replace("@", "-").replace("/", "_")
            extra = (f"mirror:\n  cluster: '{cluster}'\n  to: ['{self.relay.address}']\n"
                     f"  username: {MIRROR_USER}\n  password: {MIRROR_PASSWORD}\n  queues: ['*']\n")
        super().__init__(Path(tree) if tree else R.REPO, label, extra, callgrind)
        self.standby = standby.endpoint

    def counters(self) -> dict[str, int]:
        return {"wakeups": wakeups(self.pid)}

    def watch_start(self) -> None:
        if self.callgrind:
            subprocess.run(["callgrind_control", "-z", str(self.pid)], check=True, capture_output=True)
            subprocess.run(["callgrind_control", "-i", "on", str(self.pid)], check=True, capture_output=True)

    def watch_stop(self) -> dict:
        """Under callgrind, the instructions the source ran since watch_start (its dump's totals)."""
        if not self.callgrind:
            return {}
        subprocess.run(["callgrind_control", "-i", "off", str(self.pid)], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-d", str(self.pid)], check=True, capture_output=True)
        dump = max(R.OUT.glob(f"callgrind.{self.pid}.*"), key=lambda p: p.stat().st_mtime)
        totals = next(line for line in dump.read_text().splitlines() if line.startswith("totals:"))
        dump.unlink()
        return {"instructions": int(totals.split()[1])}

    def declare(self, queue: str) -> None:
        """The queue, and (mirroring) its copy on the standby."""
        code, desc, _ = R.admin_request(self.endpoint, "CREATE", "queue", queue, {})
        if code >= 400:
            raise RuntimeError(f"could not declare {queue}: {code} {desc}")
        if self.relay is not None:
            wait_until(lambda: queue in standby_queues(self.standby), 30, f"{queue} on the standby")

    def prepare_queue(self, queue: str) -> None:
        self.declare(queue)

    def drop_queue(self, queue: str) -> None:
        R.admin_request(self.endpoint, "DELETE", "queue", queue)


def wakeups(pid: int) -> int:
    """The voluntary context switches of a process's threads so far: how often they waited and were woken."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                total += int(line.split(":")[1])
    return total


def renice(pids: list[int], nice: int) -> None:
    """Every thread of these processes at `nice` (Linux: a thread's own; threads made later inherit it)."""
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                os.setpriority(os.PRIO_PROCESS, int(task.name), nice)
            except (ProcessLookupError, PermissionError):
                pass


def standby_queues(standby: str) -> set[str]:
    code, _, body = R.admin_request(standby, "READ", "mirror")
    return {q["queue"] for q in body["standby"]["queues"]} if code == 200 and isinstance(body, dict) else set()


def queue_lag(admin: Any, queue: str) -> dict:
    """One queue's figures in a source's mirror status (and whether it is connected), read on `admin`'s connection
    (one for the whole partition: a connection per look would cost the source more than the look)."""
    code, _, body = admin.request("READ", "mirror")
    source = (body.get("source") if code == 200 and isinstance(body, dict) else None) or {}
    for q in source.get("queues", []):
        if q["queue"] == queue:
            return {"connected": source["connected"], **q}
    return {}


def wait_until(test: Any, timeout: float, what: str, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = test()
        if found:
            return found
        time.sleep(every)
    raise RuntimeError(f"not within {timeout} s: {what}")


# ---------------------------------------------------------------- a partition

def catch_up(source: Source, args) -> dict:
    """Cut the site link, publish --partition s at --rate with no consumer, heal, time the drain."""
    queue = f"bench-partition-{int(time.time() * 1000)}"
    source.declare(queue)
    assert source.relay is not None
    try:
        source.relay.do("cut")
        n = int(args.rate * args.partition)
        proc = R.start_client(args.clients, "producer", R.client_args(source, queue)
                              + ["--rate", str(args.rate), "--duration", str(args.partition), "--size", str(args.size),
                                 "--inflight", str(args.inflight), "--timeout", str(int(args.partition + 60))],
                              R.OUT / "clients.stderr.log")
        result = R.JsonLines(proc).wait_for(lambda o: o.get("role") == "producer", time.monotonic()
                                            + args.partition + 60)
        R.stop_proc(proc)
        if result is None or not result.get("ok"):
            return {"error": f"producer: {result}"}
        n = result.get("accepted") or n
        with R.haqueue_admin().AdminClient(source.endpoint, 5.0) as admin:
            held = queue_lag(admin, queue)
            healed = time.monotonic()
            source.relay.do("heal")
            wait_until(lambda: queue_lag(admin, queue).get("connected"), 30, "the mirror reconnected", 0.01)
            connected = time.monotonic()
            wait_until(lambda: queue_lag(admin, queue).get("lag_messages") == 0, 120, "the backlog drained", 0.01)
            drained = time.monotonic()
    finally:
        R.admin_request(source.endpoint, "DELETE", "queue", queue)
    return {"messages": n, "lag_before_heal": held.get("lag_messages"), "bytes_held_back": held.get("bytes_held_back"),
            "reconnect_s": connected - healed, "drain_s": drained - connected,
            "catch_up_per_s": n / max(drained - connected, 1e-6), "publish_rate": args.rate}


# ---------------------------------------------------------------- rounds and the report

def cost(sources: list[Source], args) -> list[dict]:
    """The saturation runs, one set-up after the other, then the fixed-rate runs, of every set-up at once unless
    --fixed-rate-apart: at --rate the cores are not the limit, and all of them then see the same load from the rest
    of the machine, which moves from minute to minute (the standby and relay niced meanwhile: main)."""
    outs: list[dict[str, Any]] = [{} for _ in sources]
    for source, out in zip(sources, outs):
        out["saturation"] = {"error": "not run under callgrind"} if args.callgrind else measured(
            R.saturation(source, args.size, args.messages, args, clients=args.clients), args.messages)
    n = int(args.rate * args.duration)
    if args.fixed_rate_apart:
        for source, out in zip(sources, outs):
            out["latency"] = measured(R.latency(source, args.size, args, clients=args.clients), n)
    else:
        with concurrent.futures.ThreadPoolExecutor(len(sources)) as pool:
            runs = [pool.submit(R.latency, source, args.size, args, clients=args.clients) for source in sources]
            for run, out in zip(runs, outs):
                out["latency"] = measured(run.result(), n)
    return outs


def measured(found: dict, n: int) -> dict:
    """A run's figures without its raw output, with the source's wake-ups per message."""
    cpu = (found.get("raw") or {}).get("cpu") or {}
    woken = cpu.get("counters", {}).get("wakeups")
    instructions = cpu.get("watched", {}).get("instructions")
    out = {k: v for k, v in found.items() if k != "raw"}
    if woken is not None and "error" not in found:
        out["wakeups_per_msg"] = woken / n
    if instructions is not None and "error" not in found:
        out["instructions_per_msg"] = instructions / n
    return out


def lags(source: Source, args, out: dict) -> None:
    """The two lag runs of a mirroring set-up (the standby and relay at nice 0)."""
    if source.relay is not None and args.lag:
        out["latency_lag"] = lag_run(source, args, ["--rate", str(args.rate), "--duration", str(args.duration)])
        out["saturation_lag"] = lag_run(source, args, ["--messages", str(args.lag_messages)])
    R.log(f"  {source.label}: " + summary(out))


def lag_run(source: Source, args, producing: list[str]) -> dict:
    """A producer alone (`producing`: its rate and duration, or its count) on a fresh queue; once the standby has
    confirmed all of it, the queue's `mirrored_lag_ms` in the source's status: per transfer, from its oldest
    message's enqueue to the standby's confirmation (its guards hold it)."""
    queue = f"bench-lag-{int(time.time() * 1000)}"
    source.declare(queue)
    try:
        proc = R.start_client(args.clients, "producer", R.client_args(source, queue) + producing
                              + ["--size", str(args.size), "--inflight", str(args.inflight), "--timeout", "120"],
                              R.OUT / "clients.stderr.log")
        result = R.JsonLines(proc).wait_for(lambda o: o.get("role") == "producer", time.monotonic() + 180)
        R.stop_proc(proc)
        if result is None or not result.get("ok"):
            return {"error": f"producer: {result}"}
        with R.haqueue_admin().AdminClient(source.endpoint, 5.0) as admin:
            lag = wait_until(lambda: queue_lag(admin, queue).get("lag_messages") == 0 and queue_lag(admin, queue),
                             120, f"{queue} mirrored")
    finally:
        R.admin_request(source.endpoint, "DELETE", "queue", queue)
    figures = lag.get("mirrored_lag_ms") or {}
    return {"n": figures.get("transfers"), "sent": result.get("accepted"), "p50_ms": figures.get("p50"),
            "p99_ms": figures.get("p99"), "max_ms": figures.get("max"),
            "rate": result.get("settle_rate") or result.get("send_rate")}


def summary(out: dict) -> str:
    sat, lat = out["saturation"], out["latency"]
    if "error" in lat:
        return f"FAILED: {lat['error']}"
    text = (f"{sat['msgs_per_s']:.0f} msg/s, {sat['broker_cpu_us_per_msg']:.1f} µs/msg, other load "
            f"{sat['other_load_cores']:.2f}; " if "error" not in sat else "")
    text += (f"at {lat['rate_target']:g}/s {lat['broker_cpu_us_per_msg']:.1f} µs/msg, "
             f"{lat.get('wakeups_per_msg', 0):.2f} wake-ups/msg, p99 {lat['p99_ms']:.2f} ms, other load "
             f"{lat['other_load_cores']:.2f}")
    if "instructions_per_msg" in lat:
        text += f", {lat['instructions_per_msg']:.0f} instructions/msg (callgrind)"
    for kind in ("latency_lag", "saturation_lag"):
        lag = out.get(kind)
        if lag and lag.get("n"):
            text += (f"; lag ({kind.split('_')[0]}) p50 {lag['p50_ms']:.1f} p99 {lag['p99_ms']:.1f} ms over "
                     f"{lag['n']} transfers of {lag['sent']} messages at {lag['rate']:.0f}/s")
    return text


def ratio_rows(results: dict[str, list[dict]]) -> list[str]:
    """Each mirroring set-up over `off`, and this tree's over another's (`on` / `on@DIR`: the change itself)."""
    rows = []
    pairs = [(spec, "off") for spec in results if spec != "off"] + [("on", spec) for spec in results if "@" in spec]
    for spec, over in pairs:
        turns, base = results[spec], results[over]
        r: dict[str, list[float]] = {"rate": [], "cpu": [], "cpu_fixed": [], "woken": [], "p99": [], "instr": []}
        for a, b in zip(turns, base):
            sa, sb, la, lb = a["saturation"], b["saturation"], a["latency"], b["latency"]
            if "error" not in sa and "error" not in sb:
                r["rate"].append(sa["msgs_per_s"] / sb["msgs_per_s"])
                r["cpu"].append(sa["broker_cpu_us_per_msg"] / sb["broker_cpu_us_per_msg"])
            if "error" not in la and "error" not in lb:
                r["cpu_fixed"].append(la["broker_cpu_us_per_msg"] / lb["broker_cpu_us_per_msg"])
                r["p99"].append(la["p99_ms"] / lb["p99_ms"])
                if la.get("wakeups_per_msg") and lb.get("wakeups_per_msg"):
                    r["woken"].append(la["wakeups_per_msg"] / lb["wakeups_per_msg"])
                if la.get("instructions_per_msg") and lb.get("instructions_per_msg"):
                    r["instr"].append(la["instructions_per_msg"] / lb["instructions_per_msg"])
        rows.append(f"| `{spec}` / `{over}` | {med(r['cpu_fixed'], 2)} | {med(r['woken'], 2)} | {med(r['instr'], 3)} "
                    f"| {med(r['p99'], 2)} "
                    f"| {med(r['rate'], 2)} | {med(r['cpu'], 2)} | {' '.join(f'{x:.2f}' for x in r['cpu_fixed'])} "
                    f"| {' '.join(f'{x:.2f}' for x in r['rate'])} | {' '.join(f'{x:.2f}' for x in r['cpu'])} |")
    return rows


def med(values: Sequence[float | None], d: int = 1) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "—"
    return f"{statistics.median(v):.{d}f}" + (f" ({min(v):.{d}f}–{max(v):.{d}f})" if len(v) > 1 else "")


def markdown(results: dict[str, list[dict]], partitions: dict[str, list[dict]], labels: dict[str, str], args,
             command: str, load: tuple[str, str]) -> str:
    lines = [f"## Mirror: cost on the source and lag through the delaying relay (bench/mirror.py), "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "", "```", command, "```", "",
             f"{args.rounds} round(s), set-ups in an order rotated each round; {args.size}-byte bodies, not durable, "
             f"{'the C clients' if args.clients == 'c' else args.clients} (a producer and a consumer at the source); "
             f"the standby 25 ms each way away (tests/mirror/delay_relay.py in its own process). Saturation runs of "
             f"{args.messages} messages, fixed-rate runs of {args.rate:g} msg/s for {args.duration:g} s. Lag: runs "
             f"of a producer alone, at {args.rate:g} msg/s for {args.duration:g} s and {args.lag_messages} messages "
             f"as fast as they go, the source's `mirrored_lag_ms` (per transfer, from its oldest message's enqueue "
             f"to the standby's confirmation), median over the rounds of each run's p50 and p99. The cost on the "
             f"source: its CPU and wake-ups per message and the clients' p99 at {args.rate:g} msg/s (the cores are not "
             f"the limit there; "
             f"{'each set-up in turn' if args.fixed_rate_apart else 'every set-up at once, under the same load'}), "
             f"and msg/s at saturation, with the standby and the relay at nice {args.standby_nice} "
             f"during those runs (they take what the source and its clients leave: on two shared cores the standby "
             f"would otherwise be the source's cost), nice 0 for the lag and partition runs. Load average at the "
             f"start {load[0]}, at the end {load[1]}.", "",
             f"| set-up | msg/s | source CPU µs/msg | source CPU µs/msg @ {args.rate:g}/s | wake-ups/msg @ "
             f"{args.rate:g}/s | p99 ms @ {args.rate:g}/s | lag p50 / p99 ms @ {args.rate:g}/s | lag p50 / p99 ms, "
             f"{args.lag_messages} as fast as they go | other load (cores) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for spec, turns in results.items():
        sat = [t["saturation"] for t in turns if "error" not in t["saturation"]]
        lat = [t["latency"] for t in turns if "error" not in t["latency"]]
        lag_l = [t["latency_lag"] for t in turns if t.get("latency_lag") and t["latency_lag"].get("n")]
        lag_s = [t["saturation_lag"] for t in turns if t.get("saturation_lag") and t["saturation_lag"].get("n")]
        loads = [x["other_load_cores"] for x in sat + lat]
        lines.append(
            f"| {labels[spec]} (`{spec}`) | {med([x['msgs_per_s'] for x in sat], 0)} "
            f"| {med([x['broker_cpu_us_per_msg'] for x in sat])} | {med([x['broker_cpu_us_per_msg'] for x in lat])} "
            f"| {med([x.get('wakeups_per_msg') for x in lat], 2)} | {med([x['p99_ms'] for x in lat], 2)} "
            f"| {med([x['p50_ms'] for x in lag_l])} / {med([x['p99_ms'] for x in lag_l])} "
            f"| {med([x['p50_ms'] for x in lag_s])} / {med([x['p99_ms'] for x in lag_s])} "
            f"| {med(loads, 2)} |")
    lines += ["", "Round by round, divided by `off`'s (or another set-up's) of the same round (median, min–max; "
              "then each round's):", "",
              f"| set-up | source CPU ratio @ {args.rate:g}/s | wake-ups ratio @ {args.rate:g}/s | instructions "
              f"ratio @ {args.rate:g}/s (--callgrind) | p99 ratio @ {args.rate:g}/s | msg/s ratio | source CPU ratio "
              f"| CPU ratio @ {args.rate:g}/s per round | msg/s ratio per round | CPU ratio per round |",
              "|---|---|---|---|---|---|---|---|---|---|", *ratio_rows(results), ""]
    if partitions:
        lines += [f"Catch-up after a partition: the relay cut, {args.partition:g} s of publishing at {args.rate:g} "
                  f"msg/s with no consumer, the relay healed; drain = from the reconnection to no lag in the "
                  f"source's status.", "", "| set-up | backlog (messages) | reconnect s | drain s | catch-up msg/s "
                  "| × the publish rate |", "|---|---|---|---|---|---|"]
        for spec, runs in partitions.items():
            ok = [p for p in runs if "error" not in p]
            lines.append(f"| `{spec}` | {med([p['messages'] for p in ok], 0)} "
                         f"| {med([p['reconnect_s'] for p in ok], 2)} | {med([p['drain_s'] for p in ok], 2)} "
                         f"| {med([p['catch_up_per_s'] for p in ok], 0)} "
                         f"| {med([p['catch_up_per_s'] / p['publish_rate'] for p in ok], 1)} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--old", metavar="DIR", help="also a source of this tree (the before of a change)")
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--partition", type=float, default=30, help="seconds of publishing with the relay cut (0: none)")
    ap.add_argument("--lag-messages", type=int, default=20_000, help="the saturation lag run's messages")
    ap.add_argument("--clients", choices=["c", "rhea"], default="c")
    ap.add_argument("--inflight", type=int, default=1000)
    ap.add_argument("--credit", type=int, default=1000)
    ap.add_argument("--fixed-rate-apart", action="store_true",
                    help="the fixed-rate runs one set-up after the other, not all at once")
    ap.add_argument("--no-lag", dest="lag", action="store_false", help="the cost runs only (no lag runs)")
    ap.add_argument("--standby-nice", type=int, default=19, help="the standby's and relay's nice during the cost runs")
    ap.add_argument("--callgrind", action="store_true",
                    help="the sources under callgrind: their instructions a message in the fixed-rate runs (no "
                         "saturation, lag or partition runs; use a --rate callgrind keeps up with, e.g. 300)")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args(argv)
    if args.callgrind:
        args.lag, args.partition = False, 0
    args.durable, args.priorities = False, 0
    command = "python bench/mirror.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    load0 = R.loadavg()
    standby = ConfigBroker(R.REPO, "standby", (
        f"users:\n  {MIRROR_USER}: {{password: {MIRROR_PASSWORD}, allow: {{}}}}\n"
        f"mirror:\n  accept_from: [{MIRROR_USER}]\n"))
    specs = ["off", "on"] + ([f"on@{args.old}"] if args.old else [])
    sources: dict[str, Source] = {}
    results: dict[str, list[dict]] = {s: [] for s in specs}
    partitions: dict[str, list[dict]] = {s: [] for s in specs if s != "off"}
    try:
        standby.start()
        for spec in specs:
            sources[spec] = Source(spec, standby, args.callgrind)
            sources[spec].start()
        for i in range(args.rounds):
            order = R.rotated(specs, i)
            R.log(f"round {i + 1}/{args.rounds}: {', '.join(order)} (load average {R.loadavg()})")
            niced = [standby.pid] + [s.relay.proc.pid for s in sources.values()
                                     if s.relay is not None and s.relay.proc.pid is not None]
            renice(niced, args.standby_nice)
            turns = dict(zip(order, cost([sources[spec] for spec in order], args)))
            renice(niced, 0)
            for spec in order:
                lags(sources[spec], args, turns[spec])
                results[spec].append(turns[spec])
            for spec in order:
                if spec != "off" and args.partition > 0:
                    p = catch_up(sources[spec], args)
                    partitions[spec].append(p)
                    R.log(f"  {spec}: partition " + json.dumps({k: round(v, 2) if isinstance(v, float) else v
                                                               for k, v in p.items()}))
    finally:
        for source in sources.values():
            source.stop()
            if source.relay is not None:
                source.relay.stop()
        standby.stop()
    labels = {spec: sources[spec].label for spec in specs}
    R.OUT.mkdir(exist_ok=True)
    (R.OUT / f"mirror-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(
        {"results": results, "partitions": partitions, "command": command}, indent=1))
    md = markdown(results, partitions if args.partition > 0 else {}, labels, args, command, (load0, R.loadavg()))
    R.print_and_record(md, args.no_record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
