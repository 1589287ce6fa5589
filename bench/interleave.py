#!/usr/bin/env python3
"""One benchmark runner for any broker set-ups, run by run in turn: this machine's speed drifts by up
to 1.7× from minute to minute, so set-ups are compared round by round, never one after the other.

All the set-ups named run side by side (an idle one costs little; it shows in *other load*). Each round
runs every set-up once, in an order rotated every round (A B, B A, ... or A B C, B C A, C A B): one
saturation run (bench/run.py's `saturation`: rhea producer and consumer, or with --clients c the C ones,
at-least-once) and, unless
--no-latency, one fixed-rate latency run (run.py's `latency`). Each set-up's figures in a round are
divided by the baseline's of the same round (the last set-up named, or --baseline): the report gives
the median and the min–max range of these ratios, and appends a markdown section with the exact command
to bench/RESULTS.md (unless --no-record). fsyncs come from the haqueue brokers' `admin store status`
(`syncs`, summed over a cluster's brokers), read before and after each measured run.

Set-ups (--setups, comma-separated):
  single            one haqueue broker of this tree
  single:P          the same, its saturation runs through P queues at once (a producer and a consumer
                    each): beside `single`, what many queues cost against one
  old:DIR           one haqueue broker of another tree (git archive COMMIT | tar -x -C DIR)
  single+audit, old:DIR+audit
                    the same writing audit events (`audit: {dir: DATA_DIR/audit}`); named beside the
                    same set-up without, the report gives the audit's cost round by round
  cluster[:MODE]    `haqueue cluster up --size 3 [--sync MODE]`: primary + 2 backups; clients use the
                    public address
  cluster:MODE@DIR  the same of another tree (a copy with its compiled modules, or built in place)
  shards:K[:relay]  `haqueue cluster up --size 1 --shards K --replicas 1`: K shard processes, each its own
                    primary; a saturation run uses K queues at once (or --pairs), spread over the shards;
                    clients connect to their queue's shard, or with :relay to the next one (every link
                    relayed: the relay's cost)
  single+console, cluster[:MODE]+console
                    the same serving the web console (`http: {listen}`; the cluster's on ports of their own)
  single+page, cluster[:MODE]+page
                    and a page open on it: a thread asking what the page asks every second (the overview and
                    the queue table, bench/console_page.py); beside +console, the console's cost
  rabbit-classic    RabbitMQ, one node, durable classic queue
  proton-relay      bench/floor/proton_relay.c: a relay in C on proton's engine (the system's libqpid-proton),
                    nothing of haqueue's: beside --floor's relay.c and haqueue, how much of a lone message's CPU
                    is proton's and how much haqueue's own (transient, no store; for fixed-rate runs)
  rabbit-quorum     RabbitMQ, 3 nodes on this machine, quorum queue of 3
  single+prioN, old:DIR+prioN, rabbit-classic+prioN (after +audit if both)
                    each run's queue declared with N priority levels (haqueue `x-priorities: N` over the
                    management API, RabbitMQ `x-max-priority: N`); in a run naming one, every producer (of
                    every set-up, so a plain queue beside it gets the same messages) sends header priorities
                    0-9 in turn; the consumers count the reordering (out of order), which is no failure

--floor single|cluster also runs, in each round's rotation, bench/floor/relay.c at the fixed rate: per message
only the system calls a broker cannot avoid (alone, or as a primary with two backups), with nothing else; the
report gives each set-up's CPU per message at that rate as a multiple of the floor measured in the same round.

--recovery N instead measures a restart: a single durable haqueue broker is filled with N durable
messages (the rhea producer, no consumer), killed with SIGKILL and started again, --recovery-reps
times: time from the process start to the port accepting connections and to the queue showing depth N.

    python bench/interleave.py --setups single,rabbit-classic --durable --rounds 5
    python bench/interleave.py --setups cluster:quorum_disk,cluster:all_disk,rabbit-quorum --durable
    python bench/interleave.py --setups single,old:/tmp/hq-old --no-latency --target-ratio 0.95
    python bench/interleave.py --setups single+audit,single,old:/tmp/hq-old+audit,old:/tmp/hq-old --no-latency
    python bench/interleave.py --setups cluster+page,cluster+console --no-latency --clients c   # the console's cost
    python bench/interleave.py --setups single,rabbit-classic --pairs 10 --no-latency   # 10 queues at once
    python bench/interleave.py --setups single:10,single --no-latency --clients c        # 10 queues against 1
    python bench/interleave.py --setups shards:4,shards:2,shards:1 --no-latency   # K shards, K queues
    python bench/interleave.py --setups shards:2:relay,shards:2 --no-latency      # the relay's cost
    python bench/interleave.py --setups shards:2,shards:1 --no-latency --clients c  # clients that leave the cores
    python bench/interleave.py --setups single+prio10,single,rabbit-classic+prio10 --baseline rabbit-classic+prio10
    python bench/interleave.py --setups single,rabbit-classic --clients c --floor single   # haqueue against the floor
    python bench/interleave.py --recovery 1000000
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as R  # noqa: E402  bench/run.py, used as a library
import setups as S  # noqa: E402
from console_page import PagePoller  # noqa: E402
from sharded import ShardedCluster  # noqa: E402

HOST = R.HOST
log = R.log
OLD_CMD = ("sh -c 'cd {tree} && exec {{python}} -m haqueue broker --listen 127.0.0.1:{{port}} --name {{name}} "
           "--data-dir {{data_dir}}'")
# +audit: the same broker from a config file with `audit: {dir: DATA_DIR/audit}`.
AUDIT = "+audit"
PRIO = re.compile(r"\+prio(\d+)$")  # +prioN: queues with N priority levels
PRIO_KINDS = ("single", "old", "rabbit-classic")  # the set-ups that take +prioN
HEADER_PRIORITIES = 10  # the producers of a run with a +prioN set-up send header priorities 0-9 in turn
# +console: the same broker serving its web console, no page open; +page: and a page open (bench/console_page.py)
CONSOLE, PAGE = "+console", "+page"
# --floor: the relay's backups, and what it stands for
FLOOR = "floor"
FLOOR_BACKUPS = {"single": 0, "cluster": 2}
FLOOR_WHAT = {"single": "two wake-ups, two recvs and two sends per message, a single broker's system calls",
              "cluster": "a primary's system calls with two backups, each acknowledging every message, and the backups'"}
CONSOLE_CMD = ("sh -c 'printf \"name: %s\\nlisten:\\n  - 127.0.0.1:%s\\ndata_dir: %s\\nhttp:\\n  listen: 127.0.0.1:{http}\\n\" "
               "{{name}} {{port}} {{data_dir}} > {{data_dir}}/b.yaml && exec {{python}} -m haqueue broker --config "
               "{{data_dir}}/b.yaml'")
AUDIT_CMD = ("sh -c 'cd {tree} && printf \"name: %s\\nlisten:\\n  - 127.0.0.1:%s\\ndata_dir: %s\\naudit:\\n  dir: %s/audit\\n\" "
             "{{name}} {{port}} {{data_dir}} {{data_dir}} > {{data_dir}}/b.yaml && "
             "exec {{python}} -m haqueue broker --config {{data_dir}}/b.yaml'")


# ---------------------------------------------------------------- set-ups

def setup_specs(setups: str | None) -> list[str]:
    """--setups as a list."""
    return [s.strip() for s in (setups or "").split(",") if s.strip()]


def priority_levels(spec: str) -> tuple[str, int]:
    """The set-up without its +prioN suffix, and N (0 without one)."""
    m = PRIO.search(spec)
    return (spec[:m.start()], int(m[1])) if m else (spec, 0)


def header_priorities(specs: list[str]) -> int:
    """What the producers' --priorities is: HEADER_PRIORITIES if a set-up has priority levels, else 0."""
    return HEADER_PRIORITIES if any(priority_levels(spec)[1] for spec in specs) else 0


