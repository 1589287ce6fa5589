#!/usr/bin/env python3
"""Replicated broker set-ups for the benchmarks, each a bench/run.py Broker (start, stop, queues, CPU
groups, counters): a haqueue cluster (`haqueue cluster up`, optionally with an `ha.sync` mode) and a
3-node RabbitMQ cluster with quorum queues; and the floor under them (`floor_run`, bench/floor/relay.c). Used by
bench/interleave.py and bench/ha_run.py."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import run as R  # noqa: E402  bench/run.py, used as a library

REPO = BENCH.parent
sys.path.insert(0, str(REPO))
import yaml  # noqa: E402
from haqueue.admin import AdminError  # noqa: E402

HOST = R.HOST
OUT = R.OUT
VENV_PY = R.VENV_PY
log = R.log


# ---------------------------------------------------------------- the floor

def floor_run(backups: int, rate: float, duration: float) -> dict:
    """bench/floor/relay.c at `rate` msg/s for `duration` s: the system calls a broker cannot avoid for a lone
    100-byte message (with `backups`, a primary's to them too), with nothing else. CPU per message (total and
    in the kernel) of the relay and its backups."""
    binary = R.compiled(BENCH / "floor" / "relay.c", "floor-relay")
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


# ---------------------------------------------------------------- ports, processes

def free_ports(n: int, consecutive: bool = False) -> list[int]:
    """n distinct free loopback ports (consecutive if asked: the supervisor's base-port + i)."""
    if not consecutive:
        out: list[int] = []
        while len(out) < n:
            p = R.free_port()
            if p not in out:
                out.append(p)
        return out
    for _ in range(200):
        base = R.free_port()
        if base + n > 65000:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind((HOST, p))
                except OSError:
                    ok = False
                    break
        if ok:
            return list(range(base, base + n))
    raise RuntimeError("no run of free consecutive ports found")


def pid_alive(pid: int) -> bool:
    f = R._stat_fields(pid)
    return f is not None and f[0] != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def terminate_group(proc: subprocess.Popen, what: str, grace: float = 15.0) -> None:
    """SIGTERM the process group of `proc` (started with start_new_session), SIGKILL after grace."""
    if proc is None or proc.poll() is not None:
        return
    log(f"stopping {what} (pid {proc.pid})")
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        log(f"{what} ignored SIGTERM for {grace:g} s; SIGKILL to its group")
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


# ---------------------------------------------------------------- the haqueue cluster

WATCH_PERIOD = 0.2  # seconds between two looks at the primary's view of its backups during a run


class BackupWatch(threading.Thread):
    """During a measured run, the primary's view of each backup (`admin ha status`, every WATCH_PERIOD
    s over one connection): the most it lagged (messages, seconds, unconfirmed), the states it went
    through, and its timeout drops; so a slow run can be told from a backup falling behind or being
    dropped and caught up again."""

    def __init__(self, endpoint: str, password: str):
        super().__init__(daemon=True)
        self.endpoint, self.password = endpoint, password
        self.done = threading.Event()
        self.backups: dict[str, dict] = {}
        self.samples = 0
        self.error = ""

    def _note(self, status: dict) -> None:
        self.samples += 1
        for b in status.get("backups", []):
            seen = self.backups.setdefault(b["name"], {"max_lag": 0, "max_lag_seconds": 0.0, "max_unconfirmed": 0,
                                                       "states": [], "timeout_drops_first": b.get("timeout_drops"),
                                                       "absent_samples": 0})
            seen["max_lag"] = max(seen["max_lag"], b.get("lag", 0))
            seen["max_lag_seconds"] = max(seen["max_lag_seconds"], b.get("lag_seconds", 0.0))
            seen["max_unconfirmed"] = max(seen["max_unconfirmed"], b.get("unconfirmed", 0))
            seen["timeout_drops"] = b.get("timeout_drops")
            seen["last_lag"] = b.get("lag", 0)
            if not seen["states"] or seen["states"][-1] != b.get("state"):
                seen["states"].append(b.get("state"))
        present = {b["name"] for b in status.get("backups", [])}
        for name, seen in self.backups.items():
            if name not in present:
                seen["absent_samples"] += 1

    def run(self) -> None:
        from haqueue.admin import AdminClient
        try:
            with AdminClient(self.endpoint, 3.0, "ha", self.password) as client:
                while True:
                    code, _, body = client.request("READ", "ha")
                    if code < 400 and isinstance(body, dict):
                        self._note(body)
                    if self.done.wait(WATCH_PERIOD):
                        code, _, body = client.request("READ", "ha")  # the state the run ended in
                        if code < 400 and isinstance(body, dict):
                            self._note(body)
                        return
        except (AdminError, OSError) as e:
            self.error = str(e)

    def stop(self) -> dict:
        self.done.set()
        self.join(10)
        return {"samples": self.samples, "backups": self.backups, **({"error": self.error} if self.error else {})}



class HaCluster(R.LoggedProcess, R.Broker):
    """`haqueue cluster up --size N [--sync MODE]`: supervisor + N brokers; clients use the public address.
    `tree`: run the haqueue of another tree (its brokers inherit the directory `python -m` imports from)."""

    def __init__(self, label: str, size: int = 3, sync: str | None = None, tree: Path = REPO, console: bool = False):
        self.label = label
        self.size = size
        self.tree = tree
        self.dir = tempfile.mkdtemp(prefix="haqueue-habench-")
        self.port = free_ports(1)[0]
        self.base = free_ports(size, consecutive=True)[0]
        OUT.mkdir(exist_ok=True)
        self.log_path = OUT / f"ha-cluster-{time.strftime('%Y%m%d-%H%M%S')}-{self.port}.log"
        self.cmd = [str(VENV_PY), "-m", "haqueue", "cluster", "up", "--size", str(size), "--dir", self.dir,
                    "--public", f"{HOST}:{self.port}", "--base-port", str(self.base)] + (["--sync", sync] if sync else [])
        # The web consoles, on ports of their own (cluster up's default ports may be another set-up's), or none; a
        # tree from before them has neither.
        self.console: str | None = None
        if "--console-port" in (tree / "haqueue" / "cli.py").read_text():
            first = free_ports(size, consecutive=True)[0] if console else 0
            self.cmd += ["--console-port", str(first)]
            self.console = f"http://{HOST}:{first}/" if console else None
        self.proc: subprocess.Popen | None = None
        self.password = ""
        self.roles: dict[str, str] = {}
        self.watch: BackupWatch | None = None
        self.log_marks: dict[str, int] = {}

    def command(self) -> str:
        return " ".join(shlex.quote(c) for c in self.cmd)

    def endpoint(self, i: int) -> str:
        return f"{HOST}:{self.base + i}"

    def start(self) -> None:
        log(f"starting {self.label}: {self.command()}")
        self.logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, cwd=self.tree, stdout=self.logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"cluster up exited with {self.proc.returncode}; log {self.log_path}:\n"
                                   + self.log_tail())
            if "public " in self.log_tail(50) and Path(self.dir, "broker-0.yaml").exists():
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"cluster not up after 60 s; log tail:\n{self.log_tail()}")
        self.password = yaml.safe_load(Path(self.dir, "broker-0.yaml").read_text())["ha"]["password"]
        self.wait_ready(60)
        log(f"{self.label}: public {HOST}:{self.port}, brokers {self.endpoint(0)}..{self.endpoint(self.size - 1)}, "
            f"roles {self.roles}, pids {self.members()}")

    def members(self) -> dict[str, int]:
        """broker name -> pid of its live process (children of the supervisor)."""
        out = {}
        for p in R.proc_tree(self.pid):
            c = cmdline(p)
            m = re.search(r"broker-(\d+)\.yaml", c)
            if m and "haqueue" in c and pid_alive(p):
                out[f"broker-{m.group(1)}"] = p
        return out

    def status(self, i: int, timeout: float = 2.0) -> dict | None:
        try:
            code, _, body = R.admin_request(self.endpoint(i), "READ", "ha", password=self.password, timeout=timeout)
        except AdminError:
            return None
        return body if code < 400 else None

    def all_status(self) -> dict[str, dict | None]:
        return {f"broker-{i}": self.status(i) for i in range(self.size)}

    def primary(self) -> tuple[str, int] | None:
        for name, st in self.all_status().items():
            if st and st.get("role") == "primary":
                return name, self.members().get(name, 0)
        return None

    def wait_ready(self, timeout: float) -> dict:
        """Until one primary is active and every other broker is a ready backup (bounded)."""
        deadline = time.monotonic() + timeout
        last = {}
        while time.monotonic() < deadline:
            last = self.all_status()
            prim = [n for n, s in last.items() if s and s.get("role") == "primary"]
            if len(prim) == 1:
                ps = last[prim[0]]
                backups = ps.get("backups", [])
                others = [s for n, s in last.items() if n != prim[0]]
                if (ps.get("state") == "active" and len(backups) == self.size - 1
                        and all(b.get("state") == "ready" for b in backups)
                        and all(s and s.get("role") == "backup" and s.get("state") == "ready" for s in others)):
                    self.roles = {n: ("primary" if n == prim[0] else "backup") for n in last}
                    return last
            time.sleep(0.2)
        raise RuntimeError(f"{self.label}: not all ready after {timeout:g} s: "
                           + json.dumps({n: s and {k: s.get(k) for k in ('role', 'state', 'backups')}
                                         for n, s in last.items()}))

    def cpu_groups(self) -> list:
        members = self.members()
        groups = []
        for name in sorted(members):
            groups.append((f"{self.roles.get(name, '?')} {name}", members[name], True))
        groups.append(("supervisor", self.pid, False))
        return groups

    def prepare_queue(self, queue: str) -> None:
        # auto-created on attach (auto_create ["*"], ha.replicate all); make sure the cluster is whole first
        self.wait_ready(60)

    def drop_queue(self, queue: str) -> None:
        try:
            # as the clients are (anonymous, allowed everything in `cluster up`): the peer user may not manage queues
            code, desc, _ = R.admin_request(f"{HOST}:{self.port}", "DELETE", "queue", queue)
            if code >= 400:
                log(f"could not delete queue {queue}: {code} {desc}")
        except AdminError as e:
            log(f"could not delete queue {queue}: {e}")

    def counters(self) -> dict[str, int]:
        """fsyncs of every broker's store, summed."""
        return R.store_syncs([self.endpoint(i) for i in range(self.size)], self.password)

    def watch_start(self) -> None:
        primary = next((n for n, role in self.roles.items() if role == "primary"), None)
        self.watch = BackupWatch(self.endpoint(int(primary.split("-")[1])), self.password) if primary else None
        self.log_marks = {p.name: p.stat().st_size for p in Path(self.dir).glob("broker-*.log")}
        if self.watch is not None:
            self.watch.start()

    def watch_stop(self) -> dict:
        """The backups as the primary saw them during the run, and the brokers' warnings logged meanwhile."""
        out = self.watch.stop() if self.watch is not None else {}
        warnings = []
        for path in sorted(Path(self.dir).glob("broker-*.log")):
            with open(path, "rb") as f:
                f.seek(self.log_marks.get(path.name, 0))
                warnings += [f"{path.stem}: {line.strip()}" for line in f.read().decode(errors="replace").splitlines()
                             if re.search(r"\b(ERROR|WARNING|CRITICAL)\b|Traceback", line)]
        if warnings:
            out["log_warnings"] = warnings[:50]
        return out

    def describe_failure(self) -> str:
        state = "alive" if self.proc and self.proc.poll() is None else "exited"
        return f"supervisor {state}; log {self.log_path} tail: " + " / ".join(self.log_tail(8).splitlines())

    def broker_log_problems(self) -> list[str]:
        """Lines of the brokers' and the supervisor's logs that are errors or warnings."""
        out = []
        for path in [self.log_path] + sorted(Path(self.dir).glob("broker-*.log")):
            try:
                lines = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                if re.search(r"\b(ERROR|WARNING|CRITICAL)\b|Traceback", line):
                    out.append(f"{path.name}: {line.strip()}")
        return out

    def stop(self) -> None:
        members = self.members() if self.proc and self.proc.poll() is None else {}
        if self.proc is not None:
            terminate_group(self.proc, self.label)
            self.logf.close()
        for name, p in members.items():  # the supervisor stops them; make sure
            for _ in range(50):
                if not pid_alive(p):
                    break
                time.sleep(0.2)
            else:
                log(f"{name} (pid {p}) still alive after the supervisor stopped; SIGKILL")
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        # keep the broker logs with the run's output, then remove the data
        for path in Path(self.dir).glob("broker-*.log"):
            shutil.copy(path, OUT / f"{self.log_path.stem}-{path.name}")
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------- RabbitMQ 3-node cluster

