"""The local supervisor, `haqueue cluster up`: it prints each broker's address and the public
address, fails over when the primary is killed, and exits cleanly (brokers and all) on SIGTERM."""
from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from proton import ConnectionException
from proton.utils import BlockingConnection

from ha_harness import (HA_USER, AdminClient, AdminError, Load, browse, can_connect, free_port, receive, send_all,
                        split_address, wait_for)
from harness import REPO_ROOT, process_state, run_haqueue
from haqueue.config import TlsConfig
from tls_certs import CertificateAuthority

APP, APP_PASSWORD = "app", "app-secret"  # cluster up --config's user


def _free_run(n: int) -> int:
    """A base port with n consecutive free ports after it (bind-tested, all at once)."""
    for _ in range(50):
        base = free_port()
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                s.bind(("127.0.0.1", base + i))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no run of {n} free ports")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of a dead supervisor is not alive
    try:
        return process_state(pid) != "Z"
    except OSError:
        return False


class Supervised:
    def __init__(self, directory: Path, size: int = 3, tls: TlsConfig | None = None,
                 args: tuple[str, ...] = (), ports: int | None = None, code: Path = REPO_ROOT) -> None:
        """`code`: the haqueue tree the supervisor and its brokers run (the tests' upgrades point a symlink at
        a previous release's, then at this checkout's)."""
        self.directory = directory
        self.size = size
        self.tls = tls  # what the test's admin calls present (cluster up --tls)
        self.base = _free_run(ports or size)  # the brokers' ports (`ports` of them: a sharded cluster's)
        # their web consoles' (cluster up's default, 8672 on, may be taken here); a sharded cluster's: one per shard
        self.console = _free_run(ports or size)
        self.public = f"127.0.0.1:{free_port()}"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "haqueue", "cluster", "up", "--size", str(size), "--dir", str(directory),
             "--public", self.public, "--base-port", str(self.base), "--console-port", str(self.console), *args],
            stdout=subprocess.PIPE, stderr=open(directory.parent / "supervisor.err", "wb"), text=True,
            # `python -m` looks in its working directory first: a neutral one, where another tree is to run
            env=env, cwd=REPO_ROOT if code == REPO_ROOT else directory.parent, start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.broker_pids: set[int] = set()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def read_until(self, prefix: str, timeout: float) -> list[str]:
        def got():
            while not self.lines.empty():
                line = self.lines.get_nowait()
                if line is None:
                    raise AssertionError(f"cluster up exited ({self.proc.poll()}); printed {self.seen}; "
                                         f"stderr: {self.stderr()}")
                self.seen.append(line)
            return any(line.startswith(prefix) for line in self.seen)
        wait_for(got, timeout, message=f"a line starting {prefix!r} (so far {self.seen})")
        return self.seen

    def stderr(self) -> str:
        try:
            return (self.directory.parent / "supervisor.err").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def password(self) -> str:
        with open(self.directory / "broker-0.yaml", encoding="utf-8") as f:
            return yaml.safe_load(f)["ha"]["password"]

    def admin(self, address: str) -> AdminClient:
        return AdminClient(address, 3.0, HA_USER, self.password(), self.tls)

    def status(self, address: str):
        try:
            with self.admin(address) as a:
                return a.request("READ", "ha")[2]
        except Exception:  # noqa: BLE001 - not answering (dead or starting)
            return None

    def broker_pid(self, name: str) -> int | None:
        for pid in _children(self.proc.pid):
            self.broker_pids.add(pid)
            if f"{name}.yaml" in _cmdline(pid):
                return pid
        return None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.broker_pids.update(_children(self.proc.pid))
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for pid in self.broker_pids:      # brokers it left behind, by id
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def supervised(tmp_path):
    made: list[Supervised] = []

    def make(size: int = 3, **kw) -> Supervised:
        s = Supervised(tmp_path / f"cluster{len(made)}", size, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()
        for i in range(s.size):
            log = s.directory / f"broker-{i}.log"
            if log.exists():
                print(f"==== broker-{i} ====\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
        print("==== supervisor stderr ====\n" + s.stderr())


def test_cluster_up_prints_addresses_and_exits_on_sigterm(supervised, tmp_path):
    """With --config FILE: the file's users and `anonymous: false` in every broker, so clients log in, while the
    supervisor (it promotes and pings) and the backups still get in as the HA peer user that cluster up makes; the
    file's ha.sync beside cluster up's own ha keys. With --audit-dir DIR each broker writes its events in DIR/NAME,
    a directory of its own, so `audit ship --config` of each ships that broker's files alone."""
    config, audit = tmp_path / "users.yaml", tmp_path / "audit"
    config.write_text(yaml.safe_dump({"anonymous": False, "users": {APP: {"password": APP_PASSWORD, "allow": {
        "send": ["s*"], "receive": ["s*"]}}}, "ha": {"sync": "quorum_mem"}}))
    s = supervised(3, args=("--config", str(config), "--audit-dir", str(audit)))
    lines = s.read_until("public ", 40)
    brokers = [line for line in lines if line.startswith("broker-")]
    assert len(brokers) == 3, lines
    for i, line in enumerate(sorted(brokers)):
        assert line.startswith(f"broker-{i} 127.0.0.1:{s.base + i} "), line
    assert sum(" primary" in line for line in brokers) == 1, brokers
    assert f"public {s.public}" in lines
    assert [line for line in lines if line.startswith("console ")] == \
        [f"console http://127.0.0.1:{s.console + i}/ broker-{i}" for i in range(3)], lines
    with pytest.raises(ConnectionException, match="amqp:unauthorized-access"):
        BlockingConnection(f"amqp://{s.public}", timeout=5, allowed_mechs="ANONYMOUS")
    send_all(s.public, "sq", range(3), user=APP, password=APP_PASSWORD)
    assert [m.body for m in receive(s.public, "sq", 3, user=APP, password=APP_PASSWORD)] == [0, 1, 2]
    primary = next(line.split()[1] for line in brokers if " primary" in line)
    assert s.status(primary)["sync"] == "quorum_mem"  # the file's ha section, beside cluster up's own keys
    pids = [s.broker_pid(f"broker-{i}") for i in range(3)]
    assert all(pids), pids
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=20) == 0, s.stderr()
    wait_for(lambda: not any(_alive(p) for p in pids), 10, message="brokers gone after SIGTERM")
    assert not can_connect(*split_address(s.public))
    assert sorted(p.name for p in audit.iterdir()) == ["broker-0", "broker-1", "broker-2"]
    for i in range(3):  # each broker's files closed as it stopped
        to, broker = tmp_path / f"shared-{i}", ["--config", str(s.directory / f"broker-{i}.yaml")]
        to.mkdir()
        shipped = run_haqueue(["audit", "ship", *broker, "--to", str(to), "--once"])
        assert (shipped.returncode, shipped.stderr) == (0, ""), shipped.stderr
        assert shipped.stdout.startswith("haqueue audit ship: ") and " to " in shipped.stdout
        assert {p.name.split("~")[0] for p in to.iterdir()} == {f"broker-{i}"}, list(to.iterdir())
        again = run_haqueue(["audit", "ship", *broker, "--to", str(to), "--once"])
        assert again.stdout.startswith(f"haqueue audit ship: nothing to ship from {audit / f'broker-{i}'}: "), again


def test_cluster_up_fails_over_on_kill9_without_losing_confirmed(supervised):
    s = supervised(3)
    s.read_until("public ", 40)
    primary = next(line.split()[0] for line in s.seen if " primary" in line)
    load = Load(s.public, "sload").start()
    try:
        wait_for(lambda: load.confirmed_count() >= 200 and load.received_count() >= 50, 20,
                 message="traffic before the failover")
        pid = s.broker_pid(primary)
        os.kill(pid, signal.SIGKILL)
        base = load.confirmed_count()
        wait_for(lambda: load.confirmed_count() >= base + 200, 40,
                 message=f"traffic after the failover ({load.report()})")
        load.stop_producer()
        wanted = set(load.confirmed)
        wait_for(lambda: wanted <= set(load.received), 20, message=f"all confirmed received ({load.report()})")
    finally:
        load.stop()
    report = load.report()
    print("load report:", report)
    assert report["lost"] == [], report
    # a new primary, and the killed broker back as a backup
    addresses = [f"127.0.0.1:{s.base + i}" for i in range(3)]
    roles = wait_for(lambda: (lambda st: st if all(st) and sorted(x["role"] for x in st) ==
                              ["backup", "backup", "primary"] else None)([s.status(a) for a in addresses]),
                     30, message="one primary and two backups again")
    assert [x["name"] for x in roles if x["role"] == "primary"] != [primary]
    # kill -9 of a broker while the supervisor starts it again (before it answers): started once more, and the
    # cluster kept (it used to stop everything, taking a broker killed from outside for one that cannot start)
    backup_pid = s.broker_pid(primary)
    os.kill(backup_pid, signal.SIGKILL)
    restarted = wait_for(lambda: (lambda p: p if p not in (None, pid, backup_pid) and _alive(p) else None)(
        s.broker_pid(primary)), 30, interval=0.01, message=f"{primary} started again")
    os.kill(restarted, signal.SIGKILL)
    wait_for(lambda: f"{primary} was killed by signal 9 while starting; starting it again" in s.stderr(), 30,
             message="the supervisor starting it again")
    wait_for(lambda: (lambda st: all(st) and sorted(x["role"] for x in st) == ["backup", "backup", "primary"])(
        [s.status(a) for a in addresses]), 30, message="one primary and two backups after the killed start")
    assert s.proc.poll() is None, s.stderr()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=20) == 0