def default_label(spec: str) -> str:
    """A set-up's name in the tables (RabbitMQ's gain its version once started)."""
    plain, levels = priority_levels(spec)
    if levels:
        return default_label(plain) + f", {levels} priority levels"
    if spec.endswith(AUDIT):
        return default_label(spec.removesuffix(AUDIT)) + " + audit"
    for suffix, what in ((CONSOLE, " + console"), (PAGE, " + console, page open")):
        if spec.endswith(suffix):
            return default_label(spec.removesuffix(suffix)) + what
    kind, _, arg = spec.partition(":")
    return {"single": "haqueue single broker" + (f", {arg} queues at once" if arg else ""),
            "old": f"haqueue single broker ({arg})",
            "cluster": f"haqueue primary + 2 backups, {arg.replace('@', ' (') + ')' if '@' in arg else arg or 'all'}", "rabbit-classic": "RabbitMQ classic",
            "rabbit-quorum": "RabbitMQ 3-node cluster, quorum queue",
            "proton-relay": "proton's engine alone (C relay)",
            "shards": f"haqueue {arg.partition(':')[0]} shard(s){', relayed' if arg.endswith(':relay') else ''}",
            }.get(kind, spec)


def make_setup(spec: str, startup_timeout: float) -> R.Broker:
    plain, levels = priority_levels(spec)
    if levels:
        if plain.removesuffix(AUDIT).partition(":")[0] not in PRIO_KINDS:
            raise ValueError(f"{spec}: only single[:P], old:DIR (either with +audit) and rabbit-classic take +prioN")
        return with_priorities(make_setup(plain, startup_timeout), spec, levels)
    if spec.endswith(CONSOLE) or spec.endswith(PAGE):
        return console_setup(spec, startup_timeout)
    audit = spec.endswith(AUDIT)
    kind, _, arg = spec.removesuffix(AUDIT).partition(":")
    if audit and kind in ("single", "old"):
        tree = arg if kind == "old" else str(R.REPO)
        return R.CommandBroker(AUDIT_CMD.format(tree=shlex.quote(tree)), default_label(spec), None, startup_timeout)
    if audit:
        raise ValueError(f"{spec}: only single and old:DIR write audit events here")
    if kind == "single" and (arg == "" or arg.isdigit() and int(arg) > 1):
        broker = R.CommandBroker(R.DEFAULT_HAQUEUE_CMD, default_label(spec), None, startup_timeout)
        broker.pairs = int(arg or 1)  # its saturation runs' queues at once (unless --pairs)
        return broker
    if kind == "old" and arg:
        return R.CommandBroker(OLD_CMD.format(tree=shlex.quote(arg)), default_label(spec), None, startup_timeout)
    if kind == "cluster":
        mode, _, tree = arg.partition("@")
        return S.HaCluster(default_label(spec), size=3, sync=mode or None, tree=Path(tree) if tree else S.REPO)
    count, _, relay = arg.partition(":")
    if kind == "shards" and count.isdigit() and (relay == "" or relay == "relay" and int(count) > 1):
        return ShardedCluster(default_label(spec), int(count), relay=bool(relay))
    if kind == "rabbit-classic":
        return R.RabbitBroker(None)
    if kind == "rabbit-quorum":
        return S.RabbitCluster()
    if kind == "proton-relay":
        binary = R.compiled(R.BENCH / "floor" / "proton_relay.c", "proton-relay", ("qpid-proton",))
        proton = R.CommandBroker(f"{shlex.quote(str(binary))} {{port}}", default_label(spec), None, startup_timeout)
        proton.has_store = False  # no management to ask
        return proton
    raise ValueError(f"unknown set-up {spec!r} (single[:P], old:DIR, cluster[:MODE][@DIR], shards:K[:relay] (relay: K > 1), "
                     "rabbit-classic, rabbit-quorum, proton-relay; +audit, +prioN)")


