#!/usr/bin/env python3
"""haqueue throughput/latency benchmark against RabbitMQ 3.10 (classic queue).

Not part of the test suite. Starts the brokers itself, drives them with the
rhea clients in bench/js (one producer, one consumer, separate node
processes), and writes a markdown table (appended to bench/RESULTS.md unless
--no-record). See bench/README.md.

Per broker and body size:
  saturation  one producer, one consumer, at-least-once (the producer keeps at
              most --inflight unsettled; the consumer accepts each message with
              --credit credit): msg/s end to end, and the broker's CPU
              (utime+stime from /proc of the broker's process tree) per message.
  latency     a fixed --rate msg/s for --duration s: p50/p99 end-to-end latency
              (send time written into the body; the consumer subtracts it from
              its own CLOCK_MONOTONIC reading), the first second left out.

Everything talks to 127.0.0.1 only; every wait is bounded; everything started
here is stopped here (RabbitMQ with `rabbitmqctl stop`).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import select
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

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
JS = BENCH / "js"
OUT = BENCH / "out"
RESULTS = BENCH / "RESULTS.md"
# the repository's venv, or (in a git worktree, which has none) the interpreter running this
VENV_PY = REPO / ".venv" / "bin" / "python" if (REPO / ".venv").exists() else Path(sys.executable)
CLK_TCK = os.sysconf("SC_CLK_TCK")
WARM_SEQ = 1_000_000_000  # sequence numbers of warm-up messages start here
LARGE_SIZES = (64 * 1024, 1024 * 1024, 10 * 1024 * 1024)  # --large
RUN_BYTES = 3 * 2 ** 30  # a saturation run moves at most this many body bytes (fewer messages of large bodies)
WARM_BYTES = 512 * 2 ** 20  # and its warm-up at most this many
LATENCY_BYTES_PER_S = 100 * 2 ** 20  # the fixed-rate run of large bodies goes at most this fast (1 MB: 100/s)
HOST = "127.0.0.1"

DEFAULT_HAQUEUE_CMD = (
    "{python} -m haqueue broker --listen 127.0.0.1:{port} --name {name} --data-dir {data_dir}"
)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- /proc CPU

def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm may contain spaces/parens: split after the last ')'
    rest = raw[raw.rindex(")") + 2:].split()
    return rest  # rest[0] is state (field 3); ppid field 4 -> rest[1]; utime 14 -> rest[11]; stime 15 -> rest[12]


def proc_tree(root: int) -> list[int]:
    """root and all its descendants now alive."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        f = _stat_fields(int(d))
        if f is None:
            continue
        children.setdefault(int(f[1]), []).append(int(d))
    out, todo = [], [root]
    while todo and len(out) < 10000:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_ticks(pids: list[int]) -> dict[int, tuple[int, int]]:
    """pid -> (utime+stime, stime) in clock ticks, for those of pids alive."""
    res = {}
    for p in pids:
        f = _stat_fields(p)
        if f is not None:
            res[p] = (int(f[11]) + int(f[12]), int(f[12]))
    return res


def machine_busy_ticks() -> int:
    """Busy CPU ticks of the whole machine (all cores) from /proc/stat."""
    f = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in f[:8])
    return user + nice + system + irq + softirq + steal


def rotated(items: list, round_: int) -> list:
    """`items` in the order of round `round_` of an interleaved run: each round starts one further along, so that
    no set-up always runs first or last while the machine's speed drifts."""
    return items[round_ % len(items):] + items[:round_ % len(items)]


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class CpuMeter:
    """Between start() and stop(): the CPU of a broker set-up's processes (broker.cpu_groups(): label, pid,
    whole tree or not; a RabbitMQ cluster's nodes are not one tree), its kernel part, the machine's busy
    time, and the growth of the set-up's own counters (broker.counters(), e.g. the store's fsyncs)."""

    def __init__(self, broker: "Broker"):
        self.broker = broker
        self.groups = broker.cpu_groups()

    def _read(self) -> dict[str, dict[int, tuple[int, int]]]:
        return {label: cpu_ticks(proc_tree(pid) if tree else [pid]) for label, pid, tree in self.groups}

    def start(self) -> None:
        self.c0 = self.broker.counters()
        self.broker.watch_start()
        self.t0 = self._read()
        self.m0 = machine_busy_ticks()
        self.w0 = time.monotonic()
        self.l0 = loadavg()

    def stop(self) -> dict:
        t1 = self._read()
        m1 = machine_busy_ticks()
        wall = time.monotonic() - self.w0
        c1 = self.broker.counters()
        watched = self.broker.watch_stop()
        per, sys_total = {}, 0
        for label, ticks in t1.items():  # a process started during the run counts from 0
            before = self.t0.get(label, {})
            per[label] = sum(t - before.get(p, (0, 0))[0] for p, (t, _) in ticks.items()) * 1e6 / CLK_TCK
            sys_total += sum(st - before.get(p, (0, 0))[1] for p, (_, st) in ticks.items())
        return {"cpu_us_tree": sum(per.values()), "cpu_us_root": next(iter(per.values()), 0.0),
                "sys_us_tree": sys_total * 1e6 / CLK_TCK, "per_process_us": per,
                "machine_busy_us": (m1 - self.m0) * 1e6 / CLK_TCK, "wall_s": wall,
                "pids": sorted(p for ticks in t1.values() for p in ticks),
                "counters": {k: c1[k] - v for k, v in self.c0.items() if k in c1},
                "loadavg_start": self.l0, "loadavg_end": loadavg(), **({"watched": watched} if watched else {})}


def other_load(r: dict) -> float:
    """Cores used during a run by everything but the broker and the two clients."""
    c = r["cpu"]
    other = c["machine_busy_us"] - c["cpu_us_tree"] - r["producer"]["client_cpu_us"] - r["consumer"]["client_cpu_us"]
    return max(0.0, other) / 1e6 / c["wall_s"]


# ---------------------------------------------------------------- helpers

def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    """Something listens on 127.0.0.1:port (or any address), read from /proc/net/tcp without
    connecting, so the broker does not log an aborted connection."""
    want = {f"0100007F:{port:04X}", f"00000000:{port:04X}"}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and (f[1] in want or f[1].endswith(f":{port:04X}") and set(f[1].split(":")[0]) == {"0"}):
                return True
    return False


