#!/usr/bin/env python3
"""A durable subscription resumed after a backlog (issue 28): one haqueue broker of this tree (its store on), a
topic exchange. Per repetition: a durable subscriber attaches (proton Python, `DurableSubscription`, a fixed
container id and link name) and detaches with closed=false; the C producer publishes --messages durable messages
to the exchange, all confirmed; then the C consumer resumes the subscription (the same container id and link
name, a durable source with expiry-policy never) and drains the backlog. It reports the time from the resuming
attach to the first and to the last message, the drain rate, the broker's CPU for the drain, and whether all
arrived, once each and in order. Beside it, as a reference, the same drain from a plain queue holding the same
messages (published by the same producer, drained by the same consumer): the subscription's own cost.

    python bench/subscription.py --messages 100000 --reps 3
"""
from __future__ import annotations

import sys
import uuid
from pathlib import Path

from proton.reactor import Container, DurableSubscription
from proton.utils import BlockingConnection

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as R  # noqa: E402  bench/run.py, used as a library
from interleave import med_range  # noqa: E402
from scheduled import Window, attach_consumer, options, publish, queue_info, result, run_reps  # noqa: E402

log = R.log
EXCHANGE = "bench-topic"
CONTAINER = "bench-subscriber"


def timeout_for(args) -> float:
    """Seconds a client may take to publish or drain --messages."""
    return 120 + args.messages / 2000


def durable_link(broker: R.Broker, name: str, unsubscribe: bool) -> None:
    """proton Python attaches the durable subscription `name` to the exchange, then detaches with closed=false
    (the subscription stays, bound) or closes the link (unsubscribe: its queue is deleted)."""
    conn = BlockingConnection(f"{R.HOST}:{broker.port}", timeout=30, container=Container(container_id=CONTAINER))
    try:
        receiver = conn.create_receiver(EXCHANGE, name=name, options=DurableSubscription())
        if unsubscribe:
            receiver.close()
        else:
            receiver.link.detach()  # written before the close below
    finally:
        conn.close()


def drain(broker: R.Broker, address: str, queue: str, args, extra: list[str] | None = None) -> dict:
    """The C consumer attached to `address` (with `extra` options) takes the backlog of `queue`: times from its
    attach, the broker's CPU from before the consumer starts to its end (connection and attach included)."""
    depth = queue_info(broker, queue)["depth"]
    window = Window(broker)
    c = result(attach_consumer(broker, address, args, timeout_for(args), extra), "consumer", timeout_for(args) + 10)
    w = window.stop(c["client_cpu_us"])
    first_ms, last_ms = ((c[k] - c["attach_us"]) / 1e3 for k in ("first_recv_us", "last_recv_us"))
    return {"depth_before": depth, "first_ms": first_ms, "last_ms": last_ms, "rate": args.messages * 1e3 / last_ms,
            "received": c["received"], "missing": c["missing"], "duplicates": c["duplicates"],
            "out_of_order": c["out_of_order"], **w, "broker_cpu_us_per_msg": w["broker_cpu_ms"] * 1e3 / args.messages}


def subscription_rep(broker: R.Broker, args) -> dict:
    """Subscribe and detach, publish the backlog to the exchange, resume and drain; unsubscribe after."""
    name = f"sub-{uuid.uuid4().hex[:8]}"
    durable_link(broker, name, unsubscribe=False)
    p = publish(broker, EXCHANGE, args, timeout_for(args), client="c")
    d = drain(broker, EXCHANGE, f"{CONTAINER}:{name}", args, ["--container-id", CONTAINER, "--subscription", name])
    durable_link(broker, name, unsubscribe=True)
    return {"publish_rate": p["settle_rate"], **d}


def queue_rep(broker: R.Broker, args) -> dict:
    """The reference: the same backlog published to a plain queue and drained by the same consumer."""
    queue = f"bench-plain-{uuid.uuid4().hex[:8]}"
    p = publish(broker, queue, args, timeout_for(args), client="c")
    d = drain(broker, queue, queue, args)
    R.admin_request(f"{R.HOST}:{broker.port}", "DELETE", "queue", queue, timeout=10)
    return {"publish_rate": p["settle_rate"], **d}


def complete(r: dict, args) -> bool:
    return (r["depth_before"] == r["received"] == args.messages and not r["missing"] and not r["duplicates"]
            and not r["out_of_order"])


def cells(r: dict) -> str:
    """A drain's columns of the table."""
    return (f"{r['depth_before']:,} | {r['first_ms']:.1f} | {r['last_ms']:.0f} | {r['rate']:,.0f} | "
            f"{r['received']}, {r['missing']}, {r['duplicates']}, {r['out_of_order']} | "
            f"{r['broker_cpu_ms']:.0f} ({r['broker_cpu_us_per_msg']:.2f}) | {r['other_load_cores']:.2f}")


