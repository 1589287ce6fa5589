#!/usr/bin/env python3
"""HA benchmark: failover and catch-up of a haqueue cluster.

Not part of the test suite. Throughput and latency of a cluster against RabbitMQ's 3-node quorum queue
are bench/interleave.py's (`--setups cluster,rabbit-quorum`), run round by round; the cluster set-up
itself (`haqueue cluster up`) is bench/setups.py's, shared by both. Uses bench/run.py for the clients;
bench/js (rhea 3.0.5) are the load clients. One run measures:

  1. failover of the haqueue cluster: a reconnecting rhea producer publishes --failover-rate msg/s to
     the public address; the primary is killed with SIGKILL; time from the kill to the first publish
     accepted on the connection to the new primary; --failover-reps times; then every message is
     consumed and the accepted-but-missing ones counted (must be 0);
  2. catch-up: two HA brokers (configs as the supervisor writes them), one promoted, --backlog
     messages put on a queue, live traffic (producer + consumer at --rate msg/s on another queue)
     started, then the second broker started as a backup; its `ha status` is polled until the queue
     is caught up: backlog messages per second.

Appends a markdown section to bench/RESULTS.md (unless --no-record); raw JSON and logs go to
bench/out/. Everything talks to 127.0.0.1 only; every wait is bounded; everything started here is
stopped here, also on failure.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import run as R  # noqa: E402  bench/run.py, used as a library
from setups import HaCluster, free_ports, terminate_group  # noqa: E402

REPO = BENCH.parent
sys.path.insert(0, str(REPO))
import yaml  # noqa: E402
from haqueue.admin import AdminClient, AdminError  # noqa: E402

HOST = R.HOST
OUT = R.OUT
VENV_PY = R.VENV_PY
CLIENT_JS = OUT / "ha_client.js"
log = R.log


loadavg = R.loadavg


# ---------------------------------------------------------------- the reconnecting client (rhea)

CLIENT_SOURCE = r"""'use strict';
// Written by bench/ha_run.py. Modes:
//   produce: paced publisher that reconnects (fixed --reconnect-ms delay) and reports each connection
//            ("open"), each socket loss ("disconnected") and the first accepted publish of each
//            connection ("first_accept"), times on CLOCK_MONOTONIC in µs; on SIGTERM it waits (≤ 3 s)
//            for what is in flight and writes the accepted sequence numbers to --out.
//   drain:   consumes (accepting) until --idle s pass without a message; writes the sequence numbers to --out.
const rhea = require('rhea');
const fs = require('fs');
const { nowUs, parseArgs, emit, BODY_TS, BODY_SEQ } = require('../js/common');

const mode = process.argv[2];
const argv = process.argv.slice(3);

function produce() {
    const o = parseArgs(argv, { host: '127.0.0.1', port: 5672, address: 'failover', rate: 1000, inflight: 1000,
                                size: 100, out: '', timeout: 900, reconnect_ms: 50 });
    const proto = Buffer.alloc(o.size, 0x78);
    const template = rhea.message.encode({ body: rhea.message.data_section(proto) });
    const bodyOff = template.length - o.size;
    const st = { sent: 0, accepted: 0, released: 0, rejected: 0, modified: 0, unconfirmed_at_disconnect: 0,
                 disconnects: 0, errors: [] };
    const accepted = [];
    let gen = 0, firstAccepted = 0, sender = null, inflight = 0, stopping = false;
    let tokens = 0, last = nowUs();
    const container = rhea.create_container({ id: 'ha-failover-producer-' + process.pid });
    const conn = container.connect({ host: o.host, port: o.port, reconnect: o.reconnect_ms });
    conn.open_sender({ target: { address: o.address } });
    container.on('connection_open', () => { gen++; emit({ event: 'open', gen, t: nowUs() }); });
    container.on('sender_open', (ctx) => { sender = ctx.sender; });
    function done(ctx, kind) {
        inflight--;
        st[kind]++;
        const d = ctx.delivery;
        if (kind === 'accepted') {
            accepted.push(d.seq);
            if (d.gen === gen && firstAccepted < gen) {
                firstAccepted = gen;
                emit({ event: 'first_accept', gen, t: nowUs(), seq: d.seq });
            }
        }
    }
    for (const k of ['accepted', 'released', 'rejected', 'modified']) container.on(k, (ctx) => done(ctx, k));
    container.on('disconnected', (ctx) => {
        st.disconnects++;
        st.unconfirmed_at_disconnect += inflight;
        inflight = 0;  // rhea forgets the outgoing deliveries of a lost connection
        emit({ event: 'disconnected', gen, t: nowUs(), error: ctx.error ? String(ctx.error.message || ctx.error) : '' });
    });
    for (const ev of ['connection_error', 'session_error', 'sender_error', 'protocol_error', 'error']) {
        container.on(ev, (ctx) => {
            const e = ctx.error || (ctx.connection && ctx.connection.error) || (ctx.sender && ctx.sender.error);
            const msg = ev + ': ' + (e && (e.description || e.message || JSON.stringify(e)));
            if (st.errors.length < 20) st.errors.push(msg);
            emit({ event: 'error', gen, t: nowUs(), error: msg });
        });
    }
    // Paced: tokens accrue at --rate but are capped, so an outage does not turn into a burst afterwards.
    function tick() {
        const now = nowUs();
        tokens = Math.min(tokens + (now - last) * o.rate / 1e6, 1 + o.rate * 0.005);
        last = now;
        while (!stopping && tokens >= 1 && sender && inflight < o.inflight && sender.sendable()) {
            const b = Buffer.allocUnsafe(template.length);
            template.copy(b);
            b.writeDoubleLE(nowUs(), bodyOff + BODY_TS);
            b.writeUInt32LE(st.sent >>> 0, bodyOff + BODY_SEQ);
            const d = sender.send(b, undefined, 0);
            d.seq = st.sent;
            d.gen = gen;
            st.sent++;
            inflight++;
            tokens -= 1;
        }
        if (!stopping) setTimeout(tick, 1);
    }
    tick();
    function finish() {
        if (stopping) return;
        stopping = true;
        const t0 = Date.now();
        const wait = () => {
            if (inflight > 0 && Date.now() - t0 < 3000) { setTimeout(wait, 20); return; }
            if (o.out) fs.writeFileSync(o.out, accepted.join('\n') + '\n');
            emit(Object.assign({ role: 'producer', gen, in_flight_at_end: inflight, accepted_written: accepted.length }, st));
            setTimeout(() => process.exit(0), 1000);
            try { conn.close(); } catch (e) { process.exit(0); }
        };
        wait();
    }
    process.on('SIGTERM', finish);
    container.on('connection_close', () => { if (stopping) process.exit(0); });
    setTimeout(finish, o.timeout * 1000);
}