def run_cmd(cmd: list[str], timeout: float, env: dict | None = None, check: bool = True,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} -> {r.returncode}: {r.stdout.strip()} {r.stderr.strip()}")
    return r


class JsonLines:
    """Reads JSON lines from a child's stdout with a deadline (no threads)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.buf = b""
        self.lines: list[dict] = []
        self.junk: list[str] = []

    def _pump(self, timeout: float) -> bool:
        fd = self.proc.stdout.fileno()
        r, _, _ = select.select([fd], [], [], max(0.0, timeout))
        if not r:
            return False
        chunk = os.read(fd, 65536)
        if not chunk:
            return False
        self.buf += chunk
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            s = line.decode(errors="replace").strip()
            if not s:
                continue
            try:
                self.lines.append(json.loads(s))
            except ValueError:
                self.junk.append(s)
        return True

    def wait_for(self, pred, deadline: float) -> dict | None:
        while time.monotonic() < deadline:
            for i, obj in enumerate(self.lines):
                if pred(obj):
                    return self.lines.pop(i)
            if not self._pump(min(0.5, deadline - time.monotonic())) and self.proc.poll() is not None:
                # drain what is left, then give up
                while self._pump(0):
                    pass
                for i, obj in enumerate(self.lines):
                    if pred(obj):
                        return self.lines.pop(i)
                return None
        return None


def stop_proc(p: subprocess.Popen, grace: float = 5.0) -> None:
    if p.poll() is not None:
        return
    try:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=5)


NICE = 0  # --nice: niceness for the brokers and clients started here


def _set_nice() -> None:
    if NICE:
        os.nice(NICE)


def renice_tree(pid: int, nice: int) -> None:
    """Set the niceness of every thread of pid and its descendants (a process's threads each have their own)."""
    for p in proc_tree(pid):
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{p}/task")]
        except OSError:
            continue
        for t in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, t, nice)
            except OSError:
                pass


def compiled(source: Path, name: str, libraries: tuple[str, ...] = ("m",)) -> Path:
    """A C program of bench/ compiled (again when its source is newer) into bench/out/name."""
    binary = OUT / name
    if not binary.exists() or binary.stat().st_mtime < source.stat().st_mtime:
        OUT.mkdir(exist_ok=True)
        subprocess.run(["cc", "-O2", "-Wall", "-o", str(binary), str(source), *(f"-l{lib}" for lib in libraries)],
                       check=True)
    return binary


def start_client(kind: str, role: str, args: list[str], stderr_path: Path) -> subprocess.Popen:
    """kind 'rhea': bench/js/{role}.js under node; 'c': bench/c_clients/client.c;
    'proton': bench/py_clients.py {role} in the venv."""
    if kind == "rhea":
        cmd = ["node", str(JS / f"{role}.js"), *args]
    elif kind == "c":
        cmd = [str(compiled(BENCH / "c_clients" / "client.c", "c-client")), role, *args]
    else:
        cmd = [str(VENV_PY), str(BENCH / "py_clients.py"), role, *args]
    with open(stderr_path, "ab") as err:
        return subprocess.Popen(cmd, cwd=BENCH, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                preexec_fn=_set_nice)


# ---------------------------------------------------------------- brokers

class Broker:
    label = "?"
    port = 0
    pid = 0
    username = ""
    password = ""
    pairs = 1  # queues a saturation run uses at once, each with a producer and a consumer (bench/interleave.py)
    queue_arguments: dict = {}  # declared on each run's queue (bench/interleave.py's +prioN), else none

    def address(self, queue: str) -> str:
        return queue

    def spread(self, queues: list[str]) -> list[str]:
        """The addresses of queues used at once (a sharded set-up puts each on its own shard)."""
        return [self.address(queue) for queue in queues]

    def port_for(self, address: str) -> int:
        """The port a client of `address` connects to."""
        return self.port

    def prepare_queue(self, queue: str) -> None:
        pass

    def drop_queue(self, queue: str) -> None:
        pass

    def alive(self) -> bool:
        return Path(f"/proc/{self.pid}").exists()

    def describe_failure(self) -> str:
        return ""

    def cpu_groups(self) -> list[tuple[str, int, bool]]:
        """(label, pid, its whole process tree?) of what counts as this set-up's CPU."""
        return [("broker", self.pid, True)]

    def counters(self) -> dict[str, int]:
        """Cumulative counters read before and after each measured run (e.g. the store's fsyncs)."""
        return {}

    def watch_start(self) -> None:
        """A measured run starts: begin watching whatever explains its figures (a cluster's backups)."""

    def watch_stop(self) -> dict:
        """The run has ended: what the watch saw (kept in the run's JSON), {} if nothing is watched."""
        return {}


