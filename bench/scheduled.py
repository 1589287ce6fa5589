#!/usr/bin/env python3
"""Scheduled messages due at once (issue 28): one haqueue broker of this tree, a consumer attached with credit
and waiting (the C client), then --messages messages published (proton Python, bench/py_clients.py) all with the
same `x-opt-delivery-time`, --ahead seconds after the publishing starts. Per repetition: the queue's `scheduled`
count before the due time, the time from the due time to the first and to the last message received, the
broker's CPU from just before the due time to the last message (the release and the deliveries), and whether
all arrived, once each, none before the due time. Beside it, as a reference, the same number of messages
queued without a delivery time and drained by a consumer attached afterwards: what delivering them costs
without a release.

    python bench/scheduled.py --messages 10000 --reps 3
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as R  # noqa: E402  bench/run.py, used as a library
from interleave import med_range, now, tree_commit  # noqa: E402

log = R.log
WINDOW_LEAD = 0.1  # the broker's CPU is read this many seconds before the due time


def cpu_ns(pid: int) -> int:
    """CPU time (ns) of pid's process tree so far, from each thread's schedstat (ticks are 10 ms)."""
    total = 0
    for p in R.proc_tree(pid):
        for task in Path(f"/proc/{p}/task").glob("*/schedstat"):
            try:
                total += int(task.read_text().split()[0])
            except (OSError, IndexError, ValueError):
                pass  # the thread ended
    return total


def queue_info(broker: R.Broker, queue: str) -> dict:
    code, desc, body = R.admin_request(f"{R.HOST}:{broker.port}", "READ", "queue", queue, timeout=10)
    if code >= 400 or not isinstance(body, dict):
        raise RuntimeError(f"READ queue {queue}: {code} {desc}")
    return body


def attach_consumer(broker: R.Broker, queue: str, args, timeout: float,
                    extra: list[str] | None = None) -> R.JsonLines:
    """The C consumer of `queue` (with `extra` options), attached (its link open) with --credit."""
    proc = R.start_client("c", "consumer", R.client_args(broker, queue) + [
        "--messages", str(args.messages), "--credit", str(args.credit), "--timeout", str(int(timeout))]
        + (extra or []), R.OUT / "clients.stderr.log")
    reader = R.JsonLines(proc)
    if reader.wait_for(lambda o: o.get("event") == "ready", time.monotonic() + 20) is None:
        R.stop_proc(proc)
        raise RuntimeError("consumer did not attach within 20 s")
    return reader


def result(reader: R.JsonLines, role: str, timeout: float) -> dict:
    """A client's result line, its process stopped after; an error if it gave none or failed."""
    try:
        res = reader.wait_for(lambda o: o.get("role") == role, time.monotonic() + timeout)
    finally:
        R.stop_proc(reader.proc)
    if res is None or not res.get("ok"):
        raise RuntimeError(f"{role} failed: {res}")
    return res


def publish(broker: R.Broker, queue: str, args, timeout: float, extra: list[str] | None = None,
            client: str = "proton") -> dict:
    """--messages messages through `client`'s producer (proton Python's by default) with `extra` options, all
    confirmed."""
    proc = R.start_client(client, "producer", R.client_args(broker, queue) + [
        "--messages", str(args.messages), "--size", str(args.size), "--timeout", str(int(timeout))]
        + R.message_options(args) + (extra or []), R.OUT / "clients.stderr.log")
    return result(R.JsonLines(proc), "producer", timeout + 10)


class Window:
    """The broker's CPU (ns precision) and the machine's busy time between start and stop."""

    def __init__(self, broker: R.Broker):
        self.pid = broker.pid
        self.cpu0, self.busy0, self.t0 = cpu_ns(self.pid), R.machine_busy_ticks(), time.monotonic()

    def stop(self, client_cpu_us: float) -> dict:
        broker_ms = (cpu_ns(self.pid) - self.cpu0) / 1e6
        wall = time.monotonic() - self.t0
        busy_ms = (R.machine_busy_ticks() - self.busy0) * 1e3 / R.CLK_TCK
        return {"broker_cpu_ms": broker_ms, "wall_s": wall,
                "other_load_cores": max(0.0, busy_ms - broker_ms - client_cpu_us / 1e3) / 1e3 / wall}