function drain() {
    const o = parseArgs(argv, { host: '127.0.0.1', port: 5672, address: 'failover', credit: 1000, idle: 3,
                                timeout: 300, out: '' });
    const seqs = [];
    let lastUs = nowUs(), redelivered = 0, finished = false, receiver = null;
    const container = rhea.create_container({ id: 'ha-drain-' + process.pid });
    const conn = container.connect({ host: o.host, port: o.port, reconnect: false });
    conn.open_receiver({ source: { address: o.address }, credit_window: o.credit, autoaccept: true });
    container.on('receiver_open', (ctx) => { receiver = ctx.receiver; lastUs = nowUs(); });
    container.on('message', (ctx) => {
        const buf = ctx.message.body && ctx.message.body.content;
        if (Buffer.isBuffer(buf) && buf.length >= 12) seqs.push(buf.readUInt32LE(BODY_SEQ));
        if (ctx.message.delivery_count) redelivered++;
        lastUs = nowUs();
    });
    const errors = [];
    for (const ev of ['connection_error', 'receiver_error', 'disconnected']) {
        container.on(ev, (ctx) => { if (!finished) { errors.push(ev + ': ' + String(ctx.error && (ctx.error.description || ctx.error.message) || '')); finish(); } });
    }
    const t0 = nowUs();
    function finish() {
        if (finished) return;
        finished = true;
        if (o.out) fs.writeFileSync(o.out, seqs.join('\n') + '\n');
        const uniq = new Set(seqs).size;
        emit({ role: 'drain', received: seqs.length, unique: uniq, duplicates: seqs.length - uniq, redelivered, errors });
        setTimeout(() => process.exit(0), 3000);
        try { if (receiver && receiver.is_open()) receiver.close(); else conn.close(); } catch (e) { process.exit(0); }
    }
    container.on('receiver_close', () => { if (finished) conn.close(); });
    container.on('connection_close', () => { if (finished) process.exit(0); });
    setInterval(() => {
        if (nowUs() - lastUs > o.idle * 1e6 || nowUs() - t0 > o.timeout * 1e6) finish();
    }, 100);
}