def haqueue_admin():
    """This tree's haqueue.admin, imported on first use (run.py itself runs without haqueue)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import haqueue.admin
    return haqueue.admin


def admin_request(endpoint: str, op: str, type_: str, name: str | None = None, body: dict | None = None,
                  password: str | None = None, timeout: float = 3.0) -> tuple[int, str, object]:
    """One haqueue management request (no SASL without a password, else user 'ha', as the supervisor sets)."""
    with haqueue_admin().AdminClient(endpoint, timeout, "ha" if password else None, password) as c:
        return c.request(op, type_, name, body)


def store_syncs(endpoints: list[str], password: str | None = None) -> dict[str, int]:
    """{"syncs": fsyncs made so far by the stores of the haqueue brokers at endpoints} (admin READ store),
    or {} when one cannot tell (no store in that version, broker unreachable)."""
    AdminError = haqueue_admin().AdminError
    total = 0
    for endpoint in endpoints:
        try:
            code, _, body = admin_request(endpoint, "READ", "store", password=password)
        except AdminError:
            return {}
        if code >= 400 or not isinstance(body, dict):
            return {}
        total += body.get("syncs", 0)
    return {"syncs": total}


class LoggedProcess:
    """A broker run as a process whose output goes to self.log_path."""

    log_path: Path

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class CommandBroker(LoggedProcess, Broker):
    """A broker run from a command template (haqueue by default)."""

    def __init__(self, cmd_template: str, label: str, port: int | None, startup_timeout: float):
        self.label = label
        self.port = port or free_port()
        self.data_dir = tempfile.mkdtemp(prefix="haqueue-bench-")
        OUT.mkdir(exist_ok=True)
        self.log_path = OUT / f"{label.replace('/', '_').replace(' ', '_')}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        cmd = cmd_template.format(python=shlex.quote(str(VENV_PY)), port=self.port,
                                  name=f"bench{self.port}", data_dir=shlex.quote(self.data_dir))
        self.cmd = cmd
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.has_store = True  # until the broker says otherwise (an older haqueue, another broker)

    def start(self) -> None:
        log(f"starting {self.label}: {self.cmd}")
        self.logf = open(self.log_path, "ab")  # appended to across restarts
        self.proc = subprocess.Popen(shlex.split(self.cmd), cwd=REPO, stdout=self.logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_set_nice)
        self.pid = self.proc.pid
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} exited with {self.proc.returncode} during startup; "
                                   f"log tail:\n{self.log_tail()}")
            if port_open(self.port):
                log(f"{self.label} listening on {HOST}:{self.port} (pid {self.pid})")
                return
            time.sleep(0.02)  # fine enough to time a recovery
        raise RuntimeError(f"{self.label} not listening on {self.port} after {self.startup_timeout} s; "
                           f"log tail:\n{self.log_tail()}")

    def describe_failure(self) -> str:
        state = "alive" if self.proc and self.proc.poll() is None else f"exited rc={self.proc and self.proc.returncode}"
        return f"broker process {state}; log {self.log_path} tail:\n{self.log_tail(15)}"

    def prepare_queue(self, queue: str) -> None:
        """Declared over the management API with queue_arguments; without any, auto-created on attach."""
        if self.queue_arguments:
            code, desc, _ = admin_request(f"{HOST}:{self.port}", "CREATE", "queue", queue, self.queue_arguments)
            if code >= 400:
                raise RuntimeError(f"could not declare {queue} with {self.queue_arguments}: {code} {desc}")

    def counters(self) -> dict[str, int]:
        found = store_syncs([f"{HOST}:{self.port}"]) if self.has_store else {}
        self.has_store = bool(found)
        return found

    def kill(self) -> None:
        """SIGKILL the broker's process group (a crash), keeping its data dir for a restart."""
        log(f"kill -9 {self.label} (pid {self.pid})")
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.logf.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            log(f"stopping {self.label} (pid {self.pid})")
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log(f"{self.label} ignored SIGTERM for 10 s; SIGKILL")
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        if self.proc is not None:
            self.logf.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)