def console_setup(spec: str, startup_timeout: float) -> R.Broker:
    """single or cluster[:MODE] serving the web console (`console`: its URL); +page: a page will poll it."""
    plain = spec.removesuffix(CONSOLE).removesuffix(PAGE)
    kind, _, mode = plain.partition(":")
    if kind == "single" and not mode:
        http = R.free_port()
        broker: R.Broker = R.CommandBroker(CONSOLE_CMD.format(http=http), default_label(spec), None, startup_timeout)
        broker.console = f"http://127.0.0.1:{http}/"
    elif kind == "cluster" and "@" not in mode:
        broker = S.HaCluster(default_label(spec), size=3, sync=mode or None, console=True)
    else:
        raise ValueError(f"{spec}: only single and cluster[:MODE] take {CONSOLE} or {PAGE}")
    broker.page = PAGE if spec.endswith(PAGE) else None
    return broker


def with_priorities(broker: R.Broker, spec: str, levels: int) -> R.Broker:
    """The set-up whose queues are declared with `levels` priority levels."""
    if isinstance(broker, R.RabbitBroker):  # its label, made at start, names the argument
        broker.queue_arguments = {"x-max-priority": levels}
    else:
        broker.queue_arguments = {"x-priorities": levels}
        broker.label = default_label(spec)
    return broker


def start_all(specs: list[str], args) -> dict[str, R.Broker]:
    """Start every set-up and push ten messages through each; stops what started if one fails."""
    brokers: dict[str, R.Broker] = {}
    try:
        for spec in specs:
            b = make_setup(spec, args.startup_timeout)
            brokers[spec] = b
            b.start()
            s = R.smoke(b)
            if "error" in s:
                raise RuntimeError(f"{spec}: smoke test failed: {s['error']}; {b.describe_failure()}")
            if getattr(b, "page", None):
                b.page = PagePoller(b.console)
                b.page.start()
    except BaseException:
        stop_all(brokers)
        raise
    return brokers


def stop_all(brokers: dict[str, R.Broker]) -> None:
    for spec, b in brokers.items():
        if isinstance(getattr(b, "page", None), PagePoller):
            log(f"{spec}: the page made {b.page.stop()}")
        try:
            b.stop()
        except Exception as e:  # stop the others anyway
            log(f"{spec}: stop failed: {e}")


# ---------------------------------------------------------------- rounds

def turn(broker: R.Broker, args) -> dict:
    """One set-up's share of a round: a saturation run and a fixed-rate latency run."""
    out = saturation_turn(broker, args)
    out.update(latency_turn(broker, args))
    return out


def saturation_turn(broker: R.Broker, args) -> dict:
    if not broker.alive():
        return {"saturation": {"error": "set-up gone"}}
    out: dict = {"background_cores": R.wait_quiet(args.quiet_wait) if args.quiet_wait > 0 else None}
    sat = R.saturation(broker, args.size, R.messages_for(args.messages, args.size), args, clients=args.clients,
                       pairs=args.pairs if args.pairs > 1 else broker.pairs)
    out["saturation"] = sat
    if "error" in sat:
        log(f"  {broker.label}: saturation FAILED: {sat['error']} [{broker.describe_failure()}]")
    else:
        log(f"  {broker.label}: {sat['msgs_per_s']:.0f} msg/s, broker {sat['broker_cpu_us_per_msg']:.1f} µs/msg, "
            f"fsyncs/s {fmt(sat.get('syncs_per_s'))}, other load {sat['other_load_cores']:.2f}, "
            f"calibration {sat['calibration_ms']:.1f} ms, out of order {sat['out_of_order']}")
        log("    " + explain(sat))
    return out


def latency_turn(broker: R.Broker, args) -> dict:
    out: dict = {}
    if args.latency and broker.alive():
        lat = R.latency(broker, args.size, args, clients=args.clients)
        out["latency"] = lat
        if "error" in lat:
            log(f"  {broker.label}: latency FAILED: {lat['error']}")
        else:
            log(f"  {broker.label}: p50 {lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms at {args.rate:g}/s, "
                f"fsyncs/s {fmt(lat.get('syncs_per_s'))}, other load {lat['other_load_cores']:.2f}")
    return out