def scheduled_rep(broker: R.Broker, args) -> dict:
    """One release: consumer waiting, messages published due --ahead s from now, measured around the due time."""
    queue = f"bench-sched-{uuid.uuid4().hex[:8]}"
    consumer = attach_consumer(broker, queue, args, args.ahead + 120)
    due_ms = int((time.time() + args.ahead) * 1000)
    mono_minus_wall = time.monotonic() - time.time()
    due_mono = due_ms / 1000 + mono_minus_wall  # the due time on CLOCK_MONOTONIC, the clients' clock
    t0 = time.monotonic()
    p = publish(broker, queue, args, args.ahead + 120, ["--delivery-time", str(due_ms)])
    published_s = time.monotonic() - t0
    info = queue_info(broker, queue)
    idle = Window(broker)
    if due_mono - time.monotonic() < WINDOW_LEAD + 0.2:
        R.stop_proc(consumer.proc)
        raise RuntimeError(f"publishing took {published_s:.1f} s, too close to the due time: raise --ahead")
    time.sleep(due_mono - WINDOW_LEAD - time.monotonic())
    before = idle.stop(0)
    idle_rate = before["broker_cpu_ms"] / before["wall_s"]
    window = Window(broker)
    c = result(consumer, "consumer", args.ahead + 130)
    w = window.stop(c["client_cpu_us"])
    first_ms, last_ms = ((c[k] / 1e6 - due_mono) * 1000 for k in ("first_recv_us", "last_recv_us"))
    return {"published_s": published_s, "publish_rate": p["settle_rate"], "depth_before": info.get("depth"),
            "scheduled_before": info.get("scheduled"), "first_ms": first_ms, "last_ms": last_ms,
            "received": c["received"], "missing": c["missing"], "duplicates": c["duplicates"],
            "early": first_ms < 0, "idle_broker_ms_per_s": idle_rate, **w,
            "broker_cpu_us_per_msg": w["broker_cpu_ms"] * 1e3 / args.messages}


def backlog_rep(broker: R.Broker, args) -> dict:
    """The reference: the same number of messages queued plainly, then drained by a consumer attached after."""
    queue = f"bench-backlog-{uuid.uuid4().hex[:8]}"
    publish(broker, queue, args, args.ahead + 120)
    window = Window(broker)
    c = result(attach_consumer(broker, queue, args, args.ahead + 120), "consumer", 130)
    w = window.stop(c["client_cpu_us"])
    return {"span_ms": (c["last_recv_us"] - c["first_recv_us"]) / 1e3, "received": c["received"],
            "missing": c["missing"], **w, "broker_cpu_us_per_msg": w["broker_cpu_ms"] * 1e3 / args.messages}