if (mode === 'produce') produce();
else if (mode === 'drain') drain();
else throw new Error('mode: produce | drain');
"""


def start_js(args_: list[str], errlog: Path) -> subprocess.Popen:
    env = dict(os.environ, NODE_PATH=str(R.JS / "node_modules"))
    with open(errlog, "ab") as err:
        return subprocess.Popen(["node", str(CLIENT_JS), *args_], cwd=BENCH, stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.DEVNULL, env=env)


class Events:
    """Every JSON line of a client, kept in order."""

    def __init__(self, proc: subprocess.Popen):
        self.jl = R.JsonLines(proc)
        self.all: list[dict] = []

    def pump(self, timeout: float = 0.0) -> None:
        end = time.monotonic() + timeout
        while True:
            got = self.jl._pump(max(0.0, min(0.1, end - time.monotonic())))
            self.all.extend(self.jl.lines)
            self.jl.lines.clear()
            if not got and time.monotonic() >= end:
                return

    def wait(self, pred, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for ev in self.all[seen:]:
                if pred(ev):
                    return ev
            seen = len(self.all)
            if time.monotonic() >= deadline or (self.jl.proc.poll() is not None and not self.jl._pump(0)):
                self.all.extend(self.jl.lines)
                self.jl.lines.clear()
                for ev in self.all[seen:]:
                    if pred(ev):
                        return ev
                return None
            self.pump(min(0.2, deadline - time.monotonic()))

    def gen(self) -> int:
        return max([e["gen"] for e in self.all if e.get("event") == "open"] or [0])


SUP_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ haqueue\.cluster: (.*)$")


def supervisor_events(cluster: HaCluster) -> list[tuple[float, str]]:
    out = []
    for line in cluster.log_path.read_text(errors="replace").splitlines():
        m = SUP_LINE.match(line)
        if m:
            t = _dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local time, like logging
            out.append((t, m.group(2)))
    return out


def failover_phase(args) -> dict:
    res: dict = {"reps": [], "loadavg_start": loadavg()}
    if args.quiet_wait > 0:
        res["background_cores_at_start"] = R.wait_quiet(args.quiet_wait)
    cl = HaCluster("haqueue cluster (failover)")
    prod = None
    queue = f"failover-{uuid.uuid4().hex[:8]}"
    acc_path = OUT / f"ha-failover-accepted-{queue}.txt"
    got_path = OUT / f"ha-failover-drained-{queue}.txt"
    errlog = OUT / "ha-clients.stderr.log"
    try:
        cl.start()
        res["command"] = cl.command()
        prod = start_js(["produce", "--port", str(cl.port), "--address", queue, "--rate", str(args.failover_rate),
                         "--inflight", str(args.inflight), "--size", str(args.size), "--out", str(acc_path),
                         "--reconnect-ms", str(args.reconnect_ms)], errlog)
        ev = Events(prod)
        if ev.wait(lambda e: e.get("event") == "first_accept", 20) is None:
            raise RuntimeError(f"failover producer: no accepted publish within 20 s; events {ev.all[-5:]}")
        for rep in range(args.failover_reps):
            cl.wait_ready(120)
            time.sleep(2.0)  # steady publishing before the kill
            ev.pump(0)
            gen0 = ev.gen()
            prim = cl.primary()
            if prim is None or not prim[1]:
                raise RuntimeError("no primary to kill")
            name, pid = prim
            n_events = len(ev.all)
            t_kill_wall = time.time()
            t_kill = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            first = ev.wait(lambda e: e.get("event") == "first_accept" and e["gen"] > gen0, 30)
            t_seen = time.monotonic()
            rec = {"rep": rep + 1, "killed": name, "killed_pid": pid}
            if first is None:
                rec["error"] = "no publish accepted by a new primary within 30 s"
                rec["events"] = ev.all[n_events:][-10:]
                res["reps"].append(rec)
                log(f"failover {rep + 1}: {rec['error']}")
                continue
            after = ev.all[n_events:]
            disc = next((e for e in after if e.get("event") == "disconnected"), None)
            opened = next((e for e in after if e.get("event") == "open" and e["gen"] > gen0), None)
            rec.update({
                "failover_s": first["t"] / 1e6 - t_kill,
                "disconnect_s": disc["t"] / 1e6 - t_kill if disc else None,
                "reconnected_s": opened["t"] / 1e6 - t_kill if opened else None,
                "failed_connects": sum(1 for e in after if e.get("event") == "disconnected") - 1,
                "seen_by_harness_s": t_seen - t_kill,
            })
            # what the supervisor logged (wall clock, ms resolution)
            time.sleep(0.5)
            sup = [(t - t_kill_wall, msg) for t, msg in supervisor_events(cl) if t >= t_kill_wall - 0.01]
            det = next((t for t, m in sup if "failed; promoting" in m), None)
            pro = next((t for t, m in sup if m.endswith("is primary")), None)
            new = next((m.split()[0] for t, m in sup if m.endswith("is primary")), None)
            rec.update({"supervisor_detected_s": det, "promoted_s": pro, "new_primary": new})
            log(f"failover {rep + 1}: killed {name}; first publish accepted by {new} after {rec['failover_s']:.3f} s "
                f"(supervisor noticed {det if det is None else round(det, 3)} s, promoted "
                f"{pro if pro is None else round(pro, 3)} s, client reconnected "
                f"{rec['reconnected_s'] if rec['reconnected_s'] is None else round(rec['reconnected_s'], 3)} s; "
                f"load average {loadavg()})")
            res["reps"].append(rec)
        try:
            cl.wait_ready(120)
        except RuntimeError as e:
            res.setdefault("problems", []).append(str(e))
        # stop the producer; it waits for what is in flight and writes the accepted sequence numbers
        prod.send_signal(signal.SIGTERM)
        summary = ev.wait(lambda e: e.get("role") == "producer", 15)
        res["producer"] = summary
        R.stop_proc(prod)
        prod = None
        # consume everything
        drain = start_js(["drain", "--port", str(cl.port), "--address", queue, "--idle", "3",
                          "--out", str(got_path)], errlog)
        dev = Events(drain)
        dsum = dev.wait(lambda e: e.get("role") == "drain", 300)
        R.stop_proc(drain)
        res["drain"] = dsum
        accepted = {int(x) for x in acc_path.read_text().split()} if acc_path.exists() else set()
        got = [int(x) for x in got_path.read_text().split()] if got_path.exists() else []
        gset = set(got)
        sent = summary.get("sent", 0) if summary else 0
        res["accepted"] = len(accepted)
        res["drained"] = len(got)
        res["lost_confirmed"] = len(accepted - gset)
        res["lost_confirmed_sample"] = sorted(accepted - gset)[:20]
        res["unconfirmed_present"] = len(gset - accepted)
        res["unconfirmed_absent"] = sent - len(accepted) - len(gset - accepted) if sent else None
        res["duplicates"] = len(got) - len(gset)
        log(f"failover: {len(accepted)} accepted, {len(got)} consumed afterwards ({res['duplicates']} duplicates), "
            f"accepted but lost {res['lost_confirmed']}, unconfirmed but present {res['unconfirmed_present']}")
    except Exception as e:
        res["error"] = str(e)
        log(f"failover phase: {e}")
    finally:
        if prod is not None:
            R.stop_proc(prod)
        res["log_problems"] = cl.broker_log_problems() if Path(cl.dir).exists() else []
        res["supervisor_log"] = [m for _, m in supervisor_events(cl)] if cl.log_path.exists() else []
        cl.stop()
        res["loadavg_end"] = loadavg()
    return res


# ---------------------------------------------------------------- catch-up

def catchup_phase(args) -> dict:
    res: dict = {"loadavg_start": loadavg(), "backlog": args.backlog}
    if args.quiet_wait > 0:
        res["background_cores_at_start"] = R.wait_quiet(args.quiet_wait)
    d = tempfile.mkdtemp(prefix="haqueue-habench-catchup-")
    ports = free_ports(3)
    pub, pa, pb = ports
    password = uuid.uuid4().hex
    names = ["broker-a", "broker-b"]
    paths = []
    for name, port in zip(names, (pa, pb)):
        cfg = {"name": name, "listen": [f"{HOST}:{port}"], "data_dir": os.path.join(d, name),
               "ha": {"brokers": [f"{HOST}:{pa}", f"{HOST}:{pb}"], "public": f"{HOST}:{pub}", "username": "ha",
                      "password": password, "backup_timeout": 5.0}}
        path = os.path.join(d, f"{name}.yaml")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            yaml.safe_dump(cfg, f)
        paths.append(path)
    procs: list[subprocess.Popen] = []
    logs = []
    clients: list[subprocess.Popen] = []
    backlog_q = f"backlog-{uuid.uuid4().hex[:8]}"
    live_q = f"live-{uuid.uuid4().hex[:8]}"
    errlog = OUT / "ha-clients.stderr.log"

    def start_broker(i: int) -> subprocess.Popen:
        lf = open(OUT / f"ha-catchup-{time.strftime('%Y%m%d-%H%M%S')}-{names[i]}.log", "ab")
        logs.append(lf)
        p = subprocess.Popen([str(VENV_PY), "-m", "haqueue", "broker", "--config", paths[i]], cwd=REPO,
                             stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        procs.append(p)
        return p

    try:
        a = start_broker(0)
        # promote A: a brand-new cluster, so allowed once A has tried B (refused: not running)
        deadline = time.monotonic() + 20
        promoted = None
        while time.monotonic() < deadline and promoted is None:
            if a.poll() is not None:
                raise RuntimeError(f"broker-a exited with {a.returncode}")
            try:
                code, desc, body = R.admin_request(f"{HOST}:{pa}", "PROMOTE", "ha", body={"force": False}, password=password)
                if code < 400:
                    promoted = body
                else:
                    res["promote_refusal"] = desc
            except AdminError:
                pass
            if promoted is None:
                time.sleep(0.2)
        if promoted is None:
            raise RuntimeError(f"broker-a could not be promoted: {res.get('promote_refusal')}")
        res["primary_status"] = {k: promoted.get(k) for k in ("role", "state", "epoch")}
        deadline = time.monotonic() + 20
        while not R.port_open(pub):
            if time.monotonic() > deadline:
                raise RuntimeError("public address not bound after promotion")
            time.sleep(0.1)
        # the backlog
        log(f"catch-up: filling {args.backlog} messages into {backlog_q} on the primary (no backups)")
        t0 = time.monotonic()
        fill = R.start_client("rhea", "producer", ["--host", HOST, "--port", str(pub), "--address", backlog_q,
                                                   "--messages", str(args.backlog), "--size", str(args.size),
                                                   "--inflight", str(args.inflight), "--timeout", "300"], errlog)
        clients.append(fill)
        fr = R.JsonLines(fill).wait_for(lambda o: o.get("role") == "producer", time.monotonic() + 320)
        R.stop_proc(fill)
        if not fr or not fr.get("ok") or fr.get("accepted") != args.backlog:
            raise RuntimeError(f"backlog fill failed: {fr}")
        res["fill_s"] = time.monotonic() - t0
        log(f"catch-up: backlog filled in {res['fill_s']:.1f} s")
        # live traffic on another queue
        live_n = int(args.rate * args.live_duration)
        cons = R.start_client("rhea", "consumer", ["--host", HOST, "--port", str(pub), "--address", live_q,
                                                   "--messages", str(live_n), "--warmup", str(int(args.rate)),
                                                   "--timeout", str(int(args.live_duration + 120))], errlog)
        clients.append(cons)
        cj = R.JsonLines(cons)
        if cj.wait_for(lambda o: o.get("event") == "ready", time.monotonic() + 20) is None:
            raise RuntimeError("live consumer did not attach")
        lp = R.start_client("rhea", "producer", ["--host", HOST, "--port", str(pub), "--address", live_q,
                                                 "--rate", str(args.rate), "--duration", str(args.live_duration),
                                                 "--size", str(args.size), "--inflight", str(args.inflight),
                                                 "--timeout", str(int(args.live_duration + 120))], errlog)
        clients.append(lp)
        time.sleep(3.0)  # live traffic steady
        a_ticks0 = sum(t for t, _ in R.cpu_ticks([a.pid]).values())
        t_start = time.monotonic()
        b = start_broker(1)
        samples = []
        client = None
        t_answer = t_first = t_cu = t_ready = None
        deadline = t_start + args.catchup_timeout
        while time.monotonic() < deadline:
            if b.poll() is not None:
                raise RuntimeError(f"broker-b exited with {b.returncode}")
            try:
                if client is None:
                    client = AdminClient(f"{HOST}:{pb}", 2.0, "ha", password)
                code, _, st = client.request("READ", "ha")
            except AdminError:
                if client is not None:
                    client.close()
                client = None
                time.sleep(0.05)
                continue
            now = time.monotonic()
            if t_answer is None:
                t_answer = now
            q = (st.get("queues") or {}).get(backlog_q) or {}
            samples.append({"t": now - t_start, "state": st.get("state"), "caught_up": q.get("caught_up"),
                            "catchup_received": q.get("catchup_received"), "depth": q.get("depth")})
            if t_first is None and (q.get("catchup_received") or 0) > 0:
                t_first = now
            if t_cu is None and q.get("caught_up"):
                t_cu = now
                res["b_status_at_caught_up"] = st
                a_ticks1 = sum(t for t, _ in R.cpu_ticks([a.pid]).values())
            if t_cu is not None and st.get("state") == "ready":
                t_ready = now
                break
            time.sleep(0.05)
        if client is not None:
            client.close()
        res["samples"] = samples
        if t_cu is None:
            raise RuntimeError(f"backup not caught up within {args.catchup_timeout:g} s; last {samples[-3:]}")
        final = samples[-1]
        n = res["b_status_at_caught_up"]["queues"][backlog_q]["catchup_received"]
        first_nonzero = next(s for s in samples if (s["catchup_received"] or 0) > 0)
        last_before = [s for s in samples if not s["caught_up"] and (s["catchup_received"] or 0) > 0]
        res.update({
            "catchup_received": n,
            "depth_on_backup": res["b_status_at_caught_up"]["queues"][backlog_q]["depth"],
            "t_answer_s": t_answer - t_start, "t_first_catchup_s": t_first - t_start,
            "t_caught_up_s": t_cu - t_start, "t_ready_s": t_ready - t_start if t_ready else None,
            "rate_from_start": n / (t_cu - t_start),
            "rate_from_answer": n / (t_cu - t_answer),
            "rate_slope": ((last_before[-1]["catchup_received"] - first_nonzero["catchup_received"])
                           / (last_before[-1]["t"] - first_nonzero["t"])
                           if len(last_before) >= 2 and last_before[-1]["t"] > first_nonzero["t"] else None),
            "poll_samples": len(samples),
            "primary_cpu_us_per_backlog_msg": (a_ticks1 - a_ticks0) * 1e6 / R.CLK_TCK / n if n else None,
        })
        log(f"catch-up: {n} backlog messages; backup answered at {res['t_answer_s']:.2f} s, first catch-up seen "
            f"{res['t_first_catchup_s']:.2f} s, caught up {res['t_caught_up_s']:.2f} s after start: "
            f"{res['rate_from_answer']:.0f} msg/s from the backup's first answer "
            f"({res['rate_from_start']:.0f} from process start); backup depth {res['depth_on_backup']}")
        # the CLI, as an operator would run it
        cli = subprocess.run([str(VENV_PY), "-m", "haqueue", "admin", "-b", f"{HOST}:{pb}", "--user", "ha",
                              "--password", password, "ha", "status"], capture_output=True, text=True, timeout=30,
                             cwd=REPO)
        try:
            res["cli_status_after"] = json.loads(cli.stdout)["queues"].get(backlog_q)
        except (ValueError, KeyError, AttributeError):
            res["cli_status_after"] = (cli.stdout + cli.stderr).strip()[:300]
        # the live traffic's own result
        pr = R.JsonLines(lp).wait_for(lambda o: o.get("role") == "producer", time.monotonic() + args.live_duration + 30)
        cr = cj.wait_for(lambda o: o.get("role") == "consumer", time.monotonic() + 30)
        res["live_ended_before_caught_up"] = bool(pr and pr.get("last_send_us") and
                                                  pr["last_send_us"] / 1e6 < t_cu)
        if cr:
            res["live"] = {"received": cr.get("received"), "missing": cr.get("missing"),
                           "duplicates": cr.get("duplicates"),
                           "p50_ms": (cr["latency"]["p50_us"] or 0) / 1000, "p99_ms": (cr["latency"]["p99_us"] or 0) / 1000,
                           "max_ms": (cr["latency"]["max_us"] or 0) / 1000, "ok": cr.get("ok"), "errors": cr.get("errors")}
        if pr:
            res["live_producer"] = {k: pr.get(k) for k in ("ok", "sent", "accepted", "send_rate", "errors")}
    except Exception as e:
        res["error"] = str(e)
        log(f"catch-up phase: {e}")
    finally:
        for c in clients:
            R.stop_proc(c)
        for i, p in enumerate(procs):
            terminate_group(p, names[i])
        for lf in logs:
            lf.close()
        problems = []
        for lf in logs:
            for line in Path(lf.name).read_text(errors="replace").splitlines():
                if re.search(r"\b(ERROR|WARNING|CRITICAL)\b|Traceback", line):
                    problems.append(f"{Path(lf.name).name}: {line.strip()}")
        res["log_problems"] = problems
        shutil.rmtree(d, ignore_errors=True)
        res["loadavg_end"] = loadavg()
    return res


# ---------------------------------------------------------------- report

# log lines that are the expected consequence of the harness's own actions
EXPECTED_LOG = ("framing-error: connection aborted", "lost primary", "failed; promoting a ready backup",
                "broker shutting down")


def markdown(fo: dict | None, cu: dict | None, args, command: str, t_begin: str) -> str:
    now = _dt.datetime.now().astimezone()
    node_v = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    L = [f"## HA: failover, catch-up (bench/ha_run.py), {now:%Y-%m-%d %H:%M %Z}", "",
         "```", command, "```", "",
         f"Machine: {os.cpu_count()} cores, Linux {platform.release()}, node {node_v}, rhea 3.0.5 (bench/js producer.js "
         f"and consumer.js, one process each), Python {platform.python_version()}. Load average at the start "
         f"{t_begin}, at the end {loadavg()}.",
         f"Settings: {args.size} B bodies, not durable, at-least-once (producer ≤ {args.inflight} unsettled).", ""]
    problems: list[str] = []
    if fo:
        L.append(f"Failover ({args.failover_reps} kills of the primary with SIGKILL; `haqueue cluster up --size 3`; "
                 f"one rhea producer publishing {args.failover_rate:g} msg/s to the public address, reconnecting "
                 f"{args.reconnect_ms} ms after each socket loss, ≤ {args.inflight} unsettled; time from the kill to "
                 "the first publish accepted on the connection to the new primary):")
        L.append("")
        L.append("| rep | killed | new primary | client saw socket loss | supervisor noticed | promoted | client reconnected | "
                 "**first publish accepted** |")
        L.append("|---|---|---|---|---|---|---|---|")
        fmt = lambda v: "—" if v is None else f"{v * 1000:.0f} ms"  # noqa: E731
        for r in fo.get("reps", []):
            if "error" in r:
                L.append(f"| {r['rep']} | {r['killed']} | | | | | | failed: {r['error']} |")
                problems.append(f"failover rep {r['rep']}: {r['error']}; last events {r.get('events')}")
                continue
            L.append(f"| {r['rep']} | {r['killed']} | {r.get('new_primary') or '?'} | {fmt(r['disconnect_s'])} | "
                     f"{fmt(r['supervisor_detected_s'])} | {fmt(r['promoted_s'])} | {fmt(r['reconnected_s'])} | "
                     f"**{fmt(r['failover_s'])}** |")
        ok = [r["failover_s"] for r in fo.get("reps", []) if "failover_s" in r]
        if ok:
            L.append("")
            L.append(f"Failover time min / median / max: {min(ok) * 1000:.0f} / {statistics.median(ok) * 1000:.0f} / "
                     f"{max(ok) * 1000:.0f} ms over {len(ok)} kills. Supervisor times are from its log (wall clock, "
                     "ms resolution); the others on CLOCK_MONOTONIC.")
        if "lost_confirmed" in fo:
            p = fo.get("producer") or {}
            L.append("")
            L.append(f"Afterwards the queue was consumed to the end: {fo['accepted']} publishes accepted, "
                     f"{fo['drained']} messages consumed, **{fo['lost_confirmed']} accepted but lost**, "
                     f"{fo['duplicates']} duplicates, {fo['unconfirmed_present']} unconfirmed (in flight at a kill) "
                     f"but present, {fo['unconfirmed_absent']} unconfirmed and absent (the client does not resend). "
                     f"Producer: {p.get('sent')} sent, {p.get('disconnects')} socket losses (incl. refused reconnects), "
                     f"{p.get('released', 0)} released, {p.get('rejected', 0)} rejected.")
            if fo["lost_confirmed"]:
                problems.append(f"failover: {fo['lost_confirmed']} accepted messages lost, e.g. seq "
                                f"{fo['lost_confirmed_sample']}")
        if "error" in fo:
            problems.append(f"failover phase: {fo['error']}")
        L.append(f"Load average during the failover phase: {fo.get('loadavg_start')} → {fo.get('loadavg_end')}.")
        L.append("")
    if cu:
        L.append(f"Catch-up: two HA brokers (configs as the supervisor writes them), broker-a promoted alone, "
                 f"{args.backlog} × {args.size} B messages put on a queue, then live traffic on another queue "
                 f"({args.rate:g} msg/s, rhea producer + consumer), then broker-b started; its `ha status` "
                 "(READ ha over $management, as `haqueue admin ha status` sends it, one connection kept open) "
                 "polled every 50 ms until the backlog queue reports caught_up:")
        L.append("")
        if "error" in cu:
            L.append(f"failed: {cu['error']}")
            problems.append(f"catch-up: {cu['error']}")
        else:
            L.append("| backlog msgs caught up | backup answering | first catch-up seen | caught up | "
                     "**backlog msg/s** (from the backup's first answer) | from process start | transfer slope | "
                     "primary CPU µs per backlog msg | live p50 / p99 ms meanwhile |")
            L.append("|---|---|---|---|---|---|---|---|---|")
            lv = cu.get("live") or {}
            slope = f"{cu['rate_slope']:.0f}" if cu.get("rate_slope") else "— (too few samples)"
            L.append(f"| {cu['catchup_received']} (depth on the backup {cu['depth_on_backup']}) | "
                     f"{cu['t_answer_s']:.2f} s | {cu['t_first_catchup_s']:.2f} s | {cu['t_caught_up_s']:.2f} s | "
                     f"**{cu['rate_from_answer']:.0f}** | {cu['rate_from_start']:.0f} | {slope} | "
                     f"{cu['primary_cpu_us_per_backlog_msg']:.1f} | "
                     f"{lv.get('p50_ms', 0):.2f} / {lv.get('p99_ms', 0):.2f} |")
            L.append("")
            L.append(f"Times are after broker-b's process was started (Python start-up included). Live traffic: "
                     f"{lv.get('received')} received, missing {lv.get('missing')}, duplicates {lv.get('duplicates')}"
                     + ("; it ended before the backup caught up" if cu.get("live_ended_before_caught_up") else "")
                     + f". `haqueue admin ha status` afterwards: `{json.dumps(cu.get('cli_status_after'))}`. "
                     f"Load average: {cu.get('loadavg_start')} → {cu.get('loadavg_end')}.")
            if lv and (lv.get("missing") or lv.get("duplicates") or not lv.get("ok")):
                problems.append(f"catch-up live traffic: {lv}")
        L.append("")
    L.append("Targets:")
    L.append("")
    L.append("| target | result | |")
    L.append("|---|---|---|")
    if fo:
        ok = [r["failover_s"] for r in fo.get("reps", []) if "failover_s" in r]
        failed = len(fo.get("reps", [])) - len(ok)
        if ok:
            L.append(f"| failover ≤ 2 s | max {max(ok):.2f} s (median {statistics.median(ok):.2f} s)"
                     + (f", {failed} failed" if failed else "") +
                     f" | {'met' if max(ok) <= 2 and not failed else 'NOT met'} |")
        if "lost_confirmed" in fo:
            L.append(f"| 0 accepted-but-lost messages | {fo['lost_confirmed']} | "
                     f"{'met' if fo['lost_confirmed'] == 0 else 'NOT met'} |")
    if cu and "rate_from_answer" in cu:
        L.append(f"| catch-up ≥ 50k backlog msg/s | {cu['rate_from_answer']:.0f} msg/s | "
                 f"{'met' if cu['rate_from_answer'] >= 50000 else 'NOT met'} |")
    L.append("")
    expected = {}
    for what, lines in [("failover", (fo or {}).get("log_problems", [])), ("catch-up", (cu or {}).get("log_problems", []))]:
        shown = 0
        for p in lines:
            pat = next((x for x in EXPECTED_LOG if x in p), None)
            if pat:
                expected[pat] = expected.get(pat, 0) + 1
            elif shown < 15:
                problems.append(f"{what} log: {p}")
                shown += 1
    if expected:
        L.append("Warnings in the brokers' and supervisor's logs that follow from what the harness does (a kill, "
                 "a client process ended, a broker stopped), counted, not listed: "
                 + "; ".join(f"“{k}” ×{v}" for k, v in expected.items()) + ".")
        L.append("")
    if problems:
        L.append("Problems seen:")
        L.append("")
        for p in problems:
            L.append("- " + p.replace("\n", " / ")[:600])
        L.append("")
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------- main

class Terminated(BaseException):
    pass


def _on_term(signum, frame):
    raise Terminated()


def initial_wait(max_wait: float) -> None:
    """Wait (bounded) for a quieter machine: < 0.5 cores busy over 5 s, polled; logs the load average."""
    if max_wait <= 0:
        return
    deadline = time.monotonic() + max_wait
    while True:
        m0 = R.machine_busy_ticks()
        time.sleep(5)
        busy = (R.machine_busy_ticks() - m0) / R.CLK_TCK / 5
        if busy < 0.5:
            log(f"machine quiet enough ({busy:.2f} cores busy; load average {loadavg()})")
            return
        if time.monotonic() >= deadline:
            log(f"machine still busy ({busy:.2f} cores; load average {loadavg()}) after {max_wait:g} s; going on")
            return
        log(f"machine busy ({busy:.2f} cores; load average {loadavg()}); waiting")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phases", default="failover,catchup", help="comma-separated subset of failover,catchup "
                    "(throughput and latency: bench/interleave.py)")
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--rate", type=float, default=1000, help="msg/s of the catch-up phase's live traffic")
    ap.add_argument("--inflight", type=int, default=1000)
    ap.add_argument("--failover-reps", type=int, default=5)
    ap.add_argument("--failover-rate", type=float, default=1000)
    ap.add_argument("--reconnect-ms", type=int, default=50, help="the failover producer's fixed reconnect delay")
    ap.add_argument("--backlog", type=int, default=100000)
    ap.add_argument("--live-duration", type=float, default=25, help="seconds of live traffic in the catch-up phase")
    ap.add_argument("--catchup-timeout", type=float, default=120)
    ap.add_argument("--initial-wait", type=float, default=600,
                    help="wait up to this long at the start for a quiet machine (default 600 s)")
    ap.add_argument("--quiet-wait", type=float, default=60, help="before each phase, bench/run.py's wait_quiet (s)")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args(argv)
    args.durable = False
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    bad = set(phases) - {"failover", "catchup"}
    if bad:
        ap.error(f"unknown phases {bad}")
    if not (R.JS / "node_modules" / "rhea").exists():
        ap.error("rhea missing: (cd bench/js && npm install)")
    signal.signal(signal.SIGTERM, _on_term)
    command = "python bench/ha_run.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    OUT.mkdir(exist_ok=True)
    CLIENT_JS.write_text(CLIENT_SOURCE)
    t_begin = loadavg()
    log(f"load average {t_begin}")
    initial_wait(args.initial_wait)
    fo = cu = None
    try:
        if "failover" in phases:
            fo = failover_phase(args)
        if "catchup" in phases:
            cu = catchup_phase(args)
    except (Terminated, KeyboardInterrupt):
        log("interrupted; everything started here has been stopped")
        return 130
    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw_path = OUT / f"ha-results-{stamp}.json"
    raw_path.write_text(json.dumps({"command": command, "failover": fo, "catchup": cu},
                                   indent=1, default=str))
    md = markdown(fo, cu, args, command, t_begin)
    print(md)
    if not args.no_record:
        R.record(md)
        log(f"appended to {R.RESULTS}; raw JSON in {raw_path}")
    else:
        log(f"raw JSON in {raw_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