@pytest.mark.slow
def test_cluster_up_replaces_hung_primary(supervised):
    s = supervised(3)
    s.read_until("public ", 40)
    primary = next(line.split()[0] for line in s.seen if " primary" in line)
    send_all(s.public, "hq", range(10))
    addresses = [f"127.0.0.1:{s.base + i}" for i in range(3)]
    wait_for(lambda: all((s.status(a) or {}).get("state") in ("ready", "active") for a in addresses), 15,
             message="backups ready")
    pid = s.broker_pid(primary)
    os.kill(pid, signal.SIGSTOP)
    try:
        # the supervisor notices the hang, kills the hung broker, promotes a backup, restarts the old one
        def served():
            try:
                return [m.body for m in receive(s.public, "hq", 10, timeout=3)]
            except Exception:  # noqa: BLE001 - not yet failed over
                return None
        assert wait_for(served, 20, message="the queue served by a new primary") == list(range(10))
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGCONT)
    assert not _alive(pid), "the hung primary was not killed"


def test_cluster_up_with_tls_between_brokers(supervised, tmp_path):
    """cluster up --tls DIR: every broker's peer listener takes TLS only, with DIR's CA, and the supervisor
    and the backups present DIR's certificate."""
    d = tmp_path / "tls"
    ca = CertificateAuthority(d, "ca")
    peer, admin = ca.issue("peer"), ca.issue("admin")
    for name, source in (("ca.pem", ca.ca_file), ("cert.pem", peer.cert_file), ("key.pem", peer.key_file)):
        (d / name).write_bytes(Path(source).read_bytes())
    s = supervised(3, tls=TlsConfig(admin.cert_file, admin.key_file, ca.ca_file), args=("--tls", str(d)))
    s.read_until("public ", 40)
    send_all(s.public, "tq", range(3))
    addresses = [f"127.0.0.1:{s.base + i}" for i in range(3)]
    wait_for(lambda: sorted((s.status(a) or {}).get("state", "") for a in addresses) == ["active", "ready", "ready"],
             20, message="a primary and two ready backups, over TLS")
    assert [m.body for m in receive(s.public, "tq", 3)] == [0, 1, 2]
    with pytest.raises(AdminError):  # no certificate, no entry
        AdminClient(addresses[0], 3.0, HA_USER, s.password()).close()


