#!/usr/bin/env python3
"""Scale benchmark (issue #26): thousands of queues and thousands of connections, haqueue against RabbitMQ,
interleaved as bench/interleave.py does (this machine's speed drifts, so set-ups are compared round by
round: each round runs every set-up once per size, in an order rotated every round, and the report gives
the median and min–max range of the ratios of the first set-up to each other one).

Set-ups (--setups; each turn starts a fresh one and stops it afterwards):
  haqueue          `haqueue cluster up --size 3` of this tree, default settings (bench/setups.py HaCluster)
  haqueue@DIR      the same of another tree (git archive COMMIT | tar -x -C DIR, built as interleave.py's old:DIR)
  rabbit-classic   one RabbitMQ node (a node name and data dir of its own), durable classic queues
  rabbit-quorum    three RabbitMQ nodes (bench/setups.py RabbitCluster), durable quorum queues of 3

--queues N,...: N durable queues declared (haqueue: $management CREATE on the public address, --window
requests in flight, bench/scale_amqp.py; RabbitMQ: pika, --window channels each with one declare in
flight, bench/scale_pika.py); then --per-queue durable --size-byte messages per queue, round robin over the
queues, at most --inflight unconfirmed (haqueue: one connection, the anonymous relay, an address per
message, counted when settled `accepted`; RabbitMQ: pika with publisher confirms): declare seconds, fill
msg/s, RSS per queue (the primary's or the first node's RSS after declare + fill, less before, / N; and the
same over all the set-up's processes), the client's and the brokers' CPU. haqueue only: every broker's
queue and message count (READ of each queue, as the `ha` admin tool; a mismatch is reported loudly), then
--kills times kill -9 of the primary: seconds until a publish through the public address is confirmed
(failover) and until the old primary, restarted by the supervisor, is a `ready` backup again (catch-up); then
kill -9 of all three brokers at once: seconds until a publish is confirmed again (restart); and the counts
again. The publish is measured as an outside client sees it: a stock proton BlockingConnection per try (its
SSL contexts included), each try's own time counted in full (one a busy new primary holds counts up to its
PROBE_TRY timeout), 50 ms between tries, to a durable queue declared just before (the last of the wiring: the
last a backup re-subscribes to). RabbitMQ: the message count of `rabbitmqctl list_queues`.

--connections N,...: N idle connections to the primary (RabbitMQ: the first node), each with one receiving
link on one queue (tests/many_connections.py): admitted, RSS per admitted connection, and the brokers' CPU
while they idle for --idle seconds.

--storm N,...: haqueue only, a fresh cluster per size: N connections opened at once to the public address by
bench/c_clients/storm.c (every connect issued at once, each speaking as soon as connected), then by stock
proton Python clients split over --storm-processes processes (py_clients.py storm; proton's reconnect opens
again what the broker closes): admitted, seconds to the last admission, the brokers' CPU; then --reconnect C
clients connected, kill -9 of the primary, and seconds from the kill until every one was admitted again by
the new primary (each retries 50 ms after its loss, then every 50 ms).

Every wait is bounded (--wait seconds, for declare, fill and counts per 1,000 queues); a failover or a
catch-up not done within it is reported as such. Appends a section to bench/RESULTS.md (unless --no-record);
the run's JSON goes to bench/out/scale-*.json.

    python bench/scale.py --queues 1000,3000,10000 --connections 1000,10000 --rounds 3
    python bench/scale.py --setups haqueue --queues 3000 --connections '' --rounds 1 --no-record
    python bench/scale.py --setups haqueue --queues 10000 --connections '' --kills 3 --rounds 4
    python bench/scale.py --setups haqueue --queues '' --connections '' --storm 10000 --rounds 4
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from proton import Message, ProtonException
from proton.utils import BlockingConnection

sys.path.insert(0, str(Path(__file__).resolve().parent))
import interleave as I  # noqa: E402  bench/interleave.py: its figures' helpers
import run as R  # noqa: E402
import scale_amqp as A  # noqa: E402
import scale_pika as P  # noqa: E402
import setups as S  # noqa: E402

sys.path.insert(0, str(R.REPO / "tests"))
from many_connections import IdleConnections  # noqa: E402

HOST = R.HOST
log = R.log
SETUPS = ("haqueue", "rabbit-classic", "rabbit-quorum")
RABBIT_ARGS: dict[str, dict[str, Any]] = {
    "rabbit-classic": {"x-queue-type": "classic"},
    "rabbit-quorum": {"x-queue-type": "quorum", "x-quorum-initial-group-size": 3}}
IDLE_QUEUE = "scale-idle"
PROBE_QUEUE = "scale-probe"  # the failover's publish goes here, outside the counted queues
TARGET_DECLARES_PER_S = 500  # 10,000 queues in ≤ 20 s
TARGET_FAILOVER_S = 2.0
TARGET_RESTART_S = 5.0
PROBE_TRY = 10.0  # seconds one try of the probe may take (a stock client waits as long as the broker holds it)


# ---------------------------------------------------------------- set-ups

class RabbitNode(R.RabbitBroker):
    """run.py's RabbitMQ node under a node name and data dir of its own: every turn starts empty, and no
    other session's node is taken for it."""

    def __init__(self) -> None:
        super().__init__(None)
        self.base = tempfile.mkdtemp(prefix="rabbit-scale-")
        os.chmod(self.base, 0o755)
        shutil.chown(self.base, "rabbitmq", "rabbitmq")  # the server runs as rabbitmq
        self.env.update(RABBITMQ_NODENAME=f"scale{uuid.uuid4().hex[:6]}@{socket.gethostname().split('.')[0]}",
                        RABBITMQ_MNESIA_BASE=f"{self.base}/mnesia", RABBITMQ_LOG_BASE=f"{self.base}/log")

    def ctl(self, i: int, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        """RabbitCluster's ctl, for its only node."""
        return self._ctl(*args, timeout=timeout, check=check)

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.base, ignore_errors=True)