def explain(sat: dict) -> str:
    """What a saturation run's figures come from: each process's CPU µs/msg, and a cluster's backups as
    the primary saw them (the most each lagged, its states, timeout drops) and warnings logged."""
    n = sat["raw"]["producer"]["accepted"] or 1
    cpu = sat["raw"]["cpu"]
    parts = [", ".join(f"{label} {us / n:.1f}" for label, us in cpu["per_process_us"].items()) + " µs/msg"]
    watched = cpu.get("watched", {})
    for name, b in sorted(watched.get("backups", {}).items()):
        drops = (b.get("timeout_drops") or 0) - (b.get("timeout_drops_first") or 0)
        parts.append(f"{name}: lag ≤ {b['max_lag']} ({b['max_lag_seconds']:.2f} s, unconfirmed ≤ {b['max_unconfirmed']}), "
                     f"at the end {b.get('last_lag')}, {'/'.join(b['states'])}"
                     + (f", {drops} timeout drop(s)" if drops else "")
                     + (f", absent in {b['absent_samples']} of {watched['samples']} looks" if b["absent_samples"] else ""))
    if watched.get("log_warnings"):
        parts.append(f"{len(watched['log_warnings'])} warning(s) logged, first: {watched['log_warnings'][0]}")
    return "; ".join(parts)


def interleave(brokers: dict[str, R.Broker], args) -> dict[str, list[dict]]:
    """Every set-up's turns, round by round; with --floor, the floor's runs under FLOOR, in the rotation."""
    specs = list(brokers) + ([FLOOR] if args.floor else [])
    results: dict[str, list[dict]] = {s: [] for s in specs}
    for i in range(args.rounds):
        order = R.rotated(specs, i)
        log(f"round {i + 1}/{args.rounds}: {', '.join(order)} (load average {R.loadavg()})")
        if args.together:
            together(brokers, results, args)
            continue
        for spec in order:
            if spec == FLOOR:
                results[spec].append({"latency": floor_turn(args)})
            else:
                results[spec].append(turn(brokers[spec], args))
    return results


def together(brokers: dict[str, R.Broker], results: dict[str, list[dict]], args) -> None:
    """--together: every set-up's saturation run at once, each with its own clients, then every fixed-rate run
    (and the floor's) at once: each sees the same minutes of the machine, whatever else runs on it."""
    def run_all(jobs: dict[str, Callable[[], dict]]) -> dict[str, dict]:
        done: dict[str, dict] = {}
        threads = [threading.Thread(target=lambda k=k, job=job: done.__setitem__(k, job())) for k, job in jobs.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return done
    turns = run_all({spec: lambda b=b: saturation_turn(b, args) for spec, b in brokers.items()})
    later: dict[str, Callable[[], dict]] = {spec: lambda b=b: latency_turn(b, args) for spec, b in brokers.items()}
    if args.floor:
        later[FLOOR] = lambda: {"latency": floor_turn(args)}
    for spec, out in run_all(later).items():
        turns.setdefault(spec, {}).update(out)
    for spec, out in turns.items():
        results[spec].append(out)


def floor_turn(args) -> dict:
    """The floor's share of a round: bench/floor/relay.c at --rate for --duration."""
    if args.quiet_wait > 0:
        R.wait_quiet(args.quiet_wait)
    try:
        floor = S.floor_run(FLOOR_BACKUPS[args.floor], args.rate, args.duration)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}
    log(f"  floor ({args.floor}): {floor['cpu_us_per_msg']:.1f} µs/msg ({floor['sys_us_per_msg']:.1f} in the kernel)")
    return floor


# ---------------------------------------------------------------- figures

def fmt(x: float | None, d: int = 0) -> str:
    return "—" if x is None else f"{x:.{d}f}"


def ok_runs(turns: list[dict], kind: str) -> list[dict | None]:
    """Per round: the run of this kind, or None if it failed or was not made."""
    return [t[kind] if kind in t and "error" not in t[kind] else None for t in turns]


def med_range(values: list[float | None], d: int = 0) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "—"
    if len(v) == 1:
        return fmt(v[0], d)
    return f"{fmt(statistics.median(v), d)} ({fmt(min(v), d)}–{fmt(max(v), d)})"


def ratios(turns: list[dict], base: list[dict], kind: str, key: str) -> list[float]:
    """Round by round: this set-up's figure / the baseline's, for rounds where both ran."""
    out = []
    for a, b in zip(ok_runs(turns, kind), ok_runs(base, kind)):
        if a is not None and b is not None and a.get(key) and b.get(key):
            out.append(a[key] / b[key])
    return out


def verdict(values: list[float], target: float, at_least: bool, unit: str = "rounds") -> str:
    """met (every round), met by the median only, or not met."""
    if not values:
        return "—"
    good = (lambda x: x >= target) if at_least else (lambda x: x <= target)
    n_ok = sum(good(v) for v in values)
    if n_ok == len(values):
        return f"met in all {len(values)} {unit}"
    if good(statistics.median(values)):
        return f"met by the median, in {n_ok} of {len(values)} {unit}"
    return f"NOT met ({n_ok} of {len(values)} {unit})"


def tree_commit() -> str:
    """The commit of the haqueue this tree runs (and whether haqueue/ differs from it)."""
    git = ["git", "-C", str(R.REPO)]
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(git + ["status", "--porcelain", "--", "haqueue"], capture_output=True, text=True).stdout
    return (head or "?") + (" with local changes to haqueue/" if dirty.strip() else "")