def test_two_cluster_ups_wire_a_mirror(supervised, monkeypatch):
    """Two local clusters wired in two commands (design/mirroring.md): `cluster up --accept-mirror` makes a standby,
    `cluster up --mirror-to ITS_PUBLIC --mirror-queues GLOB` a source named after its --dir, mirroring into it."""
    monkeypatch.setenv("HAQUEUE_MIRROR_PASSWORD", "mirror-secret")  # both commands' environment
    standby = supervised(1, args=("--accept-mirror",))
    standby.read_until("public ", 40)
    source = supervised(2, args=("--mirror-to", standby.public, "--mirror-queues", "orders.*"))
    source.read_until("public ", 40)
    send_all(source.public, "orders.0", range(20))
    send_all(source.public, "local.q", range(3))

    def mirrored() -> list | None:
        shown = run_haqueue(["admin", "-b", standby.public, "mirror", "status"])
        assert shown.returncode == 0, shown.stderr
        queues = json.loads(shown.stdout)["standby"]["queues"]
        return queues if [q["messages"] for q in queues] == [20] else None
    queues = wait_for(mirrored, 30, message="orders.0 mirrored to the standby, and nothing else")
    assert (queues[0]["queue"], queues[0]["source"]) == ("orders.0", source.directory.name)
    assert [m.body for m in browse(standby.public, "orders.0", 20)] == list(range(20))  # read-only: browsed