def rabbit_descriptors() -> str:
    """RabbitMQ started here goes through su, which leaves it 1,024 descriptors (its socket limit is then 829,
    and more connections wait unanswered) where Debian's systemd unit gives 65,536: an env file of our own,
    sourced by rabbitmq-server as /etc/rabbitmq/rabbitmq-env.conf would be, raises the soft limit to the hard."""
    directory = tempfile.mkdtemp(prefix="rabbit-scale-env-")
    os.chmod(directory, 0o755)
    path = Path(directory, "rabbitmq-env.conf")
    path.write_text('ulimit -n "$(ulimit -Hn)"\n')
    path.chmod(0o644)
    os.environ["RABBITMQ_CONF_ENV_FILE"] = str(path)  # the set-ups pass our environment on
    return directory


def is_haqueue(spec: str) -> bool:
    return spec == "haqueue" or spec.startswith("haqueue@")


def make_setup(spec: str) -> S.HaCluster | RabbitNode | S.RabbitCluster:
    if spec == "haqueue":
        return S.HaCluster("haqueue primary + 2 backups")
    if is_haqueue(spec):
        tree = spec.partition("@")[2]
        return S.HaCluster(f"haqueue of {tree}, primary + 2 backups", tree=Path(tree))
    if spec == "rabbit-classic":
        return RabbitNode()
    if spec == "rabbit-quorum":
        return S.RabbitCluster()
    raise ValueError(f"unknown set-up {spec!r} (one of {', '.join(SETUPS)})")


def processes(b: R.Broker) -> dict[str, int]:
    """The set-up's broker processes by name; the first is the one clients use (a cluster's primary)."""
    if isinstance(b, S.HaCluster):
        members = b.members()
        first = (b.primary() or ("", 0))[0]
        return {n: members[n] for n in sorted(members, key=lambda n: n != first)}
    if isinstance(b, S.RabbitCluster):
        return {f"node{i + 1}": p for i, p in enumerate(b.pids)}
    return {"node": b.pid}


def rss(b: R.Broker) -> dict[str, float]:
    """MB of RSS of each broker process, the one clients use first."""
    return {name: I.rss_mb(pid) or 0.0 for name, pid in processes(b).items()}