def machine_line(args, commit: str) -> str:
    node_v = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    return (f"haqueue of this tree at {commit}. Machine: {os.cpu_count()} cores, Linux {platform.release()}, node "
            f"{node_v}, " + ("the C clients of bench/c_clients" if getattr(args, "clients", "rhea") == "c" else "rhea 3.0.5")
            + f" (a producer process and a consumer process per queue), Python {platform.python_version()}; "
            f"{args.size}-byte bodies, messages {'durable (header.durable=true)' if args.durable else 'not durable'}, "
            f"at-least-once (≤ {args.inflight} unsettled, consumer credit {args.credit})"
            + (f"; every message with a header priority, 0-{args.priorities - 1} in turn, on every set-up"
               if getattr(args, "priorities", 0) else "")
            + (f"; saturation through {args.pairs} queues at once, a producer and a consumer process each, figures "
               f"aggregate" if getattr(args, "pairs", 1) > 1 else "") + ".")


def markdown(run: dict, args) -> str:
    """The section for RESULTS.md from a run as saved in bench/out (results, labels, command, date, load)."""
    results, command, load = run["results"], run["command"], run.get("load") or ("not recorded", "not recorded")
    labels = {spec: run.get("labels", {}).get(spec) or default_label(spec) for spec in results}
    specs = [spec for spec in results if spec != FLOOR]
    base = args.baseline or specs[-1]
    lines = [f"## Interleaved: {' vs '.join(specs)} (bench/interleave.py), {run['date']}", "",
             "```", command, "```", "", machine_line(args, run.get("commit", "not recorded")),
             f"{args.rounds} round(s); each round runs every set-up once, "
             + ("all at the same time, each with its own clients (`--together`): " if getattr(args, "together", False)
                else "in an order rotated each round: ")
             + f"a saturation run of {args.messages} messages after a warm-up"
             + (f", then {args.rate:g} msg/s for {args.duration:g} s (latency after the first second)" if args.latency else "")
             + f". All set-ups ran side by side. Load average at the start {load[0]}, at the end {load[1]}.",
             "", "Medians over the rounds, min–max in brackets. Broker CPU = utime+stime of all the set-up's "
             "processes (every broker of a cluster, every RabbitMQ node) per message. fsyncs: the haqueue stores' "
             "`syncs` counters (summed over a cluster's brokers) over the measured run. Other load = cores used by "
             "everything but the set-up under test and the two clients (the idle set-ups included).", "",
             f"| set-up | msg/s | broker CPU µs/msg | fsyncs/s | msgs per fsync | p50 ms @ {args.rate:g}/s | "
             f"p99 ms @ {args.rate:g}/s | broker CPU µs/msg @ {args.rate:g}/s | fsyncs/s @ {args.rate:g}/s | "
             "other load (cores) | calibration ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for spec in specs:
        sat, lat = ok_runs(results[spec], "saturation"), ok_runs(results[spec], "latency")
        get = lambda runs, k: [r.get(k) if r else None for r in runs]  # noqa: E731
        loads = [x for x in get(sat, "other_load_cores") + get(lat, "other_load_cores") if x is not None]
        failed = sum(r is None for r in sat)
        lines.append(
            f"| {labels[spec]} (`{spec}`) | {med_range(get(sat, 'msgs_per_s'))}"
            + (f", {failed} failed" if failed else "")
            + f" | {med_range(get(sat, 'broker_cpu_us_per_msg'), 1)} | {med_range(get(sat, 'syncs_per_s'))} "
            f"| {med_range(get(sat, 'msgs_per_sync'), 1)} | {med_range(get(lat, 'p50_ms'), 2)} "
            f"| {med_range(get(lat, 'p99_ms'), 2)} | {med_range(get(lat, 'broker_cpu_us_per_msg'), 1)} "
            f"| {med_range(get(lat, 'syncs_per_s'))} "
            f"| {fmt(statistics.median(loads), 2) if loads else '—'} (≤ {fmt(max(loads), 2) if loads else '—'}) "
            f"| {med_range(get(sat, 'calibration_ms'), 1)} |")
    lines += ["", f"Ratios to `{base}`, round by round (median, min–max, each round's value):", "",
              f"| set-up | msg/s ratio | broker CPU ratio | p99 ratio | broker CPU ratio @ {args.rate:g}/s | msg/s ratio "
              f"per round | broker CPU ratio @ {args.rate:g}/s per round | other load per round (cores, the pair's "
              "saturation runs) |", "|---|---|---|---|---|---|---|---|"]
    for spec in specs:
        if spec == base:
            continue
        r_rate = ratios(results[spec], results[base], "saturation", "msgs_per_s")
        r_cpu = ratios(results[spec], results[base], "saturation", "broker_cpu_us_per_msg")
        r_p99 = ratios(results[spec], results[base], "latency", "p99_ms")
        r_cpu_rate = ratios(results[spec], results[base], "latency", "broker_cpu_us_per_msg")
        loads = [f"{a['other_load_cores']:.1f}/{b['other_load_cores']:.1f}" for a, b in
                 zip(ok_runs(results[spec], "saturation"), ok_runs(results[base], "saturation")) if a and b]
        lines.append(f"| `{spec}` | {med_range(r_rate, 2)} | {med_range(r_cpu, 2)} | {med_range(r_p99, 2)} | "
                     f"{med_range(r_cpu_rate, 2)} | " + " ".join(f"{x:.2f}" for x in r_rate) + " | "
                     + " ".join(f"{x:.2f}" for x in r_cpu_rate) + " | " + " ".join(loads) + " |")
    lines.append("")
    targets = []
    for spec in specs:
        if spec == base:
            continue
        if args.target_ratio:
            r = ratios(results[spec], results[base], "saturation", "msgs_per_s")
            targets.append(f"| `{spec}` msg/s ≥ {args.target_ratio:g}× `{base}` | {med_range(r, 2)} | "
                           f"{verdict(r, args.target_ratio, True)} | see the ratios above |")
        if args.target_p99:
            lat = [x for x in ok_runs(results[spec], "latency") if x]
            p = [x["p99_ms"] for x in lat]
            targets.append(f"| `{spec}` p99 ≤ {args.target_p99:g} ms at {args.rate:g} msg/s | {med_range(p, 2)} ms | "
                           f"{verdict(p, args.target_p99, False)} | "
                           + " ".join(f"{x['p99_ms']:.1f} ({x['other_load_cores']:.1f})" for x in lat) + " |")
    lines += floor_multiples(results, specs, args)
    lines += audit_cost(results, specs)
    if targets:
        lines += ["Targets (met = in every round; the range is what a slow minute gives):", "",
                  "| target | value | verdict | per round (other load, cores) |", "|---|---|---|---|", *targets, ""]
    problems = [f"{spec} round {i + 1} {kind}: {t[kind]['error']}" for spec in specs
                for i, t in enumerate(results[spec]) for kind in ("saturation", "latency")
                if kind in t and "error" in t[kind]]
    problems += [f"{spec} round {i + 1}: missing {s['missing']}, duplicates {s['duplicates']}" for spec in specs
                 for i, s in enumerate(ok_runs(results[spec], "saturation")) if s and (s["missing"] or s["duplicates"])]
    if args.priorities:
        lines += ["Priority reordering: messages received out of sequence in each saturation run (no failure: "
                  "a priority queue with a backlog delivers higher priorities first):", "",
                  *(f"- `{spec}`: " + " ".join(str(x["out_of_order"]) if x else "—" for x in ok_runs(results[spec], "saturation"))
                    for spec in specs), ""]
    if problems:
        lines += ["Problems seen:", "", *("- " + p.replace("\n", " / ") for p in problems), ""]
    return "\n".join(lines) + "\n"


def floor_multiples(results: dict[str, list[dict]], specs: list[str], args) -> list[str]:
    """With --floor: the floor's own figures and each set-up's CPU at the fixed rate as a multiple of the floor
    measured in the same round."""
    if FLOOR not in results:
        return []
    floors = ok_runs(results[FLOOR], "latency")
    get = lambda k: [f[k] if f else None for f in floors]  # noqa: E731
    lines = [f"Against the floor (`--floor {args.floor}`: bench/floor/relay.c, {FLOOR_WHAT[args.floor]}, the same "
             f"{args.rate:g} msg/s of 100-byte messages in each round): {med_range(get('cpu_us_per_msg'), 1)} µs/msg, "
             f"{med_range(get('sys_us_per_msg'), 1)} in the kernel. Each set-up's broker CPU per message at "
             f"{args.rate:g} msg/s as a multiple of its round's floor (median, min–max, each round's value):", "",
             "| set-up | × floor | µs/msg above the floor | per round |", "|---|---|---|---|"]
    for spec in specs:
        pairs = [(a["broker_cpu_us_per_msg"], f["cpu_us_per_msg"])
                 for a, f in zip(ok_runs(results[spec], "latency"), floors) if a and f and f["cpu_us_per_msg"]]
        multiples = [a / f for a, f in pairs]
        lines.append(f"| `{spec}` | {med_range(multiples, 2)} | {med_range([a - f for a, f in pairs], 1)} | "
                     + " ".join(f"{x:.2f}" for x in multiples) + " |")
    return lines + [""]


def audit_cost(results: dict[str, list[dict]], specs: list[str]) -> list[str]:
    """For each set-up run with and without audit events: what they cost, round by round."""
    pairs = [(s, s.removesuffix(AUDIT)) for s in specs if s.endswith(AUDIT) and s.removesuffix(AUDIT) in specs]
    if not pairs:
        return []
    lines = ["The audit's cost: the set-up with audit events over the same without, in the same round "
             "(median, min–max, each round's value):", "",
             "| set-up | broker CPU µs/msg | msg/s | CPU per round |", "|---|---|---|---|"]
    medians = []
    for with_audit, without in pairs:
        cpu = ratios(results[with_audit], results[without], "saturation", "broker_cpu_us_per_msg")
        rate = ratios(results[with_audit], results[without], "saturation", "msgs_per_s")
        lines.append(f"| `{without}` | {med_range(cpu, 3)} | {med_range(rate, 3)} | "
                     + " ".join(f"{x:.3f}" for x in cpu) + " |")
        if cpu:
            medians.append((without, statistics.median(cpu)))
    if len(medians) == 2:
        (a, x), (b, y) = medians
        lines += ["", f"Audit CPU overhead: `{a}` {100 * (x - 1):+.1f} %, `{b}` {100 * (y - 1):+.1f} % "
                      f"(difference {100 * (x - y):+.1f} points)."]
    return lines + [""]


# ---------------------------------------------------------------- recovery

def produce(broker: R.Broker, queue: str, n: int, args) -> dict:
    """n messages through the rhea producer alone (no consumer: they stay queued)."""
    prod = R.start_client("rhea", "producer", R.client_args(broker, queue) + [
        "--messages", str(n), "--size", str(args.size), "--inflight", str(args.inflight),
        "--timeout", str(int(120 + n / 500))] + (["--durable"] if args.durable else []), R.OUT / "clients.stderr.log")
    try:
        res = R.JsonLines(prod).wait_for(lambda o: o.get("role") == "producer", time.monotonic() + 140 + n / 500)
    finally:
        R.stop_proc(prod)
    if res is None or not res.get("ok") or res.get("accepted") != n:
        raise RuntimeError(f"filling {queue} failed: {res}")
    return res


def queue_depth(broker: R.Broker, queue: str) -> int | None:
    try:
        code, _, body = R.admin_request(f"{HOST}:{broker.port}", "READ", "queue", queue, timeout=10)
    except R.haqueue_admin().AdminError:
        return None
    return body.get("depth") if code < 400 and isinstance(body, dict) else None


def restart_timed(broker: R.CommandBroker, queue: str, n: int, timeout: float) -> dict:
    """kill -9, start again; seconds from the new process's start to listening and to depth n."""
    cal = R.calibrate()
    broker.kill()
    m0, own0, t0 = R.machine_busy_ticks(), sum(os.times()[:2]), time.monotonic()
    broker.start()  # returns once the port accepts connections
    listening = time.monotonic() - t0
    depth = None
    while time.monotonic() - t0 < timeout:
        depth = queue_depth(broker, queue)
        if depth == n:
            break
        time.sleep(0.02)
    wall = time.monotonic() - t0
    full = wall if depth == n else None
    said = re.findall(r"recovered .* messages .* in ([0-9.]+) s", broker.log_tail(200))
    # other load: the machine's busy time less the new broker's CPU and this script's polling
    broker_s = sum(t for t, _ in R.cpu_ticks(R.proc_tree(broker.pid)).values()) / R.CLK_TCK
    other = (R.machine_busy_ticks() - m0) / R.CLK_TCK - broker_s - (sum(os.times()[:2]) - own0)
    return {"listening_s": listening, "depth_s": full, "depth": depth,
            "logged_s": float(said[-1]) if said else None, "rss_mb": rss_mb(broker.pid),
            "calibration_ms": cal, "other_load_cores": max(0.0, other) / wall}


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def recovery(args) -> dict:
    broker = R.CommandBroker(R.DEFAULT_HAQUEUE_CMD, "haqueue single broker (recovery)", None, args.startup_timeout)
    queue, n = "bench-recovery", args.recovery
    out: dict = {"messages": n, "reps": []}
    try:
        broker.start()
        t0 = time.monotonic()
        log(f"filling {queue} with {n} {'durable ' if args.durable else ''}{args.size}-byte messages")
        p = produce(broker, queue, n, args)
        out["fill_s"], out["fill_rate"] = time.monotonic() - t0, p.get("settle_rate")
        out["depth_before"] = queue_depth(broker, queue)
        out["journal_mb"] = sum(f.stat().st_size for f in Path(broker.data_dir).rglob("*.seg")) / 2**20
        log(f"filled in {out['fill_s']:.0f} s; depth {out['depth_before']}, journal {out['journal_mb']:.0f} MiB")
        for i in range(args.recovery_reps):
            if args.quiet_wait > 0:
                R.wait_quiet(args.quiet_wait)
            r = restart_timed(broker, queue, n, args.startup_timeout + 60)
            log(f"restart {i + 1}: listening after {r['listening_s']:.2f} s, depth {r['depth']} after "
                f"{fmt(r['depth_s'], 2)} s (log says {r['logged_s']} s), RSS {fmt(r['rss_mb'])} MB")
            out["reps"].append(r)
    finally:
        out["log"] = str(broker.log_path)
        broker.stop()
    return out


def markdown_recovery(rec: dict, args) -> str:
    reps, command = rec["reps"], rec["command"]
    depth_s = [r["depth_s"] for r in reps]
    lines = [f"## Recovery of {rec['messages']:,} queued messages (bench/interleave.py), {rec['date']}", "",
             "```", command, "```", "", machine_line(args, rec.get("commit", "not recorded")),
             f"One haqueue broker filled by the rhea producer (no consumer) in {rec['fill_s']:.0f} s "
             f"({fmt(rec.get('fill_rate'))} msg/s); journal {rec['journal_mb']:.0f} MiB; then kill -9 and a restart, "
             f"{len(reps)} times. Times from the new process's start; other load = cores used during the restart by "
             f"everything but the broker and this script; calibration just before the kill.", "",
             "| restart | listening (s) | queue depth back (s) | broker's log: recovered in (s) | depth | RSS MB | "
             "other load (cores) | calibration ms |", "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(reps):
        lines.append(f"| {i + 1} | {r['listening_s']:.2f} | {fmt(r['depth_s'], 2)} | {fmt(r['logged_s'], 2)} | "
                     f"{r['depth']} | {fmt(r['rss_mb'])} | {fmt(r.get('other_load_cores'), 2)} | "
                     f"{fmt(r.get('calibration_ms'), 1)} |")
    if args.target_recovery and reps:
        lines += ["", f"Target: recovery of {rec['messages']:,} messages ≤ {args.target_recovery:g} s: "
                  f"{med_range(depth_s, 2)} s, "
                  + verdict([x if x is not None else float('inf') for x in depth_s], args.target_recovery, False, "restarts") + "."]
    return "\n".join(lines) + "\n\n"


# ---------------------------------------------------------------- main

def now() -> str:
    return f"{_dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"


def report(ap: argparse.ArgumentParser, args) -> int:
    run = json.loads(Path(args.report).read_text())
    saved = ap.parse_args(shlex.split(run["command"])[2:])  # "python bench/interleave.py ..."
    for key in ("baseline", "target_ratio", "target_p99", "target_recovery"):
        if getattr(args, key) not in (None, ap.get_default(key)):
            setattr(saved, key, getattr(args, key))
    saved.durable = saved.durable or "reps" in run  # a recovery run always sends durable messages
    saved.priorities = header_priorities(setup_specs(saved.setups))
    print(markdown_recovery(run, saved) if "reps" in run else markdown(run, saved), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setups", help="comma-separated set-ups (see above); the last is the baseline")
    ap.add_argument("--baseline", help="the set-up the others are divided by (default: the last)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--messages", type=int, default=100000, help="messages per saturation run (default 100000)")
    ap.add_argument("--size", type=int, default=100, help="body bytes (default 100)")
    ap.add_argument("--durable", action="store_true", help="header.durable=true on every message")
    ap.add_argument("--pairs", type=int, default=1, help="saturation through this many queues at once, each with "
                                                         "its own producer and consumer process (default 1)")
    ap.add_argument("--no-latency", dest="latency", action="store_false", help="saturation runs only")
    ap.add_argument("--clients", choices=["rhea", "c"], default="rhea",
                    help="the clients of every run: rhea (bench/js), or the C clients (bench/c_clients), whose CPU "
                         "per message is a few percent of rhea's, for set-ups bounded by the clients")
    ap.add_argument("--rate", type=float, default=1000, help="msg/s of the latency run (default 1000)")
    ap.add_argument("--duration", type=float, default=10, help="seconds of the latency run (default 10)")
    ap.add_argument("--inflight", type=int, default=1000)
    ap.add_argument("--credit", type=int, default=1000)
    ap.add_argument("--floor", choices=sorted(FLOOR_BACKUPS), help="each round also runs bench/floor/relay.c at --rate "
                    "(alone, or with two backups), and the report gives every set-up's CPU at that rate as a multiple "
                    "of the floor's in the same round (100-byte bodies)")
    ap.add_argument("--together", action="store_true", help="run the set-ups of a round at the same time, each with its "
                    "own clients (saturation runs, then fixed-rate runs): on a machine others load, both sides of a "
                    "comparison see the same minutes; each then has about half the cores, and other load counts the "
                    "other set-up")
    ap.add_argument("--target-ratio", type=float, help="report whether msg/s ≥ this × the baseline's")
    ap.add_argument("--target-p99", type=float, help="report whether p99 (ms) at --rate ≤ this, for non-baselines")
    ap.add_argument("--recovery", type=int, metavar="N", help="measure the recovery of N queued messages instead")
    ap.add_argument("--recovery-reps", type=int, default=3)
    ap.add_argument("--target-recovery", type=float, default=5.0, help="seconds (default 5)")
    ap.add_argument("--initial-wait", type=float, default=300, help="wait up to this long at the start for a quiet machine")
    ap.add_argument("--quiet-wait", type=float, default=20, help="before each run, wait up to this long (run.py's wait_quiet)")
    ap.add_argument("--startup-timeout", type=float, default=60)
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    ap.add_argument("--report", metavar="JSON", help="render a run saved in bench/out again (its own command's "
                    "options; --target-* and --baseline of this command if given) and print it")
    args = ap.parse_args(argv)
    if args.report:
        return report(ap, args)
    specs = setup_specs(args.setups)
    args.priorities = header_priorities(specs)
    if not args.recovery and len(specs) < 2:
        ap.error("name at least two --setups (or --recovery N)")
    if args.baseline and args.baseline not in specs:
        ap.error("--baseline must be one of --setups")
    if args.floor and (not args.latency or args.size != 100 or args.recovery):
        ap.error("--floor compares the fixed-rate runs of 100-byte messages: not with --no-latency, --size or --recovery")
    if not (R.JS / "node_modules" / "rhea").exists():
        R.run_cmd(["npm", "install", "--no-audit", "--no-fund"], timeout=300, cwd=R.JS)
    command = "python bench/interleave.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    R.OUT.mkdir(exist_ok=True)
    if args.initial_wait > 0:
        R.wait_quiet(args.initial_wait, threshold=0.5, window=5)
    if args.together:
        args.quiet_wait = 0  # the other set-ups are the load
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if args.recovery:
        args.durable = True  # what recovers is durable messages
        rec = recovery(args)
        rec.update(command=command, date=now(), commit=tree_commit())
        (R.OUT / f"recovery-{stamp}.json").write_text(json.dumps(rec, indent=1, default=str))
        md = markdown_recovery(rec, args)
    else:
        load0 = R.loadavg()
        brokers = start_all(specs, args)
        try:
            results = interleave(brokers, args)
        finally:
            stop_all(brokers)
        run = {"command": command, "date": now(), "commit": tree_commit(), "load": [load0, R.loadavg()],
               "labels": {spec: b.label for spec, b in brokers.items()}, "results": results}
        (R.OUT / f"interleave-{stamp}.json").write_text(json.dumps(run, indent=1, default=str))
        md = markdown(run, args)
    R.print_and_record(md, args.no_record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