def markdown(run: dict, args) -> str:
    reps = run["reps"]
    s = [r["scheduled"] for r in reps]
    b = [r["backlog"] for r in reps]
    all_in = all(r["received"] == args.messages and not r["missing"] and not r["duplicates"] for r in s)
    lines = [f"## {args.messages:,} scheduled messages due at once (bench/scheduled.py), {run['date']}", "",
             "```", run["command"], "```", "",
             f"One haqueue broker of this tree at {run['commit']}; the C consumer attached first with credit "
             f"{args.credit}, then {args.messages:,} {args.size}-byte messages published by proton Python (≤ 1000 "
             f"unsettled), all with the same `x-opt-delivery-time`, {args.ahead:g} s after the publishing began. Times "
             "from the due time (CLOCK_MONOTONIC of the due time against the consumer's receive times). Broker CPU "
             f"from {WINDOW_LEAD:g} s before the due time to the last message (threads' schedstat, ns), the release "
             "and the deliveries; the backlog is the same number of messages queued without a delivery time and "
             "drained by the same consumer attached after (connection and attach included): the deliveries alone. "
             "Other load: cores busy in the window but for the broker and the consumer. "
             f"Load average at the start {run['load'][0]}, at the end {run['load'][1]}.", "",
             "| rep | published in (s) | scheduled before due | first after due (ms) | last after due (ms) | "
             "received, missing, early | broker CPU ms (µs/msg) | broker idle before (ms/s) | other load | "
             "backlog first→last (ms) | backlog broker CPU ms (µs/msg) | backlog other load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, (x, y) in enumerate(zip(s, b)):
        lines.append(f"| {i + 1} | {x['published_s']:.2f} | {x['scheduled_before']} | {x['first_ms']:.1f} | "
                     f"{x['last_ms']:.1f} | {x['received']}, {x['missing']}, {'yes' if x['early'] else 'none'} | "
                     f"{x['broker_cpu_ms']:.1f} ({x['broker_cpu_us_per_msg']:.1f}) | {x['idle_broker_ms_per_s']:.2f} | "
                     f"{x['other_load_cores']:.2f} | {y['span_ms']:.1f} | {y['broker_cpu_ms']:.1f} "
                     f"({y['broker_cpu_us_per_msg']:.1f}) | {y['other_load_cores']:.2f} |")
    lines += ["", f"Median (min–max) over {len(reps)} repetitions: first {med_range([x['first_ms'] for x in s], 1)} ms "
              f"and last {med_range([x['last_ms'] for x in s], 1)} ms after the due time; broker CPU "
              f"{med_range([x['broker_cpu_ms'] for x in s], 1)} ms for the release and deliveries against "
              f"{med_range([y['broker_cpu_ms'] for y in b], 1)} ms for the backlog's deliveries alone; "
              + ("all arrived, once each, none before the due time." if all_in and not any(x["early"] for x in s)
                 else "**messages missing, duplicated or early: see the table.**"), ""]
    return "\n".join(lines) + "\n"


def options(description: str, messages: int) -> argparse.ArgumentParser:
    """The options of a script run by run_reps (this one's and bench/subscription.py's)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=messages)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--size", type=int, default=100, help="body bytes (default 100)")
    ap.add_argument("--credit", type=int, default=1000, help="the consumer's credit (default 1000)")
    ap.add_argument("--quiet-wait", type=float, default=20, help="before each repetition, wait up to this long "
                                                                 "for a quiet machine (run.py's wait_quiet)")
    ap.add_argument("--startup-timeout", type=float, default=60)
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    return ap


def run_reps(script: str, argv: list[str] | None, args, repetition: Callable[[R.Broker, Any, int], dict],
             markdown: Callable[[dict, Any], str], prepare: Callable[[R.Broker], None] | None = None) -> int:
    """One haqueue broker of this tree (prepare(broker) once it listens), then --reps times repetition(broker,
    args, i), each after a wait for a quiet machine; the run's JSON goes to bench/out/SCRIPT-*.json and its section,
    markdown(run, args), is printed and appended to RESULTS.md."""
    command = f"python bench/{script}.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    broker = R.CommandBroker(R.DEFAULT_HAQUEUE_CMD, f"haqueue single broker ({script})", None, args.startup_timeout)
    run: dict = {"command": command, "commit": tree_commit(), "load": [R.loadavg()], "reps": []}
    try:
        broker.start()
        if prepare is not None:
            prepare(broker)
        for i in range(args.reps):
            if args.quiet_wait > 0:
                R.wait_quiet(args.quiet_wait)
            run["reps"].append(repetition(broker, args, i))
    finally:
        broker.stop()
    run.update(date=now(), load=run["load"] + [R.loadavg()])
    (R.OUT / f"{script}-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(run, indent=1, default=str))
    R.print_and_record(markdown(run, args), args.no_record)
    return 0


def repetition(broker: R.Broker, args, i: int) -> dict:
    """A release and the backlog beside it."""
    rep = {"scheduled": scheduled_rep(broker, args), "backlog": backlog_rep(broker, args)}
    x, y = rep["scheduled"], rep["backlog"]
    log(f"rep {i + 1}: scheduled {x['scheduled_before']} before due; first {x['first_ms']:.1f} ms, last "
        f"{x['last_ms']:.1f} ms after it; {x['received']} received, {x['missing']} missing; broker "
        f"{x['broker_cpu_ms']:.1f} ms (backlog {y['broker_cpu_ms']:.1f} ms, {y['span_ms']:.1f} ms first→last); "
        f"other load {x['other_load_cores']:.2f}")
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = options(__doc__, 10000)
    ap.add_argument("--ahead", type=float, default=8.0, help="seconds from the start of publishing to the due time")
    ap.add_argument("--durable", action="store_true", help="header.durable=true on every message")
    return run_reps("scheduled", argv, ap.parse_args(argv), repetition, markdown)


if __name__ == "__main__":
    sys.exit(main())