def descriptors(pid: int) -> int | None:
    """The soft limit of open files of a process: what caps its connections."""
    try:
        limits = Path(f"/proc/{pid}/limits").read_text().splitlines()
        line = next(x for x in limits if x.startswith("Max open files"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[3])


def per_item_kb(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float | None]:
    """RSS growth per item (KB): of the process clients use, if it is still the same one, and of all."""
    first = next(iter(after), "")
    main = (after[first] - before[first]) * 1024 / n if n and first == next(iter(before), "") else None
    return {"main": main, "all": (sum(after.values()) - sum(before.values())) * 1024 / n if n else None}


def bound(args: argparse.Namespace, n: int) -> float:
    """Seconds a phase over n queues may take."""
    return args.wait * max(1.0, n / 1000)


# ---------------------------------------------------------------- phases

def timed(b: R.Broker, work: Callable[[], dict]) -> dict:
    """work()'s result, with the CPU seconds of this thread (the client) and of the set-up's processes."""
    meter = R.CpuMeter(b)
    meter.start()
    c0 = time.thread_time()
    try:
        out = work()
    finally:
        client = time.thread_time() - c0
        cpu = meter.stop()
    return {**out, "client_cpu_s": client, "broker_cpu_s": cpu["cpu_us_tree"] / 1e6,
            "per_process_cpu_s": {k: v / 1e6 for k, v in cpu["per_process_us"].items()},
            **({"watched": cpu["watched"]} if "watched" in cpu else {})}


def declare(spec: str, b: R.Broker, names: list[str], args: argparse.Namespace) -> dict:
    if spec in RABBIT_ARGS:
        return P.declare(b.port, names, RABBIT_ARGS[spec], args.window, bound(args, len(names)))
    t0 = time.monotonic()
    try:
        answers = A.manage(f"{HOST}:{b.port}", [("CREATE", "queue", q, {}) for q in names], args.window,
                           bound(args, len(names)))
    except (A.AmqpFailure, OSError) as e:
        return {"declared": 0, "seconds": time.monotonic() - t0, "error": str(e)}
    refused = sorted({f"{code} {desc}" for code, desc, _ in answers if code >= 300})
    return {"declared": sum(code < 300 for code, _, _ in answers), "seconds": time.monotonic() - t0,
            **({"error": "refused: " + "; ".join(refused[:3])} if refused else {})}


def fill(spec: str, b: R.Broker, names: list[str], args: argparse.Namespace) -> dict:
    limit = bound(args, len(names))
    if spec in RABBIT_ARGS:
        return P.publish(b.port, names, args.per_queue, args.size, args.inflight, limit)
    messages = [A.relay_message(q, args.size) for q in names] * args.per_queue  # round robin over the queues
    try:
        return A.publish(f"{HOST}:{b.port}", messages, args.inflight, limit)
    except OSError as e:
        return {"sent": 0, "outcomes": {}, "seconds": 0.0, "error": str(e)}


def haqueue_counts(b: S.HaCluster, names: list[str], per_queue: int, args: argparse.Namespace) -> dict:
    """Each broker's view of the queues (READ of each, as the `ha` admin tool): present, messages, and the
    first of those whose depth is not per_queue."""
    out = {}
    for i in range(b.size):
        status = b.status(i) or {}
        view: dict[str, Any] = {"role": status.get("role"), "state": status.get("state")}
        try:
            answers = A.manage(b.endpoint(i), [("READ", "queue", q, None) for q in names], args.window,
                               bound(args, len(names)), "ha", b.password)
        except (A.AmqpFailure, OSError) as e:
            out[f"broker-{i}"] = {**view, "error": str(e)}
            continue
        depths = {q: body["depth"] for q, (code, _, body) in zip(names, answers) if code < 300}
        wrong = [q for q in names if depths.get(q) != per_queue]
        out[f"broker-{i}"] = {**view, "queues": len(depths), "messages": sum(depths.values()),
                              "wrong": len(wrong), "first_wrong": [(q, depths.get(q)) for q in wrong[:4]]}
    return out


def mismatches(counts: dict, n: int, per_queue: int) -> list[str]:
    return [f"{name} ({v.get('role')}, {v.get('state')}): " + (v["error"] if "error" in v else
            f"{v['queues']} queues, {v['messages']} messages; {v['wrong']} queues without {per_queue}, first "
            + ", ".join(f"{q}={d}" for q, d in v["first_wrong"]))
            for name, v in counts.items() if "error" in v or v["queues"] != n or v["messages"] != n * per_queue]


def rabbit_counts(b: RabbitNode | S.RabbitCluster, names: list[str], per_queue: int, timeout: float) -> dict:
    """`rabbitmqctl list_queues`: our queues and their messages, asked again (up to `timeout`) until every
    message shows, as a quorum queue's count comes from metrics a few seconds old."""
    wanted, deadline = set(names), time.monotonic() + timeout
    while True:
        lines = b.ctl(0, "list_queues", "-q", "--no-table-headers", "name", "messages", timeout=timeout).stdout
        rows = (line.split() for line in lines.splitlines())
        depths = [int(f[1]) for f in rows if len(f) == 2 and f[0] in wanted]
        if sum(depths) == len(names) * per_queue or time.monotonic() > deadline:
            return {"node1": {"queues": len(depths), "messages": sum(depths)}}
        time.sleep(1)


def probe_once(public: str, timeout: float) -> None:
    """One durable publish to PROBE_QUEUE as a stock proton client makes it; raises unless it is accepted."""
    conn = BlockingConnection(f"amqp://{public}", timeout=timeout)
    try:
        conn.create_sender(PROBE_QUEUE).send(Message(body=b"x" * 100, durable=True))
    finally:
        try:
            conn.close()
        except ProtonException:
            pass  # the broker went away meanwhile: nothing to tidy


def accepted_publish(public: str, deadline: float) -> tuple[float | None, int, str]:
    """Publish to PROBE_QUEUE through `public` until a publish is confirmed or the deadline passes, a try at a
    time, each try's own time counted: (when, attempts, the last failure)."""
    attempts, last = 0, ""
    while time.monotonic() < deadline:
        attempts += 1
        try:
            probe_once(public, min(PROBE_TRY, max(deadline - time.monotonic(), 0.1)))
            return time.monotonic(), attempts, last
        except (ProtonException, OSError) as e:
            last = str(e)
        time.sleep(0.05)  # an outside client's pace between tries
    return None, attempts, last


def wait_ready_again(b: S.HaCluster, index: int, deadline: float) -> float | None:
    """When broker `index` is a ready backup (None: not before the deadline)."""
    while time.monotonic() < deadline:
        st = b.status(index, timeout=1.0) or {}
        if st.get("role") == "backup" and st.get("state") == "ready":
            return time.monotonic()
        time.sleep(0.1)
    return None


def declare_probe(b: S.HaCluster, args: argparse.Namespace) -> str | None:
    """PROBE_QUEUE declared (once: later calls find it); why not, if it could not be."""
    try:
        A.manage(f"{HOST}:{b.port}", [("CREATE", "queue", PROBE_QUEUE, {})], 1, args.wait)
        return None
    except (A.AmqpFailure, OSError) as e:
        return f"cannot declare {PROBE_QUEUE}: {e}"


def failover(b: S.HaCluster, n: int, args: argparse.Namespace) -> dict:
    """kill -9 of the primary: seconds to a publish confirmed by the new primary, and to the old one ready."""
    primary = b.primary()
    if primary is None:
        return {"error": "no primary before the kill"}
    name, pid = primary
    public = f"{HOST}:{b.port}"
    log(f"  kill -9 {name} (pid {pid})")
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    confirmed, attempts, last = accepted_publish(public, t0 + args.wait)
    ready = wait_ready_again(b, int(name.split("-")[1]), t0 + bound(args, n))
    out = {"killed": name, "failover_s": confirmed - t0 if confirmed else None, "probe_attempts": attempts,
           "catchup_s": ready - t0 if ready else None, "new_primary": (b.primary() or ("none",))[0]}
    if confirmed is None:
        out["error"] = f"no publish accepted within {args.wait:g} s ({attempts} attempts, last: {last})"
    elif ready is None:
        out["error"] = f"{name} not a ready backup within {bound(args, n):g} s"
    if "error" in out:
        out["supervisor"] = b.describe_failure()
    return out


def restart(b: S.HaCluster, n: int, args: argparse.Namespace) -> dict:
    """kill -9 of every broker at once: seconds until the supervisor has them back and a publish is confirmed."""
    members = b.members()
    log(f"  kill -9 of every broker ({', '.join(f'{k} {v}' for k, v in members.items())})")
    t0 = time.monotonic()
    for pid in members.values():
        os.kill(pid, signal.SIGKILL)
    confirmed, attempts, last = accepted_publish(f"{HOST}:{b.port}", t0 + bound(args, n))
    out: dict[str, Any] = {"restart_s": confirmed - t0 if confirmed else None, "probe_attempts": attempts}
    if confirmed is None:
        out["error"] = f"no publish confirmed within {bound(args, n):g} s ({attempts} attempts, last: {last})"
        out["supervisor"] = b.describe_failure()
    return out


# ---------------------------------------------------------------- storms

def c_storm(port: int, n: int, timeout: float, reconnect_for: float = 0) -> subprocess.Popen:
    binary = R.compiled(R.BENCH / "c_clients" / "storm.c", "c-storm")
    cmd = [str(binary), "--port", str(port), "--connections", str(n), "--timeout", str(timeout)]
    return subprocess.Popen(cmd + (["--reconnect-for", str(reconnect_for)] if reconnect_for else []),
                            stdout=subprocess.PIPE, text=True)


def storm_c(b: R.Broker, n: int, args: argparse.Namespace) -> dict:
    """n connections at once from C clients: admitted, seconds to the last admission."""
    out, _ = c_storm(b.port, n, args.wait).communicate(timeout=args.wait + 30)
    return json.loads(out.splitlines()[0])


def storm_python(b: R.Broker, n: int, args: argparse.Namespace) -> dict:
    """n connections at once from stock proton Python clients, split over --storm-processes processes."""
    share = -(-n // args.storm_processes)
    procs = [subprocess.Popen([str(R.VENV_PY), str(R.BENCH / "py_clients.py"), "storm", "--port", str(b.port),
                               "--connections", str(min(share, n - i * share)), "--timeout", str(args.wait)],
                              stdout=subprocess.PIPE, text=True) for i in range(args.storm_processes) if i * share < n]
    runs = []
    for proc in procs:
        try:
            runs.append(json.loads(proc.communicate(timeout=args.wait + 30)[0].splitlines()[-1]))
        except (subprocess.TimeoutExpired, IndexError, ValueError):  # no result: its connections count as not admitted
            proc.kill()
            proc.wait()
    last = [r["last_s"] for r in runs if r["last_s"] is not None]
    return {"connections": n, "processes": len(procs), "no_result": len(procs) - len(runs),
            "admitted": sum(r["admitted"] for r in runs),
            "closed": sum(r["closed"] for r in runs), "last_s": max(last) if last else None,
            "client_cpu_s": sum(r["cpu_us"] for r in runs) / 1e6}


def reconnects(b: S.HaCluster, n: int, args: argparse.Namespace) -> dict:
    """n C clients connected, kill -9 of the primary: seconds until every one is admitted again."""
    proc = c_storm(b.port, n, args.wait, reconnect_for=args.wait)
    assert proc.stdout is not None
    opened = json.loads(proc.stdout.readline())
    primary = b.primary()
    if primary is None or opened["admitted"] != n:
        proc.kill()
        proc.wait()
        return {"error": f"before the kill: {opened['admitted']} of {n} admitted, primary {primary}"}
    t0 = time.monotonic()
    os.kill(primary[1], signal.SIGKILL)
    back = json.loads(proc.communicate(timeout=args.wait + 30)[0].splitlines()[-1])
    out = {"clients": n, "dropped": back["dropped"], "reconnected": back["reconnected"],
           "all_back_s": back["last_admitted"] - t0 if back["reconnected"] == back["dropped"] == n else None}
    if out["all_back_s"] is None:
        out["error"] = f"{back['reconnected']} of {back['dropped']} dropped clients back (of {n})"
    return out


def storm_turn(spec: str, b: R.Broker, n: int, args: argparse.Namespace) -> dict:
    if not isinstance(b, S.HaCluster):
        return {"error": "storms are measured on haqueue only"}
    out: dict[str, Any] = {"c": timed(b, lambda: storm_c(b, n, args))}
    b.wait_ready(args.wait)  # the C clients are gone: the next storm meets a broker that has closed them
    out["python"] = timed(b, lambda: storm_python(b, n, args))
    b.wait_ready(args.wait)
    if args.reconnect:
        out["reconnect"] = reconnects(b, args.reconnect, args)
    c, py, rc = out["c"], out["python"], out.get("reconnect", {})
    log(f"  storm of {n}: C {c['admitted']} admitted in {I.fmt(c['last_s'], 2)} s (brokers' CPU "
        f"{c['broker_cpu_s']:.2f} s); Python over {py['processes']} processes {py['admitted']} in "
        f"{I.fmt(py['last_s'], 1)} s ({py['closed']} closed and retried); after a failover "
        f"{rc.get('reconnected')} of {args.reconnect} back in {I.fmt(rc.get('all_back_s'), 2)} s")
    return out


# ---------------------------------------------------------------- turns

def queue_turn(spec: str, b: R.Broker, n: int, args: argparse.Namespace) -> dict:
    names = [f"scale-{i:05d}" for i in range(n)]
    out: dict[str, Any] = {"rss_mb": {"start": rss(b)}}
    out["declare"] = timed(b, lambda: declare(spec, b, names, args))
    out["rss_mb"]["declared"] = rss(b)
    out["fill"] = timed(b, lambda: fill(spec, b, names, args))
    out["rss_mb"]["filled"] = rss(b)
    out["rss_per_queue_kb"] = per_item_kb(out["rss_mb"]["start"], out["rss_mb"]["filled"], n)
    d, f = out["declare"], out["fill"]
    log(f"  {spec} {n} queues: declared {d['declared']} in {I.fmt(d['seconds'], 2)} s; filled "
        f"{f['outcomes'].get('accepted', 0)}/{n * args.per_queue} in {I.fmt(f['seconds'], 2)} s; RSS/queue "
        f"{I.fmt(out['rss_per_queue_kb']['main'], 1)} KB" + "".join(f"; {k} {x['error']}" for k, x in (
            ("declare", d), ("fill", f)) if "error" in x))
    if isinstance(b, (RabbitNode, S.RabbitCluster)):
        out["counts"] = rabbit_counts(b, names, args.per_queue, args.wait)
    if not isinstance(b, S.HaCluster):
        return out
    try:
        b.wait_ready(bound(args, n))
    except RuntimeError as e:
        out["not_ready"] = str(e)
    out["counts"] = haqueue_counts(b, names, args.per_queue, args)
    out["failovers"] = []
    probe_error = declare_probe(b, args)
    for kill in range(args.kills if probe_error is None else 0):
        if kill:
            b.wait_ready(bound(args, n))
        fo = failover(b, n, args)
        out["failovers"].append(fo)
        log(f"  failover {I.fmt(fo.get('failover_s'), 2)} s, catch-up {I.fmt(fo.get('catchup_s'), 2)} s"
            + (f": {fo['error']}" if "error" in fo else ""))
    if probe_error is not None:
        out["failovers"].append({"error": probe_error})
    elif args.restart:
        b.wait_ready(bound(args, n))
        out["restart"] = restart(b, n, args)
        log(f"  whole-cluster restart {I.fmt(out['restart'].get('restart_s'), 2)} s")
        b.wait_ready(bound(args, n))
    out["counts_after_failover"] = haqueue_counts(b, names, args.per_queue, args)
    for when in ("counts", "counts_after_failover"):
        for line in mismatches(out[when], n, args.per_queue):
            log(f"  MISMATCH ({when}): {line}")
    return out


def connection_turn(spec: str, b: R.Broker, n: int, args: argparse.Namespace) -> dict:
    if spec in RABBIT_ARGS:
        P.declare(b.port, [IDLE_QUEUE], RABBIT_ARGS[spec], 1, args.wait)
    else:
        A.manage(f"{HOST}:{b.port}", [("CREATE", "queue", IDLE_QUEUE, {})], 1, args.wait)
    before = rss(b)
    pids = list(processes(b).values())
    address = b.address(IDLE_QUEUE)
    with IdleConnections(HOST, b.port, address=address, timeout=args.wait) as crowd:
        opened = crowd.open(n)
        after = rss(b)
        t0, cpu0 = time.monotonic(), R.cpu_ticks(pids)
        time.sleep(args.idle)  # the connections idle: only heartbeats go either way
        cpu1, wall = R.cpu_ticks(pids), time.monotonic() - t0
        held = len(crowd)
    idle = [100 * (cpu1[p][0] - cpu0[p][0]) / R.CLK_TCK / wall if p in cpu0 and p in cpu1 else None for p in pids]
    out = {"admitted": opened.admitted, "held_after_idle": held, "open_s": opened.seconds,
           "fd_limit": descriptors(pids[0]), "refused": dict(opened.refused.most_common(3)),
           "rss_mb": {"start": before, "open": after},
           "rss_per_connection_kb": per_item_kb(before, after, opened.admitted),
           "idle_cpu_pct": {"main": idle[0], "all": sum(x or 0.0 for x in idle)}}
    log(f"  {spec} {n} connections: admitted {opened.admitted} in {opened.seconds:.1f} s, held {held}; "
        f"RSS/connection {I.fmt(out['rss_per_connection_kb']['main'], 1)} KB; idle CPU {I.fmt(idle[0], 1)} %"
        + (f"; refused {out['refused']}" if opened.refused else ""))
    return out


def turn(spec: str, kind: str, n: int, args: argparse.Namespace) -> dict:
    """One set-up, fresh, for one size: started, measured, stopped (its failure is the turn's result)."""
    if args.quiet_wait > 0:
        R.wait_quiet(args.quiet_wait)
    b = make_setup(spec)
    try:
        b.start()
        out = {"queues": queue_turn, "connections": connection_turn, "storm": storm_turn}[kind](spec, b, n, args)
        out["label"] = b.label
        return out
    except Exception as e:  # the next set-ups still run; the report says what failed
        log(f"  {spec} {kind} {n}: FAILED: {e}")
        return {"label": b.label, "error": f"{type(e).__name__}: {e}"}
    finally:
        b.stop()


def rounds(specs: list[str], args: argparse.Namespace) -> dict[str, dict[str, dict[str, list[dict]]]]:
    """results[kind][n][spec]: one turn per round."""
    results: dict[str, dict[str, dict[str, list[dict]]]] = {}
    for i in range(args.rounds):
        order = R.rotated(specs, i)
        for kind in ("queues", "connections", "storm"):
            for n in getattr(args, kind):
                log(f"round {i + 1}/{args.rounds}, {n} {kind}: {', '.join(order)} (load average {R.loadavg()})")
                for spec in (order if kind != "storm" else [x for x in order if is_haqueue(x)]):
                    results.setdefault(kind, {}).setdefault(str(n), {}).setdefault(spec, []).append(
                        turn(spec, kind, n, args))
    return results


# ---------------------------------------------------------------- report

def value(t: dict, path: str) -> float | None:
    """A figure of a turn by its dotted path, or None (failed turn, figure not made)."""
    x: Any = t
    for key in path.split("."):
        x = x.get(key) if isinstance(x, dict) else None
    return x if isinstance(x, (int, float)) else None


FIGURES: dict[str, Callable[[dict], float | None]] = {  # a phase that failed has no figure (its error is listed)
    "declare_s": lambda t: value(t, "declare.seconds") if "error" not in t.get("declare", {"error": 1}) else None,
    "fill_rate": lambda t: (value(t, "fill.outcomes.accepted") or 0) / t["fill"]["seconds"]
    if "error" not in t.get("fill", {"error": 1}) and value(t, "fill.seconds") else None,
    "rss_q_main": lambda t: value(t, "rss_per_queue_kb.main"),
    "rss_q_all": lambda t: value(t, "rss_per_queue_kb.all"),
    "rss_c_main": lambda t: value(t, "rss_per_connection_kb.main"),
    "rss_c_all": lambda t: value(t, "rss_per_connection_kb.all"),
    "idle_main": lambda t: value(t, "idle_cpu_pct.main"),
    "failover_s": lambda t: median_of(kills([t], "failover_s")),
    "restart_s": lambda t: value(t, "restart.restart_s"),
}


def median_of(values: list[float | None]) -> float | None:
    """The median, or None if any is missing (a kill without a confirmed publish has no figure)."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known and len(known) == len(values) else None


def kills(turns: list[dict], figure: str) -> list[float | None]:
    """A figure of every kill of every round (failover_s, catchup_s); None where it was not made."""
    return [fo.get(figure) for t in turns for fo in t.get("failovers", [])]


def column(turns: list[dict], figure: str, d: int = 1) -> str:
    return I.med_range([FIGURES[figure](t) if "error" not in t else None for t in turns], d)


def ratio_list(a: list[dict], b: list[dict], figure: str) -> list[float]:
    """Round by round, a's figure over b's where both were made."""
    pairs = [(FIGURES[figure](x), FIGURES[figure](y)) for x, y in zip(a, b)
             if "error" not in x and "error" not in y]
    return [p / q for p, q in pairs if p is not None and q]


def counts_cell(turns: list[dict], n: int, per_queue: int) -> str:
    bad = [t for t in turns if "counts" not in t or any(
        mismatches(t[k], n, per_queue) for k in ("counts", "counts_after_failover") if k in t)]
    return f"match, {len(turns)} round(s)" if not bad else f"**MISMATCH in {len(bad)} of {len(turns)}**"


def med(turns: list[dict], path: str, d: int = 1) -> str:
    """Median (min–max) over the rounds of a figure named by its dotted path."""
    return I.med_range([value(t, path) for t in turns], d)


def queue_rows(by_spec: dict[str, list[dict]], n: int, args: argparse.Namespace) -> list[str]:
    rows = []
    for spec, turns in by_spec.items():
        ok = [t for t in turns if "error" not in t]
        if is_haqueue(spec):
            checks = f"{I.med_range(kills(ok, 'failover_s'), 2)} | {I.med_range(kills(ok, 'catchup_s'), 2)} | " \
                     f"{med(ok, 'restart.restart_s', 2)} | {counts_cell(ok, n, args.per_queue)}"
        else:
            checks = "— | — | — | " + " ".join(f"{value(t, 'counts.node1.queues')}/{value(t, 'counts.node1.messages')}"
                                          for t in ok)
        rows.append(f"| {ok[0]['label'] if ok else spec} (`{spec}`) | {n:,} | {column(turns, 'declare_s', 2)} | "
                    f"{column(turns, 'fill_rate', 0)} | {column(turns, 'rss_q_main')} | {column(turns, 'rss_q_all')} | "
                    f"{checks} | {med(ok, 'declare.client_cpu_s', 2)} / {med(ok, 'declare.broker_cpu_s', 2)} | "
                    f"{med(ok, 'fill.client_cpu_s', 2)} / {med(ok, 'fill.broker_cpu_s', 2)} |")
    return rows


def connection_rows(by_spec: dict[str, list[dict]], n: int) -> list[str]:
    rows = []
    for spec, turns in by_spec.items():
        ok = [t for t in turns if "error" not in t]
        refused = {k: v for t in ok for k, v in t["refused"].items()}
        rows.append(f"| {ok[0]['label'] if ok else spec} (`{spec}`) | {n:,} | {med(ok, 'admitted', 0)} | "
                    f"{med(ok, 'held_after_idle', 0)} | {med(ok, 'open_s')} | {med(ok, 'fd_limit', 0)} | "
                    f"{column(turns, 'rss_c_main')} | {column(turns, 'rss_c_all')} | {column(turns, 'idle_main', 2)} | "
                    f"{med(ok, 'idle_cpu_pct.all', 2)} | "
                    + ("; ".join(f"{k} ×{v}" for k, v in refused.items()) or "—") + " |")
    return rows


def ratio_table(results: dict, kind: str, figures: dict[str, str]) -> list[str]:
    """The first set-up over each other one, round by round, per size: median (min–max) [each round]."""
    rows = []
    for n, by_spec in results.get(kind, {}).items():
        first, *others = list(by_spec)
        for other in others:
            cells = []
            for figure in figures.values():
                r = ratio_list(by_spec[first], by_spec[other], figure)
                cells.append(f"{I.med_range([*r], 2)} [" + " ".join(f"{x:.2f}" for x in r) + "]")
            rows.append(f"| {int(n):,} | `{first}` / `{other}` | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return [f"| {kind} | ratio | " + " | ".join(figures) + " |", "|---|---|" + "---|" * len(figures), *rows, ""]


def targets(results: dict, args: argparse.Namespace) -> list[str]:
    """The issue's targets for haqueue, per size: met in every round, by the median only, or not."""
    rows = []
    for n, by_spec in results.get("queues", {}).items():
        turns = next((by_spec[spec] for spec in by_spec if is_haqueue(spec)), [])
        rate = [int(n) / s for s in (FIGURES["declare_s"](t) if "error" not in t else None for t in turns) if s]
        fo = kills(turns, "failover_s")
        restarts = [value(t, "restart.restart_s") for t in turns if "restart" in t]
        inf = float("inf")  # a kill or restart without a confirmed publish: a miss
        rows += [f"| {int(n):,} queues declared at ≥ {TARGET_DECLARES_PER_S}/s (10,000 in ≤ 20 s) | "
                 f"{I.med_range([*rate])}/s | {I.verdict(rate, TARGET_DECLARES_PER_S, True)} |",
                 f"| {int(n):,} queues: failover ≤ {TARGET_FAILOVER_S:g} s | {I.med_range(fo, 2)} s | "
                 f"{I.verdict([x if x is not None else inf for x in fo], TARGET_FAILOVER_S, False, 'kills')} |",
                 *([f"| {int(n):,} queues: whole-cluster restart ≤ {TARGET_RESTART_S:g} s | "
                    f"{I.med_range(restarts, 2)} s | "
                    f"{I.verdict([x if x is not None else inf for x in restarts], TARGET_RESTART_S, False)} |"]
                   if restarts else []),
                 f"| {int(n):,} queues: every broker holds every queue and message | — | "
                 f"{counts_cell(turns, int(n), args.per_queue)} |"]
    return rows


def turn_problems(t: dict, spec: str, n: int, per_queue: int) -> list[str]:
    """A turn's failures, count mismatches and the warnings its brokers logged while declaring and filling."""
    out = [e for e in [t.get("error")] + [t.get(k, {}).get("error") for k in ("declare", "fill", "restart")]
           + [fo.get("error") for fo in t.get("failovers", [])]
           + [t.get("storm", {}).get(k, {}).get("error") for k in ("c", "python", "reconnect")] if e]
    if t.get("not_ready"):
        out.append(f"not ready after the fill: {t['not_ready']}")
    if is_haqueue(spec):
        out += [f"**MISMATCH** ({when.replace('_', ' ')}): {m}" for when in ("counts", "counts_after_failover")
                for m in mismatches(t.get(when, {}), n, per_queue)]
    warnings = [w for k in ("declare", "fill") for w in t.get(k, {}).get("watched", {}).get("log_warnings", [])]
    if warnings:  # watch_stop keeps the first 50
        out.append(f"{len(warnings)}{'+' if len(warnings) >= 50 else ''} warning(s) logged during declare and fill, "
                   f"first: {warnings[0]}")
    return out


def problems(results: dict, args: argparse.Namespace) -> list[str]:
    return [f"{spec}, {int(n):,} {kind}, round {i + 1}: {p}" for kind, by_n in results.items()
            for n, by_spec in by_n.items() for spec, turns in by_spec.items() for i, t in enumerate(turns)
            for p in turn_problems(t, spec, int(n), args.per_queue)]


def markdown(run: dict, args: argparse.Namespace) -> str:
    results = run["results"]
    lines = [f"## Scale: {', '.join(f'{n:,}' for n in args.queues) or 'no'} queues, "
             f"{', '.join(f'{n:,}' for n in args.connections) or 'no'} connections"
             + (f", storms of {', '.join(f'{n:,}' for n in args.storm)}" if args.storm else "")
             + f" (bench/scale.py), {run['date']}", "",
             "```", run["command"], "```", "",
             f"haqueue of this tree at {run['commit']}, `cluster up --size 3` with default settings. Machine: "
             f"{os.cpu_count()} cores. {args.rounds} round(s); each runs every set-up once per size, fresh, in an "
             f"order rotated each round. Load average at the start {run['load'][0]}, at the end {run['load'][1]}.", ""]
    if results.get("queues"):
        lines += [f"Queues: declared with {args.window} requests in flight (haqueue: `$management` on the public "
                  f"address; RabbitMQ: pika, {args.window} channels), then {args.per_queue} durable {args.size}-byte "
                  f"messages per queue, ≤ {args.inflight} unconfirmed (haqueue: the anonymous relay; RabbitMQ: "
                  "publisher confirms). RSS per queue: after declare + fill less before, / N, of the primary "
                  "(RabbitMQ: the first node) and of all the set-up's processes. Failover: kill -9 of the primary "
                  "to a publish accepted through the public address; catch-up: to the old primary a ready backup "
                  "again. Counts: every broker's queues and messages, after the fill and after the failover. CPU: "
                  "the client's thread / all the set-up's processes. Medians, min–max in brackets.", "",
                  "| set-up | queues | declare s | fill msg/s | RSS/queue KB, primary | RSS/queue KB, all | "
                  "failover s (every kill) | catch-up s | restart s | counts | declare CPU s client / brokers | "
                  "fill CPU s client / brokers |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for n, by_spec in results["queues"].items():
            lines += queue_rows(by_spec, int(n), args)
        lines.append("")
    if results.get("connections"):
        lines += [f"Connections: idle, each with a receiver on one queue (tests/many_connections.py); RSS per admitted "
                  f"connection; CPU while they idled {args.idle:g} s, % of one core.", "",
                  "| set-up | asked | admitted | held after idling | open s | descriptors (soft limit) | "
                  "RSS/conn KB, primary | RSS/conn KB, all | idle CPU %, primary | idle CPU %, all | refusals |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for n, by_spec in results["connections"].items():
            lines += connection_rows(by_spec, int(n))
        lines.append("")
    if results.get("storm"):
        lines += [f"Storms (haqueue): N connections at once to the public address; C: bench/c_clients/storm.c; "
                  f"Python: stock proton Containers over {args.storm_processes} processes (proton's reconnect "
                  f"retries what the broker closes: `closed`); seconds to the last admission; the brokers' CPU over "
                  f"the storm. Reconnect: {args.reconnect} C clients connected, kill -9 of the primary, seconds "
                  f"until every one is admitted by the new primary. Median (min–max) over the rounds.", "",
                  "| set-up | connections | C admitted | C s | C brokers' CPU s | Python admitted | Python s | "
                  "Python closed and retried | reconnect: back | reconnect s |",
                  "|---|---|---|---|---|---|---|---|---|---|",
                  *[f"| `{spec}` | {int(n):,} | {med(ts, 'c.admitted', 0)} | {med(ts, 'c.last_s', 2)} | "
                    f"{med(ts, 'c.broker_cpu_s', 2)} | {med(ts, 'python.admitted', 0)} | "
                    f"{med(ts, 'python.last_s', 1)} | {med(ts, 'python.closed', 0)} | "
                    f"{med(ts, 'reconnect.reconnected', 0)} | {med(ts, 'reconnect.all_back_s', 2)} |"
                    for n, by_spec in results["storm"].items() for spec, ts in by_spec.items()], ""]
    ratios = ratio_table(results, "queues", {"declare s": "declare_s", "fill msg/s": "fill_rate",
                                             "RSS/queue, primary": "rss_q_main", "RSS/queue, all": "rss_q_all",
                                             "failover s": "failover_s", "restart s": "restart_s"}) \
        + ratio_table(results, "connections", {"RSS/conn, primary": "rss_c_main", "RSS/conn, all": "rss_c_all",
                                               "idle CPU, primary": "idle_main"})
    if ratios:
        lines += ["Ratios, round by round: median (min–max) [each round].", "", *ratios]
    if results.get("queues"):
        lines += ["Targets (issue #26):", "", "| target | value | verdict |", "|---|---|---|",
                  *targets(results, args), ""]
    seen = problems(results, args)
    if seen:
        lines += ["Problems seen:", "", *(f"- {p}".replace("\n", " / ") for p in seen), ""]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main

def save(run: dict, args: argparse.Namespace) -> None:
    """The run's JSON into bench/out; its section printed and, unless --no-record, appended to RESULTS.md."""
    path = R.OUT / f"scale-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(run, indent=1, default=str))
    section = markdown(run, args)
    print(section)
    if args.no_record:
        log(f"not recorded (--no-record); the run: {path}")
        return
    R.record(section)
    log(f"appended to {R.RESULTS}; the run: {path}")


def sizes(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setups", default=",".join(SETUPS), help="comma-separated; ratios are the first over each other")
    ap.add_argument("--queues", type=sizes, default=[1000, 3000, 10000], help="queue counts ('' for none)")
    ap.add_argument("--connections", type=sizes, default=[1000, 10000], help="connection counts ('' for none)")
    ap.add_argument("--storm", type=sizes, default=[], help="storm sizes: connections opened at once (haqueue)")
    ap.add_argument("--storm-processes", type=int, default=10, help="processes the Python storm is split over")
    ap.add_argument("--reconnect", type=int, default=1000, help="C clients reconnecting after a failover in a "
                                                                "storm turn (0: none)")
    ap.add_argument("--kills", type=int, default=1, help="failovers per queue turn (default 1)")
    ap.add_argument("--no-restart", dest="restart", action="store_false",
                    help="no whole-cluster restart after the failovers")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-queue", type=int, default=10, help="messages per queue (default 10)")
    ap.add_argument("--size", type=int, default=100, help="body bytes (default 100)")
    ap.add_argument("--window", type=int, default=500, help="declares in flight (default 500)")
    ap.add_argument("--inflight", type=int, default=1000, help="unconfirmed publishes (default 1000)")
    ap.add_argument("--idle", type=float, default=20, help="seconds the connections idle (default 20)")
    ap.add_argument("--wait", type=float, default=120, help="bound of each wait (declare, fill, counts and catch-up: "
                                                            "per 1,000 queues), default 120 s")
    ap.add_argument("--initial-wait", type=float, default=120, help="wait up to this long for a quiet machine first")
    ap.add_argument("--quiet-wait", type=float, default=20, help="before each turn, wait up to this long")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = ap.parse_args(argv)
    specs = [s.strip() for s in args.setups.split(",") if s.strip()]
    if not specs or any(spec not in SETUPS and not is_haqueue(spec) for spec in specs):
        ap.error(f"--setups: one or more of {', '.join(SETUPS)}, haqueue@DIR")
    command = "python bench/scale.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    R.OUT.mkdir(exist_ok=True)
    env_dir = rabbit_descriptors()
    if args.initial_wait > 0:
        R.wait_quiet(args.initial_wait, threshold=0.5, window=5)
    load0 = R.loadavg()
    try:
        results = rounds(specs, args)
    finally:
        shutil.rmtree(env_dir, ignore_errors=True)
    save({"command": command, "date": I.now(), "commit": I.tree_commit(), "load": [load0, R.loadavg()],
          "args": vars(args), "results": results}, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