def summary(rs: list[dict]) -> str:
    """Medians (min–max) of the drains' figures."""
    return (f"first message {med_range([r['first_ms'] for r in rs], 1)} ms and last "
            f"{med_range([r['last_ms'] for r in rs])} ms after the attach, "
            f"{med_range([r['rate'] / 1e3 for r in rs], 1)}k msg/s, broker CPU "
            f"{med_range([r['broker_cpu_ms'] for r in rs])} ms")


def markdown(run: dict, args) -> str:
    reps = run["reps"]
    s, q = [r["subscription"] for r in reps], [r["queue"] for r in reps]
    drain_cols = ("depth before | first (ms) | last (ms) | drain msg/s | received, missing, dup, out of order | "
                  "broker CPU ms (µs/msg) | other load")
    lines = [f"## A durable subscription resumed after a {args.messages:,}-message backlog (bench/subscription.py), "
             f"{run['date']}", "", "```", run["command"], "```", "",
             f"One haqueue broker of this tree at {run['commit']} (its store on), a topic exchange. Per repetition: "
             "proton Python attaches a durable subscription (`DurableSubscription`, a fixed container id and link "
             "name) and detaches with closed=false; the C producer publishes "
             f"{args.messages:,} durable {args.size}-byte messages to the exchange (≤ 1000 unsettled, all "
             "confirmed); then the C consumer (`--container-id`, `--subscription`: the same names, source durable "
             f"unsettled-state, expiry-policy never; credit {args.credit}) resumes the subscription and drains it. "
             "Times from the consumer's attach being sent to its first and last message (CLOCK_MONOTONIC, the "
             "consumer's own); drain rate = messages / (attach → last). Broker CPU from just before the consumer "
             "starts to its end (threads' schedstat, ns; connection and attach included). The plain queue: the same "
             "messages published by the same producer to a queue, drained by the same consumer (no subscription "
             "options). The two alternate in order from one repetition to the next. Other load: cores busy during "
             "the drain but for the broker and the consumer. "
             f"Load average at the start {run['load'][0]}, at the end {run['load'][1]}.", "",
             f"| rep | kind | {drain_cols} | publish msg/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for i, (x, y) in enumerate(zip(s, q)):
        lines += [f"| {i + 1} | subscription | {cells(x)} | {x['publish_rate']:,.0f} |",
                  f"| | plain queue | {cells(y)} | {y['publish_rate']:,.0f} |"]
    ratio = [x["last_ms"] / y["last_ms"] for x, y in zip(s, q)]
    cpu_ratio = [x["broker_cpu_ms"] / y["broker_cpu_ms"] for x, y in zip(s, q)]
    lines += ["", f"Median (min–max) over {len(reps)} repetitions: the subscription's {summary(s)}; the plain "
              f"queue's {summary(q)}. Subscription over plain queue, rep by rep: drain time {med_range(ratio, 2)}×, "
              f"broker CPU {med_range(cpu_ratio, 2)}×; "
              + ("all arrived, once each, in order." if all(complete(r, args) for r in s + q)
                 else "**messages missing, duplicated or out of order: see the table.**"), ""]
    return "\n".join(lines) + "\n"


def create_exchange(broker: R.Broker) -> None:
    code, desc, _ = R.admin_request(f"{R.HOST}:{broker.port}", "CREATE", "exchange", EXCHANGE, {"type": "topic"})
    if code >= 400:
        raise RuntimeError(f"CREATE exchange {EXCHANGE}: {code} {desc}")


def repetition(broker: R.Broker, args, i: int) -> dict:
    """The subscription and the plain queue, in an order that alternates from one repetition to the next."""
    order = [("subscription", subscription_rep), ("queue", queue_rep)][::1 if i % 2 == 0 else -1]
    rep = {kind: measure(broker, args) for kind, measure in order}
    x, y = rep["subscription"], rep["queue"]
    log(f"rep {i + 1}: subscription first {x['first_ms']:.1f} ms, last {x['last_ms']:.0f} ms, "
        f"{x['rate']:,.0f} msg/s, broker {x['broker_cpu_ms']:.0f} ms, {x['received']} received, "
        f"{x['missing']} missing, {x['out_of_order']} out of order, other load {x['other_load_cores']:.2f}; "
        f"plain queue first {y['first_ms']:.1f} ms, last {y['last_ms']:.0f} ms, broker {y['broker_cpu_ms']:.0f} ms")
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = options(__doc__, 100000)
    ap.set_defaults(durable=True)  # header.durable=true on every message (R.message_options)
    return run_reps("subscription", argv, ap.parse_args(argv), repetition, markdown, create_exchange)


if __name__ == "__main__":
    sys.exit(main())