class RabbitQueues:
    """What every RabbitMQ set-up here shares: queues declared over AMQP 0-9-1 (pika), addressed as
    /amq/queue/NAME over AMQP 1.0, on the node listening on self.port."""

    port: int

    def wait_listening(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not port_open(self.port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"RabbitMQ not listening on {self.port}")
            time.sleep(0.5)

    def _pika(self):
        import pika  # pip install pika into the venv
        return pika.BlockingConnection(pika.ConnectionParameters(HOST, self.port, connection_attempts=3,
                                                                 retry_delay=1, socket_timeout=10))

    def address(self, queue: str) -> str:
        return f"/amq/queue/{queue}"

    def declare(self, queue: str, arguments: dict) -> None:
        """A durable queue of the given kind, emptied."""
        c = self._pika()
        try:
            ch = c.channel()
            ch.queue_declare(queue, durable=True, arguments=arguments)
            ch.queue_purge(queue)
        finally:
            c.close()

    def drop_queue(self, queue: str) -> None:
        try:
            c = self._pika()
            try:
                c.channel().queue_delete(queue)
            finally:
                c.close()
        except Exception as e:  # best effort cleanup
            log(f"could not delete queue {queue}: {e}")


class RabbitBroker(RabbitQueues, Broker):
    """RabbitMQ 3.10 from Debian, AMQP 1.0 plugin, durable classic queue declared over 0-9-1 (pika)."""

    label = "RabbitMQ 3.10 classic"

    def __init__(self, port: int | None):
        # A node started here listens on free loopback ports (AMQP and Erlang
        # distribution), so a stray process on 5672/25672 cannot stop it booting.
        self.port = port or free_port()
        self.dist_port = free_port()
        self.started_here = False
        self.epmd_was_running = False
        self.env = dict(os.environ,
                        RABBITMQ_NODE_IP_ADDRESS=HOST,
                        RABBITMQ_NODE_PORT=str(self.port),
                        RABBITMQ_DIST_PORT=str(self.dist_port),
                        ERL_EPMD_ADDRESS=HOST,
                        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}")
        self.version = "?"

    def _ctl(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        return run_cmd(["rabbitmqctl", *args], timeout=timeout, env=self.env, check=check)

    def _running(self) -> bool:
        try:
            r = run_cmd(["rabbitmq-diagnostics", "-q", "check_running"], timeout=30, env=self.env, check=False)
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0

    def start(self) -> None:
        if shutil.which("rabbitmq-server") is None:
            raise RuntimeError("rabbitmq-server not installed (apt-get install -y rabbitmq-server)")
        # before any CLI call: the Erlang CLI tools start epmd themselves
        self.epmd_was_running = any(
            (f := _stat_fields(int(p))) is not None and f[0] != "Z"
            for p in subprocess.run(["pgrep", "-x", "epmd"], capture_output=True, text=True).stdout.split())
        if self._running():
            log("RabbitMQ already running: using it, and leaving it running afterwards")
            listeners = self._ctl("eval", "[P || {listener, _, amqp, _, _, P, _} <- rabbit_networking:active_listeners()].")
            ports = [int(x) for x in listeners.stdout.strip().strip("[]").split(",") if x.strip().isdigit()]
            if ports and self.port not in ports:
                self.port = ports[0]
        else:
            run_cmd(["rabbitmq-plugins", "enable", "--offline", "rabbitmq_amqp1_0"], timeout=60, env=self.env)
            log(f"starting RabbitMQ (rabbitmq-server -detached; AMQP port {self.port}, dist port {self.dist_port})")
            run_cmd(["rabbitmq-server", "-detached"], timeout=60, env=self.env, check=False)
            self.started_here = True
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    self._ctl("await_startup", "--timeout", "30", timeout=40, check=False)
                except subprocess.TimeoutExpired:
                    pass
                if self._running():
                    break
                time.sleep(2)
            else:
                logs = sorted(Path("/var/log/rabbitmq").glob("rabbit@*.log"), key=lambda p: p.stat().st_mtime)
                tail = logs[-1].read_text(errors="replace").splitlines()[-5:] if logs else []
                raise RuntimeError("RabbitMQ did not finish booting within 120 s; log tail: " + " / ".join(tail))
        out = self._ctl("eval", "os:getpid().").stdout.strip().strip('"')
        self.pid = int(out)
        if NICE:
            renice_tree(self.pid, NICE)
        self.version = self._ctl("version").stdout.strip()
        self.label = f"RabbitMQ {self.version} classic" + "".join(f", {k} {v}" for k, v in self.queue_arguments.items())
        self.wait_listening()
        log(f"RabbitMQ {self.version} running (beam pid {self.pid}, port {self.port})")

    def prepare_queue(self, queue: str) -> None:
        self.declare(queue, {"x-queue-type": "classic", **self.queue_arguments})

    def describe_failure(self) -> str:
        return "RabbitMQ " + ("running" if self._running() else "NOT running")

    def stop(self) -> None:
        if not self.started_here:
            return
        log("stopping RabbitMQ (rabbitmqctl stop)")
        try:
            self._ctl("stop", timeout=60, check=False)
        except subprocess.TimeoutExpired:
            log("rabbitmqctl stop timed out")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            f = _stat_fields(self.pid)
            if f is None or f[0] == "Z":
                break
            time.sleep(0.5)
        else:
            log(f"beam pid {self.pid} still running 30 s after rabbitmqctl stop")
        if not self.epmd_was_running:
            # epmd (started by rabbitmq-server) refuses -kill while a node is still registered
            for _ in range(20):
                r = subprocess.run(["epmd", "-kill"], capture_output=True, text=True, timeout=10, env=self.env)
                if "Killed" in r.stdout or "cannot connect" in (r.stdout + r.stderr).lower():
                    break
                time.sleep(1)
            else:
                log(f"could not stop epmd: {r.stdout.strip()} {r.stderr.strip()}")


# ---------------------------------------------------------------- one run

def client_args(broker: Broker, address: str) -> list[str]:
    a = ["--host", HOST, "--port", str(broker.port_for(address)), "--address", address]
    if broker.username:
        a += ["--username", broker.username, "--password", broker.password]
    return a


def run_pair(broker: Broker, queue: str, prod_args: list[str], cons_args: list[str], limit: float,
             meter: CpuMeter | None, clients: str = "rhea") -> dict:
    """One producer and one consumer on `queue` (run_pairs with one queue)."""
    return run_pairs(broker, [queue], prod_args, cons_args, limit, meter, clients)


# Per-client figures summed over the pairs, and those that take the earliest or the latest.
_SUMMED = ("client_cpu_us", "sent", "settled", "accepted", "released", "rejected", "modified", "other_outcome",
           "received", "missing", "duplicates", "out_of_order", "redelivered", "stray", "settle_rate", "recv_rate")
_EARLIEST, _LATEST = ("first_send_us", "first_recv_us"), ("last_send_us", "last_settle_us", "last_recv_us")


def _merged(results: list[dict]) -> dict:
    """The clients of one role over every pair, as if one client: counts summed, spans outermost."""
    if len(results) == 1:
        return results[0]
    out = dict(results[0])
    out["ok"] = all(r.get("ok") for r in results)
    out["errors"] = [e for r in results for e in r.get("errors", [])]
    for key in _SUMMED:
        if key in out:
            out[key] = sum(r.get(key) or 0 for r in results)
    for key in _EARLIEST:
        if key in out:
            out[key] = min(r[key] for r in results if r.get(key))
    for key in _LATEST:
        if key in out:
            out[key] = max(r.get(key) or 0 for r in results)
    return out


def run_pairs(broker: Broker, queues: list[str], prod_args: list[str], cons_args: list[str], limit: float,
              meter: CpuMeter | None, clients: str = "rhea") -> dict:
    """A producer and a consumer process per queue: the consumers first (until each link is attached),
    then the producers; all bounded by `limit` seconds. `producer` and `consumer` are the pairs' merged."""
    OUT.mkdir(exist_ok=True)
    errlog = OUT / "clients.stderr.log"
    procs: list[subprocess.Popen] = []
    res: dict = {"queue": queues[0], "pairs": len(queues)}
    addresses = broker.spread(queues)
    try:
        consumers = []
        for address in addresses:
            args = client_args(broker, address) + cons_args + ["--timeout", str(int(limit))]
            procs.append(start_client(clients, "consumer", args, errlog))
            consumers.append(JsonLines(procs[-1]))
        for cr in consumers:
            if cr.wait_for(lambda o: o.get("event") == "ready", time.monotonic() + 20) is None:
                res["error"] = "consumer did not attach within 20 s"
                return res
        if meter:
            meter.start()
        t0 = time.monotonic()
        producers = []
        for address in addresses:
            args = client_args(broker, address) + prod_args + ["--timeout", str(int(limit))]
            procs.append(start_client(clients, "producer", args, errlog))
            producers.append(JsonLines(procs[-1]))
        deadline = time.monotonic() + limit + 15
        ps = [pr.wait_for(lambda o: o.get("role") == "producer", deadline) for pr in producers]
        cs = [cr.wait_for(lambda o: o.get("role") == "consumer", deadline) for cr in consumers]
        res["wall_s"] = time.monotonic() - t0
        if meter:
            res["cpu"] = meter.stop()
        if None in ps or None in cs:
            res["error"] = "client gave no result (%s%s)" % ("producer " if None in ps else "",
                                                             "consumer" if None in cs else "")
            return res
        p, c = _merged(ps), _merged(cs)  # type: ignore[arg-type]
        res["producer"], res["consumer"] = p, c
        if not (p.get("ok") and c.get("ok")):
            res["error"] = "; ".join(p.get("errors", []) + c.get("errors", [])) or "client reported failure"
        return res
    finally:
        for proc in reversed(procs):
            stop_proc(proc)


def message_options(args) -> list[str]:
    """The producers' options for what each message's header says: durable, and with bench/interleave.py's
    +prioN set-ups every priority 0-9 in turn (args.priorities)."""
    return (["--durable"] if args.durable else []) + (
        ["--priorities", str(args.priorities)] if getattr(args, "priorities", 0) else [])


def saturation(broker: Broker, size: int, n: int, args, clients: str = "rhea", pairs: int = 1) -> dict:
    """n messages as fast as they go; with `pairs`, through that many queues at once, each with its own
    producer and consumer process (n / pairs each): the figures are the aggregate."""
    tag = uuid.uuid4().hex[:8]
    queues = [f"bench-sat-{size}-{tag}" + (f"-{i}" if pairs > 1 else "") for i in range(pairs)]
    each = n // pairs
    n = each * pairs
    for queue in queues:
        broker.prepare_queue(queue)
    try:
        warm = min(max(each // 10, 2000), 20000, max(10, WARM_BYTES // size))
        # the warm-up numbers its messages from WARM_SEQ, so a leftover is told apart from the measured run's
        w = run_pairs(broker, queues, ["--messages", str(warm), "--size", str(size), "--inflight", str(args.inflight),
                                       "--seq-base", str(WARM_SEQ)] + message_options(args),
                      ["--messages", str(warm), "--credit", str(args.credit), "--seq-base", str(WARM_SEQ)],
                      60 + warm / 500, None, clients)
        if "error" in w:
            return {"error": "warm-up: " + w["error"], "raw": w}
        cal = calibrate()
        meter = CpuMeter(broker)
        limit = 60 + n / 1000
        r = run_pairs(broker, queues, ["--messages", str(each), "--size", str(size), "--inflight", str(args.inflight)]
                      + message_options(args),
                      ["--messages", str(each), "--credit", str(args.credit)], limit, meter, clients)
    finally:
        for queue in queues:
            broker.drop_queue(queue)
    if "error" in r:
        return {"error": r["error"], "raw": r}
    p, c = r["producer"], r["consumer"]
    span_us = c["last_recv_us"] - p["first_send_us"]
    return {
        "msgs_per_s": n / (span_us / 1e6),
        "producer_settle_rate": p["settle_rate"],
        "consumer_rate": c["recv_rate"],
        "broker_cpu_us_per_msg": r["cpu"]["cpu_us_tree"] / n,
        "broker_cpu_us_per_msg_root": r["cpu"]["cpu_us_root"] / n,
        "broker_sys_us_per_msg": r["cpu"]["sys_us_tree"] / n,
        "calibration_ms": cal,
        "producer_cpu_us_per_msg": p["client_cpu_us"] / n,
        "consumer_cpu_us_per_msg": c["client_cpu_us"] / n,
        "missing": c["missing"], "duplicates": c["duplicates"], "out_of_order": c["out_of_order"],
        "redelivered": c["redelivered"], "stray": c["stray"],
        "other_load_cores": other_load(r),
        **syncs(r, n),
        "raw": r,
    }


def syncs(r: dict, n: int) -> dict:
    """fsyncs per second and messages per fsync over a measured run, if the set-up counts them."""
    count = r["cpu"]["counters"].get("syncs")
    if count is None:
        return {}
    return {"syncs": count, "syncs_per_s": count / r["cpu"]["wall_s"], "msgs_per_sync": n / count if count else None}


def messages_for(n: int, size: int) -> int:
    """A saturation run's messages: n, or fewer of large bodies (RUN_BYTES)."""
    return min(n, max(100, RUN_BYTES // size))


def rate_for(rate: float, size: int) -> float:
    """The fixed-rate run's msg/s: rate, or less for large bodies (LATENCY_BYTES_PER_S)."""
    return min(rate, max(1, LATENCY_BYTES_PER_S // size))


def latency(broker: Broker, size: int, args, clients: str = "rhea") -> dict:
    queue = f"bench-lat-{size}-{uuid.uuid4().hex[:8]}"
    broker.prepare_queue(queue)
    rate = rate_for(args.rate, size)
    n = int(round(rate * args.duration))
    try:
        meter = CpuMeter(broker)
        r = run_pair(broker, queue,
                     ["--rate", str(rate), "--duration", str(args.duration), "--size", str(size),
                      "--inflight", str(args.inflight)] + message_options(args),
                     ["--messages", str(n), "--credit", str(args.credit), "--warmup", str(min(int(rate), n // 2))],
                     args.duration + 60, meter, clients)
    finally:
        broker.drop_queue(queue)
    if "error" in r:
        return {"error": r["error"], "raw": r}
    p, c = r["producer"], r["consumer"]
    lat = c["latency"]
    return {
        "rate": p["send_rate"], "rate_target": rate,
        "p50_ms": lat["p50_us"] / 1000, "p90_ms": lat["p90_us"] / 1000, "p99_ms": lat["p99_us"] / 1000,
        "p999_ms": lat["p999_us"] / 1000, "max_ms": lat["max_us"] / 1000, "n": lat["n"],
        "p99_all_ms": c["latency_all"]["p99_us"] / 1000,
        "broker_cpu_us_per_msg": r["cpu"]["cpu_us_tree"] / n,
        "broker_sys_us_per_msg": r["cpu"]["sys_us_tree"] / n,
        "missing": c["missing"], "duplicates": c["duplicates"], "stray": c["stray"],
        "other_load_cores": other_load(r),
        **syncs(r, n),
        "raw": r,
    }


def smoke(broker: Broker) -> dict:
    """Ten messages through, bounded at 30 s: is the broker usable at all?"""
    queue = f"bench-smoke-{uuid.uuid4().hex[:8]}"
    broker.prepare_queue(queue)
    try:
        return run_pair(broker, queue, ["--messages", "10", "--size", "100"], ["--messages", "10"], 30, None)
    finally:
        broker.drop_queue(queue)


def wait_quiet(max_wait: float, threshold: float = 0.3, window: float = 3.0) -> float:
    """Wait (at most max_wait s) until the machine's busy CPU over `window` s is below `threshold`
    cores; returns the last reading. Our own broker idles meanwhile, so it counts in the reading."""
    deadline = time.monotonic() + max_wait
    while True:
        m0 = machine_busy_ticks()
        time.sleep(window)
        busy = (machine_busy_ticks() - m0) / CLK_TCK / window
        if busy < threshold:
            return busy
        if time.monotonic() >= deadline:
            log(f"machine still busy ({busy:.2f} cores) after waiting {max_wait:g} s; going on")
            return busy
        log(f"machine busy ({busy:.2f} cores from other processes); waiting for it to settle")


def calibrate() -> float:
    """CPU ms for a fixed pure-Python loop (median of 5): how fast this (virtual) machine's CPU is
    right now. Figures from runs whose calibration differs are not directly comparable."""
    times = []
    for _ in range(6):
        t0 = time.process_time()
        x = 0
        for i in range(300_000):
            x = (x * 31 + i) & 0xFFFFFFFF
        times.append((time.process_time() - t0) * 1000)
    return statistics.median(times[1:])  # the first round lets the CPU wake up


def bench_broker(broker: Broker, args) -> dict:
    out: dict = {"label": broker.label, "saturation": {}, "latency": {}}
    if args.quiet_wait > 0:
        out["background_cores_at_start"] = wait_quiet(args.quiet_wait)
    out["calibration_ms"] = calibrate()
    log(f"CPU calibration: {out['calibration_ms']:.1f} ms for the fixed loop")
    s = smoke(broker)
    if "error" in s:
        out["error"] = f"smoke test failed: {s['error']}; {broker.describe_failure()}"
        log(out["error"])
        return out
    for size in args.sizes:
        runs = []
        n = messages_for(args.messages, size)
        for i in range(args.repeat):
            if not broker.alive():
                break
            log(f"{broker.label}: saturation {size} B, run {i + 1}/{args.repeat}, {n} messages")
            r = saturation(broker, size, n, args)
            if "error" in r:
                r["broker_state"] = broker.describe_failure()
                log(f"  FAILED: {r['error']}")
            else:
                log(f"  {r['msgs_per_s']:.0f} msg/s, broker {r['broker_cpu_us_per_msg']:.1f} µs/msg "
                    f"({r['broker_sys_us_per_msg']:.1f} in the kernel), clients {r['producer_cpu_us_per_msg']:.1f}+{r['consumer_cpu_us_per_msg']:.1f} µs/msg, "
                    f"other load {r['other_load_cores']:.2f} cores, calibration {r['calibration_ms']:.1f} ms")
            runs.append(r)
        out["saturation"][size] = runs
    for size in args.sizes:
        if not broker.alive():
            break
        log(f"{broker.label}: latency {size} B at {rate_for(args.rate, size):g} msg/s for {args.duration:g} s")
        r = latency(broker, size, args)
        if "error" in r:
            r["broker_state"] = broker.describe_failure()
            log(f"  FAILED: {r['error']}")
        else:
            log(f"  p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, max {r['max_ms']:.2f} ms, "
                f"broker {r['broker_cpu_us_per_msg']:.1f} µs/msg ({r['broker_sys_us_per_msg']:.1f} in the kernel), "
                f"other load {r['other_load_cores']:.2f} cores")
        out["latency"][size] = r
    if not broker.alive():
        out["error"] = "broker process gone during the run; " + broker.describe_failure()
    return out


def bench_python_clients(broker: Broker, args) -> dict:
    """One extra row: the same broker driven by proton's Python clients (100 B; fewer messages, one run)."""
    label = f"{broker.label}, proton Python clients"
    out: dict = {"label": label, "saturation": {}, "latency": {}, "clients": "proton"}
    size = args.sizes[0]
    n = min(args.messages, 50000)
    log(f"{label}: saturation {size} B, {n} messages")
    r = saturation(broker, size, n, args, clients="proton")
    if "error" in r:
        r["broker_state"] = broker.describe_failure()
        log(f"  FAILED: {r['error']}")
    else:
        log(f"  {r['msgs_per_s']:.0f} msg/s, broker {r['broker_cpu_us_per_msg']:.1f} µs/msg, "
            f"clients {r['producer_cpu_us_per_msg']:.1f}+{r['consumer_cpu_us_per_msg']:.1f} µs/msg")
    out["saturation"][size] = [r]
    if broker.alive():
        log(f"{label}: latency {size} B at {args.rate:g} msg/s for {args.duration:g} s")
        r = latency(broker, size, args, clients="proton")
        if "error" in r:
            log(f"  FAILED: {r['error']}")
        else:
            log(f"  p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, broker {r['broker_cpu_us_per_msg']:.1f} µs/msg "
                f"({r['broker_sys_us_per_msg']:.1f} in the kernel)")
        out["latency"][size] = r
    return out


# ---------------------------------------------------------------- report

def size_name(size: int) -> str:
    if size >= 2 ** 20 and size % 2 ** 20 == 0:
        return f"{size // 2 ** 20} MB"
    return f"{size} B" if size < 1024 or size % 1024 else f"{size // 1024} KB"


def agg(runs: list[dict]) -> dict | None:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return None
    rates = [r["msgs_per_s"] for r in ok]
    cpus = [r["broker_cpu_us_per_msg"] for r in ok]
    return {
        "n": len(ok), "failed": len(runs) - len(ok),
        "rate": statistics.median(rates), "rate_min": min(rates), "rate_max": max(rates),
        "cpu": statistics.median(cpus), "cpu_min": min(cpus), "cpu_max": max(cpus),
        "clients": statistics.median(r["producer_cpu_us_per_msg"] + r["consumer_cpu_us_per_msg"] for r in ok),
        "other": max(r["other_load_cores"] for r in ok),
        "cal": statistics.median(r["calibration_ms"] for r in ok),
    }


def fmt_range(med: float, lo: float, hi: float, n: int, digits: int = 0) -> str:
    f = f"{{:.{digits}f}}"
    if n <= 1:
        return f.format(med)
    return f"{f.format(med)} ({f.format(lo)}–{f.format(hi)})"


def markdown(results: list[dict], args, command: str) -> str:
    now = _dt.datetime.now().astimezone()
    lines = [f"## Throughput and latency vs RabbitMQ (bench/run.py), {now:%Y-%m-%d %H:%M %Z}", "",
             "```", command, "```", ""]
    node_v = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    lines.append(f"Machine: {os.cpu_count()} cores, Linux {platform.release()}, node {node_v}, rhea 3.0.5 "
                 f"(one producer process, one consumer process), Python {platform.python_version()}.")
    lines.append(f"Settings: at-least-once (producer keeps ≤ {args.inflight} unsettled, consumer accepts with "
                 f"credit {args.credit}); messages {'durable' if args.durable else 'not durable (header.durable unset)'}; "
                 f"saturation = {args.messages} messages after a warm-up (of large bodies at most "
                 f"{RUN_BYTES // 2 ** 30} GiB of them), median of {args.repeat} "
                 f"(range in brackets); latency = {args.rate:g} msg/s for {args.duration:g} s, first second left out. "
                 + (f"Brokers and clients ran at niceness {args.nice}. " if args.nice else "") +
                 f"Broker CPU = utime+stime of the broker's process tree per message.")
    lines.append("")
    lines.append("Calibration = CPU ms of a fixed pure-Python loop run just before each measured saturation run "
                 "(median over the runs): this VM's CPU speed varies by up to ~1.7× from minute to minute, so "
                 "compare CPU figures of different runs only at similar calibration.")
    lines.append("")
    lines.append("Clients CPU = producer + consumer CPU per message. Other load = cores used during the measured "
                 "runs by everything else on the machine (worst run); the machine has 2 cores, so broker and clients "
                 "share them and anything else running skews the figures.")
    lines.append("")
    lines.append("| broker | body | msg/s (saturation) | broker CPU µs/msg | clients CPU µs/msg | "
                 f"p50 / p99 ms @ {args.rate:g}/s | broker CPU µs/msg @ {args.rate:g}/s | other load (cores) | calibration ms |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    problems = []
    for b in results:
        if "error" in b and not any(b["saturation"].values()):
            lines.append(f"| {b['label']} | — | failed | | | | | | |")
            problems.append(f"{b['label']}: {b['error']}")
            continue
        for size in args.sizes:
            if size not in b["saturation"] and size not in b["latency"]:
                continue
            a = agg(b["saturation"].get(size, []))
            l = b["latency"].get(size)
            sat = fmt_range(a["rate"], a["rate_min"], a["rate_max"], a["n"]) if a else "failed"
            cpu = fmt_range(a["cpu"], a["cpu_min"], a["cpu_max"], a["n"], 1) if a else ""
            cl = f"{a['clients']:.1f}" if a else ""
            if a and a["failed"]:
                sat += f" ({a['failed']} run(s) failed)"
            if l is None:
                lat, lcpu = "not run", ""
            elif "error" in l:
                lat, lcpu = "failed", ""
            else:
                lat, lcpu = f"{l['p50_ms']:.2f} / {l['p99_ms']:.2f}", f"{l['broker_cpu_us_per_msg']:.1f}"
                if rate_for(args.rate, size) != args.rate:
                    lat += f" (@ {rate_for(args.rate, size):g}/s)"
            loads = ([a["other"]] if a else []) + ([l["other_load_cores"]] if l and "error" not in l else [])
            other = f"{max(loads):.2f}" if loads else ""
            calib = f"{a['cal']:.1f}" if a else ""
            lines.append(f"| {b['label']} | {size_name(size)} | {sat} | {cpu} | {cl} | {lat} | {lcpu} | {other} | {calib} |")
            for r in b["saturation"].get(size, []):
                if "error" in r:
                    problems.append(f"{b['label']} saturation {size_name(size)}: {r['error']} "
                                    f"[{r.get('broker_state', '')}]")
                elif r["missing"] or r["duplicates"] or r["stray"]:
                    problems.append(f"{b['label']} saturation {size_name(size)}: missing {r['missing']}, "
                                    f"duplicates {r['duplicates']}, strays from the warm-up {r['stray']}")
            if l is not None and "error" in l:
                problems.append(f"{b['label']} latency {size_name(size)}: {l['error']} [{l.get('broker_state', '')}]")
    lines.append("")
    lines.append(f"Latency detail at {args.rate:g} msg/s (ms, after the first second):")
    lines.append("")
    lines.append("| broker | body | n | p50 | p90 | p99 | p99.9 | max | p99 incl. first second |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for b in results:
        for size in args.sizes:
            l = b["latency"].get(size)
            if l and "error" not in l:
                lines.append(f"| {b['label']} | {size_name(size)} | {l['n']} | {l['p50_ms']:.2f} | {l['p90_ms']:.2f} | "
                             f"{l['p99_ms']:.2f} | {l['p999_ms']:.2f} | {l['max_ms']:.2f} | {l['p99_all_ms']:.2f} |")
    lines.append("")

    hq = next((b for b in results if not b["label"].startswith("RabbitMQ")), None)
    rq = next((b for b in results if b["label"].startswith("RabbitMQ")), None)
    if hq and rq:
        lines.append(f"Ratio {hq['label']} / {rq['label']}:")
        lines.append("")
        lines.append("| body | msg/s | broker CPU µs/msg | p99 @ fixed rate |")
        lines.append("|---|---|---|---|")
        for size in args.sizes:
            a, b = agg(hq["saturation"].get(size, [])), agg(rq["saturation"].get(size, []))
            la, lb = hq["latency"].get(size), rq["latency"].get(size)
            rate = f"{a['rate'] / b['rate']:.2f}×" if a and b else "—"
            cpu = f"{a['cpu'] / b['cpu']:.2f}×" if a and b else "—"
            p99 = (f"{la['p99_ms'] / lb['p99_ms']:.2f}×" if la and lb and "error" not in la and "error" not in lb
                   else "—")
            lines.append(f"| {size_name(size)} | {rate} | {cpu} | {p99} |")
        lines.append("")
    if hq:
        lines.append(f"Targets ({hq['label']}):")
        lines.append("")
        lines.append("| target | " + " | ".join(size_name(s) for s in args.sizes) + " |")
        lines.append("|---|" + "---|" * len(args.sizes))
        row_cpu, row_rate, row_p99 = [], [], []
        for size in args.sizes:
            a = agg(hq["saturation"].get(size, []))
            b = agg(rq["saturation"].get(size, [])) if rq else None
            l = hq["latency"].get(size)
            row_cpu.append(f"{a['cpu']:.1f} {'met' if a['cpu'] <= 15 else 'NOT met'}" if a else "—")
            row_rate.append(f"{a['rate'] / b['rate']:.2f}× {'met' if a['rate'] >= 3 * b['rate'] else 'NOT met'}"
                            if a and b else "—")
            row_p99.append(f"{l['p99_ms']:.2f} ms {'met' if l['p99_ms'] <= 2 else 'NOT met'}"
                           if l and "error" not in l else "—")
        lines.append("| ≤ 15 µs broker CPU per message at saturation | " + " | ".join(row_cpu) + " |")
        lines.append("| msg/s ≥ 3× RabbitMQ classic | " + " | ".join(row_rate) + " |")
        lines.append(f"| p99 ≤ 2 ms at {args.rate:g} msg/s | " + " | ".join(row_p99) + " |")
        lines.append("")
    if problems:
        lines.append("Problems seen:")
        lines.append("")
        for p in problems:
            lines.append("- " + p.replace("\n", " / "))
        lines.append("")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main

def record(md: str) -> None:
    """Append a section to bench/RESULTS.md (re-read right before, as other runs may have appended)."""
    if not RESULTS.exists():
        RESULTS.write_text("# Benchmark results\n\nAppended by `bench/run.py` (see bench/README.md); newest last.\n\n")
    text = RESULTS.read_text()
    sep = "" if text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
    with open(RESULTS, "a") as f:
        f.write(sep + md)


def print_and_record(md: str, no_record: bool) -> None:
    """Print a section and, unless no_record, append it to bench/RESULTS.md."""
    print(md)
    if not no_record:
        record(md)
        log(f"appended to {RESULTS}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["haqueue", "rabbitmq"], help="run one broker only")
    ap.add_argument("--messages", type=int, default=200000, help="messages per saturation run (default 200000)")
    ap.add_argument("--repeat", type=int, default=3, help="saturation runs per size; the median is reported")
    ap.add_argument("--duration", type=float, default=10, help="seconds of the fixed-rate latency run (default 10)")
    ap.add_argument("--rate", type=float, default=1000, help="msg/s of the latency run (default 1000)")
    ap.add_argument("--sizes", default="100,1024", help="body sizes in bytes, comma-separated (default 100,1024)")
    ap.add_argument("--large", action="store_true",
                    help="add 64 KB, 1 MB and 10 MB bodies to --sizes (a run moves at most 3 GiB of them; their "
                         "fixed-rate run goes at most 100 MiB/s: 1 MB at 100 msg/s)")
    ap.add_argument("--inflight", type=int, default=1000, help="producer's unsettled limit (default 1000)")
    ap.add_argument("--credit", type=int, default=1000, help="consumer's credit window (default 1000)")
    ap.add_argument("--durable", action="store_true", help="send messages with header.durable=true")
    ap.add_argument("--broker-cmd", default=DEFAULT_HAQUEUE_CMD,
                    help="command that runs the broker under test; {python} {port} {name} {data_dir} are filled in "
                         "(default: %(default)s)")
    ap.add_argument("--broker-label", default=None, help="row label for --broker-cmd (default 'haqueue')")
    ap.add_argument("--broker-port", type=int, default=None,
                    help="port the broker command serves clients on (default: a free port passed as {port})")
    ap.add_argument("--startup-timeout", type=float, default=30)
    ap.add_argument("--rabbitmq-port", type=int, default=None,
                    help="AMQP port for a RabbitMQ node started here (default: a free port)")
    ap.add_argument("--quiet-wait", type=float, default=180,
                    help="before each broker, wait up to this many seconds for the machine to be idle "
                         "(< 0.3 cores busy over 3 s); 0: don't wait (default 180)")
    ap.add_argument("--nice", type=int, default=0,
                    help="niceness for the brokers and clients (e.g. -10; needs root). With the kernel's "
                         "autogroup scheduling it only orders processes of this session, not against other "
                         "sessions' load; default 0")
    ap.add_argument("--python-clients", action="store_true",
                    help="add a row: the broker under test driven by proton Python clients (first size only)")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = ap.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if args.large:
        args.sizes += [s for s in LARGE_SIZES if s not in args.sizes]
    global NICE
    NICE = args.nice
    if args.messages < 1000 or args.repeat < 1 or args.duration <= 0 or args.rate <= 0:
        ap.error("need --messages ≥ 1000, --repeat ≥ 1, --duration > 0, --rate > 0")
    if not (JS / "node_modules" / "rhea").exists():
        log("installing rhea (npm install in bench/js)")
        run_cmd(["npm", "install", "--no-audit", "--no-fund"], timeout=300, cwd=JS)
    command = "python bench/run.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    OUT.mkdir(exist_ok=True)

    results = []
    if args.only in (None, "haqueue"):
        label = args.broker_label or ("haqueue" if args.broker_cmd == DEFAULT_HAQUEUE_CMD else "haqueue (custom cmd)")
        b = CommandBroker(args.broker_cmd, label, args.broker_port, args.startup_timeout)
        try:
            b.start()
            results.append(bench_broker(b, args))
            if args.python_clients and b.alive():
                results.append(bench_python_clients(b, args))
        except Exception as e:
            log(f"{label}: {e}")
            results.append({"label": label, "saturation": {}, "latency": {}, "error": str(e)})
        finally:
            b.stop()
    if args.only in (None, "rabbitmq"):
        r = RabbitBroker(args.rabbitmq_port)
        try:
            r.start()
            results.append(bench_broker(r, args))
        except Exception as e:
            log(f"RabbitMQ: {e}")
            results.append({"label": r.label, "saturation": {}, "latency": {}, "error": str(e)})
        finally:
            r.stop()

    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw_path = OUT / f"results-{stamp}.json"
    raw_path.write_text(json.dumps({"command": command, "results": results}, indent=1, default=str))
    md = markdown(results, args, command)
    print(md)
    if not args.no_record:
        record(md)
        log(f"appended to {RESULTS}; raw JSON in {raw_path}")
    return 0 if all("error" not in b for b in results) else 1


if __name__ == "__main__":
    sys.exit(main())