class RabbitCluster(R.RabbitQueues, R.Broker):
    """Three rabbitmq-server nodes on this machine, joined; a durable quorum queue per run."""

    label = "RabbitMQ 3-node cluster, quorum queue"

    def __init__(self):
        self.shorthost = socket.gethostname().split(".")[0]
        tag = uuid.uuid4().hex[:4]
        self.nodes = [f"habench{i}{tag}@{self.shorthost}" for i in (1, 2, 3)]
        ports = free_ports(6)
        self.ports, self.dist_ports = ports[:3], ports[3:]
        self.port = self.ports[0]
        self.base = tempfile.mkdtemp(prefix="rabbit-habench-")
        os.chmod(self.base, 0o755)
        shutil.chown(self.base, "rabbitmq", "rabbitmq")
        self.pids: list[int] = []
        self.started: list[str] = []
        self.version = "?"
        self.epmd_was_running = False
        self.leaders: list[str] = []

    def env(self, i: int) -> dict:
        return dict(os.environ, RABBITMQ_NODENAME=self.nodes[i], RABBITMQ_NODE_IP_ADDRESS=HOST,
                    RABBITMQ_NODE_PORT=str(self.ports[i]), RABBITMQ_DIST_PORT=str(self.dist_ports[i]),
                    ERL_EPMD_ADDRESS=HOST, RABBITMQ_MNESIA_BASE=f"{self.base}/mnesia",
                    RABBITMQ_LOG_BASE=f"{self.base}/log",
                    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}")

    def ctl(self, i: int, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        return R.run_cmd(["rabbitmqctl", "-n", self.nodes[i], *args], timeout=timeout, env=self.env(i), check=check)

    def _await(self, i: int) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                r = self.ctl(i, "await_startup", "--timeout", "30", timeout=45, check=False)
                if r.returncode == 0:
                    return
            except subprocess.TimeoutExpired:
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.nodes[i]} did not boot within 120 s; logs in {self.base}/log")

    def start(self) -> None:
        if shutil.which("rabbitmq-server") is None:
            raise RuntimeError("rabbitmq-server not installed (apt-get install -y rabbitmq-server)")
        self.epmd_was_running = bool(subprocess.run(["pgrep", "-x", "epmd"], capture_output=True,
                                                    text=True).stdout.split())
        R.run_cmd(["rabbitmq-plugins", "enable", "--offline", "rabbitmq_amqp1_0"], timeout=60, env=self.env(0))
        for i, node in enumerate(self.nodes):
            log(f"starting RabbitMQ node {node} (AMQP {self.ports[i]}, dist {self.dist_ports[i]})")
            R.run_cmd(["rabbitmq-server", "-detached"], timeout=60, env=self.env(i), check=False)
            self.started.append(node)
        for i in range(3):
            self._await(i)
            self.pids.append(int(self.ctl(i, "eval", "os:getpid().").stdout.strip().strip('"')))
        for i in (1, 2):
            log(f"joining {self.nodes[i]} to {self.nodes[0]}")
            self.ctl(i, "stop_app")
            self.ctl(i, "reset")
            self.ctl(i, "join_cluster", self.nodes[0], timeout=120)
            self.ctl(i, "start_app", timeout=120)
            self._await(i)
        status = self.ctl(0, "cluster_status", "--formatter", "json").stdout
        running = json.loads(status[status.index("{"):]).get("running_nodes", [])
        if sorted(running) != sorted(self.nodes):
            raise RuntimeError(f"cluster not formed: running nodes {running}")
        self.pid = self.pids[0]
        self.version = self.ctl(0, "version").stdout.strip()
        self.label = f"RabbitMQ {self.version} 3-node cluster, quorum queue"
        self.wait_listening()
        log(f"{self.label}: nodes {self.nodes}, beam pids {self.pids}, clients on port {self.port}")

    def cpu_groups(self) -> list:
        return [(f"node{i + 1}" + (" (clients)" if i == 0 else ""), p, True) for i, p in enumerate(self.pids)]

    def prepare_queue(self, queue: str) -> None:
        self.declare(queue, {"x-queue-type": "quorum", "x-quorum-initial-group-size": 3})
        try:
            out = self.ctl(0, "list_queues", "-q", "--no-table-headers", "name", "type", "leader", "members",
                           timeout=30, check=False).stdout
            for line in out.splitlines():
                if line.startswith(queue):
                    self.leaders.append(line.strip())
        except subprocess.TimeoutExpired:
            pass

    def alive(self) -> bool:
        return all(pid_alive(p) for p in self.pids)

    def describe_failure(self) -> str:
        return "beam pids alive: " + ", ".join(f"{p}={pid_alive(p)}" for p in self.pids)

    def stop(self) -> None:
        for i in reversed(range(len(self.started))):
            log(f"stopping RabbitMQ node {self.nodes[i]}")
            try:
                self.ctl(i, "stop", timeout=60, check=False)
            except subprocess.TimeoutExpired:
                log(f"rabbitmqctl -n {self.nodes[i]} stop timed out")
        for p in self.pids:
            deadline = time.monotonic() + 30
            while pid_alive(p) and time.monotonic() < deadline:
                time.sleep(0.5)
            if pid_alive(p):
                log(f"beam pid {p} still running 30 s after rabbitmqctl stop; SIGKILL")
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.started and not self.epmd_was_running:
            for _ in range(10):
                r = subprocess.run(["epmd", "-kill"], capture_output=True, text=True, timeout=10,
                                   env=self.env(0))
                if "Killed" in r.stdout or "cannot connect" in (r.stdout + r.stderr).lower():
                    break
                time.sleep(1)
            else:
                log(f"epmd not stopped (another node registered?): {r.stdout.strip()} {r.stderr.strip()}")
        logdir = Path(self.base, "log")
        for path in logdir.glob("*.log"):
            shutil.copy(path, OUT / f"rabbit-habench-{time.strftime('%Y%m%d-%H%M%S')}-{path.name}")
        shutil.rmtree(self.base, ignore_errors=True)
